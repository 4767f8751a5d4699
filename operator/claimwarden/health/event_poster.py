"""Events posted beside the work that causes them, never waited for by that work.

An eviction's Event (and a blocked eviction's) goes on the pod. Waiting for it before the next eviction
made a burst of evictions wait on its own Events; so at most EVENT_POSTERS go out at once, in tasks of
their own, and while a wave of evictions is under way they wait (wave.py), each at most HOLD_MAX s. When
the apiserver is far behind, Events are the first thing dropped (EVENTS_PENDING_MAX). At shutdown
``drain`` waits a little for those still going out.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from ..cache import Body
from .wave import HOLD_MAX, HOLD_RECHECK

log = logging.getLogger("claimwarden.health")

EVENT_POSTERS = 4
EVENTS_PENDING_MAX = 10_000  # Events posted at once: enough to keep up, few enough that evictions go first

PostEvent = Callable[[Body, str, str, str], Awaitable[None]]


class EventPoster:
    """Posts Events beside the work that causes them: at most EVENT_POSTERS at once, and never waited for
    by the caller, so a burst of evictions is not slowed by its own Events. `drain` (at shutdown) waits a
    little for those still going out."""

    def __init__(self, post: PostEvent, limit: int = EVENT_POSTERS, *,
                 hold: Callable[[], bool] = lambda: False) -> None:
        """`hold()`: Events wait while it says so (a wave of evictions, wave.py), each at most HOLD_MAX s."""
        self._post = post
        self._hold = hold
        self._slots = asyncio.Semaphore(limit)
        self._tasks: set[asyncio.Task[None]] = set()

    def post(self, involved: Body, event_type: str, reason: str, message: str) -> None:
        if len(self._tasks) >= EVENTS_PENDING_MAX:  # the apiserver is far behind: Events are the first to go
            log.warning("dropped event %s on %s: %d events still going out", reason,
                        involved["metadata"].get("name"), len(self._tasks))
            return
        task = asyncio.get_running_loop().create_task(self._send(involved, event_type, reason, message))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _send(self, involved: Body, event_type: str, reason: str, message: str) -> None:
        deadline = time.monotonic() + HOLD_MAX
        while self._hold() and time.monotonic() < deadline:
            await asyncio.sleep(HOLD_RECHECK)
        async with self._slots:
            try:
                await self._post(involved, event_type, reason, message)
            except Exception as exc:  # an Event is worth a log line, never a lost eviction
                log.warning("could not post event %s on %s: %s", reason, involved["metadata"].get("name"), exc)

    async def drain(self, timeout: float = 5.0) -> None:
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=timeout)
