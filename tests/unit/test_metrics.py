"""Scrapes read the indices on the event loop, never beside it in prometheus_client's thread."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from claimwarden import metrics
from claimwarden.metrics import ClaimCollector, ClaimSample, DeviceCollector, DeviceSample, ScrapeFailed, on_loop


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    """A real event loop running in its own thread, as Kopf's loop runs beside the scrape thread."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    yield loop
    loop.call_soon_threadsafe(loop.stop)
    thread.join(5)
    loop.close()


class Churn:
    """An index that the loop keeps changing, as Kopf does under a stream of events."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.index: dict[int, str] = {i: "pending" for i in range(200)}
        self._stop = False
        self._task = asyncio.run_coroutine_threadsafe(self._churn(), loop)

    async def _churn(self) -> None:
        n = len(self.index)
        while not self._stop:
            self.index[n] = "pending"  # an object added ...
            await asyncio.sleep(0)
            del self.index[n - 200]  # ... and one deleted, each in its own event
            n += 1
            await asyncio.sleep(0)

    def stop(self) -> None:
        self._stop = True
        self._task.result(5)

    def samples(self) -> list[ClaimSample]:
        out = []
        for state in self.index.values():  # slow enough that the loop would change the dict meanwhile
            time.sleep(0.0001)
            out.append(ClaimSample(state, "user", False))
        return out


def _scrape(collector: Any) -> str:
    registry = CollectorRegistry()
    registry.register(collector)
    return generate_latest(registry).decode()


def test_the_race_is_real_without_on_loop(loop: asyncio.AbstractEventLoop) -> None:
    churn = Churn(loop)
    try:
        with pytest.raises(RuntimeError, match="changed size during iteration"):
            for _ in range(20):
                _scrape(ClaimCollector(churn.samples))
    finally:
        churn.stop()


def test_scrapes_under_churn_succeed_when_collected_on_the_loop(loop: asyncio.AbstractEventLoop) -> None:
    churn = Churn(loop)
    errors_before = metrics.SCRAPE_ERRORS._value.get()
    try:
        for _ in range(20):
            text = _scrape(ClaimCollector(on_loop(loop, churn.samples)))
            assert 'claimwarden_resource_claims{source="user",state="pending"} 20' in text  # 200 or 201
    finally:
        churn.stop()
    assert metrics.SCRAPE_ERRORS._value.get() == errors_before


def _block(loop: asyncio.AbstractEventLoop, seconds: float) -> threading.Event:
    """Keep the loop busy (a long synchronous step) for ``seconds``; the event is set once it started."""
    started = threading.Event()

    def busy() -> None:
        started.set()
        time.sleep(seconds)

    loop.call_soon_threadsafe(busy)
    assert started.wait(5)
    return started


def test_a_stuck_loop_leaves_the_gauge_out_and_counts_a_scrape_error(loop: asyncio.AbstractEventLoop) -> None:
    errors_before = metrics.SCRAPE_ERRORS._value.get()
    _block(loop, 0.5)
    began = time.monotonic()
    devices: Callable[[], list[DeviceSample]] = on_loop(loop, lambda: [DeviceSample("gpu.example.com", "free")],
                                                        timeout=0.1)
    collector = DeviceCollector(devices, lambda: ["NoExecute"], lambda: 2)
    text = _scrape(collector)
    assert time.monotonic() - began < 0.4, "the scrape did not wait for the loop"
    assert "claimwarden_devices{" not in text
    assert 'claimwarden_unhealthy_devices{effect="NoExecute"} 1.0' in text, "the other gauges are still served"
    assert "claimwarden_eviction_pending_pods 2.0" in text
    assert metrics.SCRAPE_ERRORS._value.get() == errors_before + 1
    time.sleep(0.5)  # the abandoned call is skipped once the loop is free again
    assert 'claimwarden_devices{driver="gpu.example.com",state="free"} 1.0' in _scrape(collector)


def test_a_failing_callback_is_a_scrape_error_not_a_failed_scrape(loop: asyncio.AbstractEventLoop) -> None:
    def broken() -> list[ClaimSample]:
        raise KeyError("gone")

    errors_before = metrics.SCRAPE_ERRORS._value.get()
    assert "claimwarden_resource_claims" not in _scrape(ClaimCollector(on_loop(loop, broken)))
    assert metrics.SCRAPE_ERRORS._value.get() == errors_before + 1


def test_a_closed_loop_is_a_scrape_error() -> None:
    closed = asyncio.new_event_loop()
    closed.close()
    with pytest.raises(ScrapeFailed):
        on_loop(closed, lambda: 1)()


def test_called_on_the_loop_itself_it_runs_directly() -> None:
    async def scenario() -> int:
        return on_loop(asyncio.get_running_loop(), lambda: 7)()

    assert asyncio.run(scenario()) == 7


def test_a_cached_gauge_is_computed_at_most_once_per_period(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [100.0]
    monkeypatch.setattr(metrics.time, "monotonic", lambda: clock[0])
    computed: list[float] = []

    def walk_every_claim() -> float:
        computed.append(clock[0])
        if clock[0] == 200.0:
            raise metrics.ScrapeFailed("the loop did not answer")
        return clock[0]

    gauge = metrics.cached(walk_every_claim, 5.0)
    assert gauge() == 100.0
    clock[0] = 104.9
    assert gauge() == 100.0 and computed == [100.0]
    clock[0] = 105.0
    assert gauge() == 105.0
    clock[0] = 200.0
    with pytest.raises(metrics.ScrapeFailed):
        gauge()
    clock[0] = 200.1
    assert gauge() == 200.1  # a failure is not reused, nor is the value from before it
    assert computed == [100.0, 105.0, 200.0, 200.1]
    uncached = metrics.cached(walk_every_claim, 0.0)
    clock[0] = 300.0
    uncached(), uncached()
    assert computed[-2:] == [300.0, 300.0]
