"""A read that concurrent callers share without ever getting an answer older than their question.

Each call joins the next read to *start*, never one already under way, and one read runs at a
time: while it runs, the callers arriving meanwhile gather behind it and share the read that
follows. A burst of N callers costs a few reads instead of N, and every caller's answer was read
after it asked, so it is as fresh as a read of its own. A failed read fails every caller that
shared it (each decides what to do then, for example read alone).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class NextRead(Generic[T]):
    def __init__(self, read: Callable[[], Awaitable[T]]) -> None:
        self._read = read
        self._next: asyncio.Future[T] | None = None  # the read callers are gathering behind
        self._running = asyncio.Lock()
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def busy(self) -> bool:
        """True while a read runs or callers wait for one."""
        return self._next is not None or self._running.locked()

    async def get(self) -> T:
        batch = self._next
        if batch is None:
            batch = self._next = asyncio.get_running_loop().create_future()
            task = asyncio.ensure_future(self._run(batch))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        return await asyncio.shield(batch)

    async def _run(self, batch: asyncio.Future[T]) -> None:
        async with self._running:
            if self._next is batch:
                self._next = None  # callers from now on wait for the next read
            try:
                batch.set_result(await self._read())
            except asyncio.CancelledError:
                batch.cancel()
                raise
            except Exception as exc:
                batch.set_exception(exc)
                batch.exception()  # retrieved: a batch whose callers all went away logs nothing
