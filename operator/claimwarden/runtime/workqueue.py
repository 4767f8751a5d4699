"""A level-based work queue: events add keys, workers reconcile them, failures retry with back-off.

Semantics follow client-go's workqueue: a key is queued at most once; a key added while it is
being processed is processed again afterwards (never by two workers at once); failures back off
exponentially per key.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass

from .. import metrics
from ..kube.errors import ApiError, NotLeader

log = logging.getLogger("claimwarden.workqueue")
FENCED_RETRY = 2.0  # seconds before a key whose write the leader's fence refused is tried again (a retry period)


@dataclass(frozen=True)
class Requeue(Exception):
    """Raised by a reconcile to look at the key again after ``delay`` seconds (not an error)."""

    delay: float
    why: str = ""


class Retry(Exception):
    """A known condition that may clear by itself (a template not created yet, a refused create):
    retried with back-off like any failure, but logged in one line, without a traceback."""


class WorkQueue:
    def __init__(self, name: str, base_delay: float = 0.05, max_delay: float = 300.0) -> None:
        self.name = name
        self.base_delay = base_delay
        self.max_delay = max_delay
        self._queue: asyncio.Queue[Hashable] = asyncio.Queue()
        self._dirty: set[Hashable] = set()
        self._processing: set[Hashable] = set()
        self._failures: dict[Hashable, int] = {}
        self._timers: dict[Hashable, asyncio.TimerHandle] = {}
        self._closed = False
        self._depth = metrics.WORKQUEUE_DEPTH.labels(name)
        self._adds = metrics.WORKQUEUE_ADDS.labels(name)
        self._in_flight = metrics.WORKQUEUE_IN_FLIGHT.labels(name)

    def add(self, key: Hashable) -> None:
        if key in self._dirty:
            return
        self._adds.inc()
        self._dirty.add(key)
        if key not in self._processing:
            self._queue.put_nowait(key)
            self._depth.set(self._queue.qsize())

    def add_after(self, key: Hashable, delay: float) -> None:
        if self._closed:
            return
        if delay <= 0:
            self.add(key)
            return
        loop = asyncio.get_running_loop()
        existing = self._timers.get(key)
        due = loop.time() + delay
        if existing is not None and existing.when() <= due:
            return
        if existing is not None:
            existing.cancel()
        self._timers[key] = loop.call_at(due, self._fire, key)

    def _fire(self, key: Hashable) -> None:
        self._timers.pop(key, None)
        self.add(key)

    def retry(self, key: Hashable) -> float:
        """Re-add after the key's next back-off delay; returns that delay."""
        failures = self._failures.get(key, 0)
        self._failures[key] = failures + 1
        delay = min(self.base_delay * (2 ** failures), self.max_delay)
        metrics.WORKQUEUE_RETRIES.labels(self.name).inc()
        self.add_after(key, delay)
        return delay

    def forget(self, key: Hashable) -> None:
        self._failures.pop(key, None)

    def failures(self, key: Hashable) -> int:
        return self._failures.get(key, 0)

    @property
    def closed(self) -> bool:
        return self._closed

    async def get(self) -> Hashable | None:
        """The next key, or None once the queue is closed (the worker should then return)."""
        if self._closed:
            return None
        key = await self._queue.get()
        if self._closed or key is _WAKE:
            return None
        self._processing.add(key)
        self._dirty.discard(key)
        self._depth.set(self._queue.qsize())
        self._in_flight.set(len(self._processing))
        return key

    def done(self, key: Hashable) -> None:
        if key not in self._processing:  # a second done() must not queue the key again
            return
        self._processing.discard(key)
        self._in_flight.set(len(self._processing))
        if key in self._dirty:
            self._queue.put_nowait(key)
            self._depth.set(self._queue.qsize())

    def __len__(self) -> int:
        return self._queue.qsize()

    @property
    def busy(self) -> bool:
        """True while a key is queued for now or being reconciled (keys waiting for a later time are not)."""
        return bool(self._dirty or self._processing)

    def shutdown(self) -> None:
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()

    def close(self, workers: int) -> None:
        """Hand out no more keys: idle workers return at once, busy ones after their current key."""
        self.shutdown()
        self._closed = True
        for _ in range(workers):
            self._queue.put_nowait(_WAKE)


_WAKE: Hashable = object()


Reconcile = Callable[[Hashable], Awaitable[None]]


async def run_workers(queue: WorkQueue, reconcile: Reconcile, workers: int) -> None:
    """Run ``workers`` tasks that take keys from ``queue`` until it is closed or they are cancelled."""
    async with asyncio.TaskGroup() as group:
        for i in range(workers):
            group.create_task(_worker(queue, reconcile), name=f"{queue.name}-worker-{i}")


async def _worker(queue: WorkQueue, reconcile: Reconcile) -> None:
    duration = metrics.RECONCILE_DURATION.labels(queue.name)
    while (key := await queue.get()) is not None:
        started = time.monotonic()
        try:
            await reconcile(key)
        except Requeue as again:
            metrics.RECONCILE_TOTAL.labels(queue.name, "requeue").inc()
            queue.forget(key)
            queue.add_after(key, again.delay)
        except NotLeader as exc:
            # The fence was shut (a renewal late, or the lease lost): not the key's failure, so no back-off
            # that would outlast the next renewal; a replica that lost the lease exits anyway.
            metrics.RECONCILE_TOTAL.labels(queue.name, "requeue").inc()
            log.debug("%s: %s waits for the fence: %s", queue.name, key, exc)
            queue.add_after(key, FENCED_RETRY)
        except Exception as exc:
            metrics.RECONCILE_TOTAL.labels(queue.name, "error").inc()
            delay = queue.retry(key)
            log.warning("%s: reconciling %s failed (retry in %.1fs): %s", queue.name, key, delay, exc,
                        exc_info=queue.failures(key) == 1 and not _expected(exc))
        else:
            metrics.RECONCILE_TOTAL.labels(queue.name, "success").inc()
            queue.forget(key)
        finally:  # also on cancellation: exactly one done() per get(), or the key is queued twice
            duration.observe(time.monotonic() - started)
            queue.done(key)


def _expected(exc: Exception) -> bool:
    return isinstance(exc, ApiError | Retry)
