"""The work queue's guarantees: one entry per key, never two workers on a key, back-off on failure."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Hashable

import pytest

from claimwarden.runtime.workqueue import Requeue, Retry, WorkQueue, run_workers


def test_a_key_added_twice_is_queued_once() -> None:
    async def scenario() -> None:
        queue = WorkQueue("test-dedupe")
        queue.add("a")
        queue.add("a")
        queue.add("b")
        assert len(queue) == 2
        assert await queue.get() == "a"
        assert await queue.get() == "b"

    asyncio.run(scenario())


def test_a_key_added_while_processing_is_processed_again_afterwards() -> None:
    async def scenario() -> None:
        queue = WorkQueue("test-reprocess")
        queue.add("a")
        key = await queue.get()
        queue.add("a")  # an event arrives while a worker holds the key
        assert len(queue) == 0, "not handed to a second worker meanwhile"
        queue.done(key)
        assert len(queue) == 1
        assert await queue.get() == "a"

    asyncio.run(scenario())


def test_retry_delays_double_per_failure_and_forget_resets_them() -> None:
    async def scenario() -> None:
        queue = WorkQueue("test-backoff", base_delay=0.1, max_delay=0.5)
        assert [queue.retry("a") for _ in range(4)] == [0.1, 0.2, 0.4, 0.5]
        queue.forget("a")
        assert queue.retry("a") == 0.1
        queue.shutdown()

    asyncio.run(scenario())


def test_add_after_keeps_the_earliest_due_time() -> None:
    async def scenario() -> None:
        queue = WorkQueue("test-after")
        queue.add_after("a", 10)
        queue.add_after("a", 0.05)
        await asyncio.wait_for(queue.get(), 1)
        queue.shutdown()

    asyncio.run(scenario())


@pytest.mark.parametrize("outcome", ["success", "error", "requeue"])
def test_workers_reconcile_and_retry_failures(outcome: str) -> None:
    seen: list[Hashable] = []

    async def scenario() -> None:
        queue = WorkQueue(f"test-workers-{outcome}", base_delay=0.01)

        async def reconcile(key: Hashable) -> None:
            seen.append(key)
            if len(seen) == 1 and outcome == "error":
                raise RuntimeError("first attempt fails")
            if len(seen) == 1 and outcome == "requeue":
                raise Requeue(0.01)

        workers = asyncio.create_task(run_workers(queue, reconcile, 2))
        queue.add("a")
        await asyncio.sleep(0.3)
        workers.cancel()
        with pytest.raises(asyncio.CancelledError):
            await workers

    asyncio.run(scenario())
    assert seen == (["a"] if outcome == "success" else ["a", "a"])


def test_closing_lets_a_busy_worker_finish_its_key_and_stops_idle_ones() -> None:
    finished: list[Hashable] = []

    async def scenario() -> None:
        queue = WorkQueue("test-close")
        started = asyncio.Event()

        async def reconcile(key: Hashable) -> None:
            started.set()
            await asyncio.sleep(0.2)  # e.g. an eviction followed by its bookkeeping
            finished.append(key)

        workers = asyncio.create_task(run_workers(queue, reconcile, 3))
        queue.add("busy")
        await started.wait()
        queue.add("waiting")  # queued behind the close: never started
        queue.close(3)
        await asyncio.wait_for(workers, 2)

    asyncio.run(scenario())
    assert finished == ["busy"]


@pytest.mark.parametrize(("error", "traceback"), [(Retry("template not there yet"), False),
                                                  (RuntimeError("a bug"), True)])
def test_a_known_condition_is_logged_without_a_traceback_and_a_bug_with_one(
        error: Exception, traceback: bool, caplog: pytest.LogCaptureFixture) -> None:
    async def scenario() -> None:
        queue = WorkQueue("test-logging", base_delay=10)

        async def reconcile(key: Hashable) -> None:
            queue.close(1)
            raise error

        queue.add("a")
        await run_workers(queue, reconcile, 1)

    with caplog.at_level("WARNING", logger="claimwarden.workqueue"):
        asyncio.run(scenario())
    (record,) = [r for r in caplog.records if "reconciling" in r.getMessage()]
    assert bool(record.exc_info) is traceback


def test_a_cancelled_reconcile_requeues_a_key_added_meanwhile_exactly_once() -> None:
    """Cancelling a worker mid-reconcile must not queue the key twice (two workers on one key)."""

    async def scenario() -> None:
        queue = WorkQueue("test-cancel")
        started = asyncio.Event()

        async def reconcile(key: Hashable) -> None:
            started.set()
            await asyncio.sleep(10)

        queue.add("a")
        worker = asyncio.create_task(run_workers(queue, reconcile, 1))
        await started.wait()
        queue.add("a")  # an event arrives while the worker holds the key
        worker.cancel()
        with pytest.raises(asyncio.CancelledError):
            await worker
        assert len(queue) == 1
        assert await queue.get() == "a"
        assert len(queue) == 0, "the key was queued a second time"

    asyncio.run(scenario())


def test_a_write_the_fence_refused_is_tried_again_after_a_retry_period_without_back_off(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A leader whose renewal came late refuses writes for a moment: no failure counted, no back-off."""
    from claimwarden.kube.errors import NotLeader
    from claimwarden.runtime import workqueue

    monkeypatch.setattr(workqueue, "FENCED_RETRY", 0.05)
    seen: list[float] = []
    failures: list[int] = []

    async def scenario() -> None:
        queue = WorkQueue("test-fenced", base_delay=5.0)

        async def reconcile(key: Hashable) -> None:
            seen.append(time.monotonic())
            failures.append(queue.failures(key))
            if len(seen) < 3:
                raise NotLeader("PATCH", "/claims/c")

        workers = asyncio.create_task(run_workers(queue, reconcile, 1))
        queue.add("a")
        await asyncio.sleep(0.5)
        workers.cancel()
        with pytest.raises(asyncio.CancelledError):
            await workers

    asyncio.run(scenario())
    assert len(seen) == 3, "tried again twice, well within the 5 s back-off an error would have cost"
    assert failures == [0, 0, 0]
