"""Scrapes read the indices on the event loop, never beside it in prometheus_client's thread."""

from __future__ import annotations

import asyncio
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from claimwarden import metrics
from claimwarden.metrics import ClaimCollector, ClaimSample, DeviceCollector, DeviceSample, guarded
from claimwarden.runtime import server
from claimwarden_lab.processes import free_port


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


def _served_on(loop: asyncio.AbstractEventLoop, collector: Any) -> tuple[Callable[[], str], Callable[[], None]]:
    """``collector`` served at /metrics by runtime/server.py on ``loop``: (scrape over HTTP, stop)."""
    registry = CollectorRegistry()
    registry.register(collector)
    url = f"http://127.0.0.1:{free_port()}/metrics"
    runner = asyncio.run_coroutine_threadsafe(server.serve({url: server.metrics_handler(registry)}), loop).result(5)

    def scrape() -> str:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.read().decode()

    return scrape, lambda: asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(5)


def test_scrapes_under_churn_succeed_when_collected_on_the_loop(loop: asyncio.AbstractEventLoop) -> None:
    churn = Churn(loop)
    errors_before = metrics.SCRAPE_ERRORS._value.get()
    scrape, stop = _served_on(loop, ClaimCollector(guarded(churn.samples)))
    try:
        for _ in range(20):
            text = scrape()
            assert 'claimwarden_resource_claims{source="user",state="pending"} 20' in text  # 200 or 201
    finally:
        stop()
        churn.stop()
    assert metrics.SCRAPE_ERRORS._value.get() == errors_before


def test_a_failing_callback_is_a_scrape_error_not_a_failed_scrape() -> None:
    def broken() -> list[ClaimSample]:
        raise KeyError("gone")

    errors_before = metrics.SCRAPE_ERRORS._value.get()
    assert "claimwarden_resource_claims" not in _scrape(ClaimCollector(guarded(broken)))
    assert metrics.SCRAPE_ERRORS._value.get() == errors_before + 1


def test_a_failing_gauge_leaves_the_others_served() -> None:
    def broken() -> list[DeviceSample]:
        raise RuntimeError("an index is not there yet")

    text = _scrape(DeviceCollector(guarded(broken), lambda: ["NoExecute"], lambda: 2))
    assert "claimwarden_devices{" not in text
    assert 'claimwarden_unhealthy_devices{effect="NoExecute"} 1.0' in text, "the other gauges are still served"
    assert "claimwarden_eviction_pending_pods 2.0" in text


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
