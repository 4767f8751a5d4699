"""Each record's count of evicted pods and its window of recent evictions, as this process knows them.

An eviction changes the record's status.podsEvicted and status.recentEvictions (the breaker's window,
breaker.py). They are kept here, in memory, and reach the record in one of two ways:

- with the breaker off, by the record's reconcile, paced (counts.py: at most once per interval), and at
  shutdown by ``flush``;
- with the breaker on, ahead of each eviction's call, in a write of their own that evictions of one
  record share (``write_ahead``; window.py, ahead.py): the window must survive a crash mid-burst.

A record's counts start from its status. A new leader's cache may not hold the previous leader's last
writes yet, so with the breaker on they start from one live LIST of the records instead (``seed``),
taken before this process first decides on them. Whatever a write's answer or that LIST holds joins the
counts in memory (``take_in``), and the entries new to this process go to the breaker's totals
(``on_recent``, breaker_view.py).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from ..cache import Body
from ..kube.api import Kube
from ..kube.errors import ApiError
from ..runtime.workqueue import Requeue
from ..timestamps import now
from . import breaker, records, window
from .ahead import AheadWrites
from .counts import CountWrites

log = logging.getLogger("claimwarden.health")

FLUSH_SECONDS, FLUSH_WRITERS = 10.0, 8  # at shutdown: the counts still in memory, written 8 at once within 10 s
SEED_RETRY = 5.0  # seconds: keys that waited for a live LIST of the records that failed come back without one


class EvictionCounts:
    """record -> podsEvicted and its recent evictions, their paced writes, and the writes ahead."""

    def __init__(self, *, kube: Kube, window: timedelta, write_ahead: bool,
                 on_recent: Callable[[str, breaker.Recent], None]) -> None:
        """`write_ahead`: the breaker is on, each eviction's entry is written before its call;
        `on_recent(record, eviction)`: an eviction new to this process joined the record's window."""
        self.kube = kube
        self.window = window
        self._on_recent = on_recent
        self.ahead = AheadWrites(kube=kube, window=window) if write_ahead else None
        self.writes = CountWrites()
        self.evicted_by_record: dict[str, int] = {}
        self._recent: dict[str, list[breaker.Recent]] = {}
        # name -> podsEvicted and recentEvictions from one live LIST of the records, taken when this process
        # first needs them (``seed``): its cache may not hold the previous leader's last writes yet.
        self._live: dict[str, dict[str, Any]] | None = None
        self._seeding = asyncio.Lock()
        self._seed_failed = -SEED_RETRY  # monotonic time of the last LIST that failed

    def add(self, record: Body, entry: breaker.Recent) -> None:
        """The record evicted a pod, counted here (with the breaker off: nothing was written ahead)."""
        name = record["metadata"]["name"]
        self.recent(record).append(entry)
        self.evicted_by_record[name] = self.evicted(record) + 1
        self._on_recent(name, entry)

    def forget(self, record_name: str) -> None:
        self.evicted_by_record.pop(record_name, None)
        self._recent.pop(record_name, None)
        self.writes.forget(record_name)
        if self._live is not None:
            self._live.pop(record_name, None)
        if self.ahead is not None:
            self.ahead.forget(record_name)

    def evicted(self, record: Body) -> int:
        """Pods evicted for the record; after a restart the count starts from its status (``seed``)."""
        name = record["metadata"]["name"]
        if name not in self.evicted_by_record:
            self._start(record)
        return self.evicted_by_record[name]

    def recent(self, record: Body) -> list[breaker.Recent]:
        """The record's evictions (any age); after a restart they start from its status.recentEvictions
        (``seed``)."""
        name = record["metadata"]["name"]
        if name not in self._recent:
            self._start(record)
        return self._recent[name]

    def _start(self, record: Body) -> None:
        """The record's counts in this process start from the live LIST and the cached record together."""
        name = record["metadata"]["name"]
        live = self._live.pop(name, None) if self._live is not None else None  # used once: kept in memory now
        evicted, recent = window.start(live, record.get("status") or {})
        self.evicted_by_record[name] = max(self.evicted_by_record.get(name, 0), evicted)
        self._recent.setdefault(name, recent)

    async def seed(self) -> None:
        """Before this process first decides on a record's counts (a new leader, the breaker on): one live LIST of
        the records. A failed LIST raises, so that the caller's key is retried; nothing is decided on the cache
        alone. The keys that waited for a LIST that failed do not each send another: for SEED_RETRY seconds they
        are put back without one (a slow apiserver at a failover would otherwise get a LIST of every record per
        waiting worker). With the breaker off nothing reads the window, and the counts start from the cache."""
        if self._live is not None or self.ahead is None:
            return
        async with self._seeding:
            if self._live is None:
                since = time.monotonic() - self._seed_failed
                if since < SEED_RETRY:
                    raise Requeue(SEED_RETRY - since, "seed")
                try:
                    listed = await self.kube.list_cluster_objects(records.API_VERSION, records.PLURAL)
                except Exception:
                    self._seed_failed = time.monotonic()
                    raise
                self._live = window.seed(listed)
                # A record whose counts this process started from the cache before the LIST (a breaker decision
                # came first) takes in what the LIST holds too.
                for name in [name for name in self._live if name in self._recent or name in self.evicted_by_record]:
                    self.take_in(name, *window.start(self._live.pop(name), {}))
                if self.ahead is not None:
                    for record in listed:
                        self.ahead.note(record)
                log.info("eviction counts of %d records read live", len(self._live))

    async def write_ahead(self, record: Body, entry: breaker.Recent) -> None:
        """Store the eviction's entry in the record before the call (window.py); the window and count in memory
        become what the record holds then."""
        assert self.ahead is not None
        name = record["metadata"]["name"]
        self.recent(record)  # started from the LIST and the cache before it is replaced
        written = await self.ahead.add(record, entry)
        self.take_in(name, window.pods_evicted(written), breaker.parse_recent(written))

    def take_in(self, name: str, evicted: int, recent: list[breaker.Recent]) -> None:
        """What the record holds (a write's answer, a live LIST) joins the counts in memory: podsEvicted the
        higher; the window its own entries still in it and `recent` together, the entries new to it going to
        the breaker's totals (``on_recent``)."""
        self.evicted_by_record[name] = max(self.evicted_by_record.get(name, 0), evicted)
        before = self._recent.get(name, [])
        kept = breaker.in_window(before, now(), self.window)  # older: dropped
        self._recent[name] = window.union(kept, recent)
        for entry in set(recent) - set(before):
            self._on_recent(name, entry)

    def status(self, record: Body) -> dict[str, Any]:
        """The record's counts as its status should carry them: podsEvicted and recentEvictions (with the breaker
        on, both are written ahead by ``write_ahead`` alone, never by the record's status write)."""
        return {"podsEvicted": self.evicted(record),
                "recentEvictions": breaker.format_recent(self.recent(record), now(), self.window)}

    def written(self, record_name: str, version: int) -> None:
        """A status write with the record's counts as of `version` (counts.version) succeeded."""
        self.writes.written(record_name, time.monotonic(), version)

    async def flush(self, timeout: float = FLUSH_SECONDS) -> None:
        """Write every count still only in memory (at shutdown, after the workers have stopped), FLUSH_WRITERS at
        once and for at most `timeout` seconds in all: a pod has 30 s to stop, and 5,000 records written one by one
        took longer than that."""
        # With the breaker on the counts are in the records already (written ahead).
        pending = [name for name in self.writes.unsaved()
                   if name in self.evicted_by_record] if self.ahead is None else []
        writers = asyncio.Semaphore(FLUSH_WRITERS)
        written = 0
        refused: list[ApiError] = []  # reported in one line: a lost fence refuses them all

        async def write(name: str) -> None:
            nonlocal written
            version = self.writes.version(name)
            status = {"podsEvicted": self.evicted_by_record[name], "recentEvictions": breaker.format_recent(
                self._recent.get(name, []), now(), self.window)}
            async with writers:
                try:
                    await self.kube.merge_patch_cluster_object(records.API_VERSION, records.PLURAL, name,
                                                               {"status": status}, subresource="status")
                except ApiError as exc:
                    if not exc.not_found:
                        refused.append(exc)
                    return
            self.written(name, version)
            written += 1

        if pending:
            tasks = [asyncio.ensure_future(write(name)) for name in pending]
            _, late = await asyncio.wait(tasks, timeout=timeout)
            for task in late:
                task.cancel()
            if late:
                log.warning("shutting down: %d of %d records' eviction counts not written within %.0f s (the next "
                            "leader counts from the records' status)", len(pending) - written, len(pending), timeout)
        if refused:
            log.warning("shutting down: %d records' eviction counts could not be stored (first: %s)",
                        len(refused), refused[0])
