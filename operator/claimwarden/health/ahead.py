"""Writing the breaker's window ahead of the evictions: one small status patch per record at a time.

What is written and why before the Eviction call: window.py. Here the writes themselves:

- **Guarded by resourceVersion.** The patch carries the resourceVersion of the status it was
  built on (``metadata.resourceVersion`` in a merge patch: the apiserver refuses it with 409 when the
  record changed since). On a 409 the record is read live, the entries are merged into what it holds
  and the write is sent again. So a write never drops what another writer (a previous leader, the
  record's own status write) stored.
- **Group commit.** Evictions of one record that wait for its write at the same time share the next
  one: while a write is under way, the entries that come meanwhile gather and go out together in
  the next. A device with 8 pods costs one or two writes, not 8.
- The status as last written (or read) is kept per record, with its resourceVersion, so the next
  write is usually guarded right and needs no read.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from ..cache import Body, resource_version
from ..kube.api import Kube
from ..kube.errors import ApiError
from ..timestamps import now
from . import records, window
from .breaker import Recent

log = logging.getLogger("claimwarden.health")

CONFLICT_RETRIES = 5  # writes of one batch refused with 409 before the batch's evictions are retried later


class RecordGone(Exception):
    """The record was deleted: its evictions must not go out."""


@dataclass
class _Held:
    """A record's status as this process last wrote or read it, with the resourceVersion it had."""

    version: int
    status: dict[str, Any]


@dataclass
class _Batch:
    entries: set[Recent] = field(default_factory=set)
    done: asyncio.Future[dict[str, Any]] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future())


class AheadWrites:
    """The write-ahead of each record's window, group-committed per record."""

    def __init__(self, *, kube: Kube, window: timedelta) -> None:
        self.kube = kube
        self.window = window
        self._held: dict[str, _Held] = {}
        self._next: dict[str, _Batch] = {}  # record -> the entries waiting for its next write
        self._writing: dict[str, asyncio.Task[None]] = {}
        self.writes = 0  # patches sent (tests and the log)

    def note(self, record: Body) -> None:
        """A version of the record (a fresh read): the base of its next write if newer than the one held."""
        name = record["metadata"]["name"]
        version = resource_version(record)
        held = self._held.get(name)
        if held is None or version > held.version:
            status = record.get("status") or {}  # only what the writes merge with: not a second copy of the cache
            self._held[name] = _Held(version, {k: status[k] for k in ("podsEvicted", "recentEvictions") if k in status})

    async def add(self, record: Body, entry: Recent) -> dict[str, Any]:
        """Store the entry in the record's status; return the podsEvicted and recentEvictions written.
        RecordGone when the record was deleted; ApiError when the write failed (the eviction must wait)."""
        name = record["metadata"]["name"]
        self.note(record)
        batch = self._next.get(name)
        if batch is None:
            batch = self._next[name] = _Batch()
        batch.entries.add(entry)
        if name not in self._writing:
            task = asyncio.get_running_loop().create_task(self._commit(name), name=f"window-{name}")
            self._writing[name] = task
        # Shielded: a caller cancelled (the drain) must not cancel a write that others wait for.
        return await asyncio.shield(batch.done)

    def forget(self, name: str) -> None:
        self._held.pop(name, None)

    async def _commit(self, name: str) -> None:
        """Write the record's batches one after another until none is waiting."""
        try:
            while (batch := self._next.pop(name, None)) is not None:
                try:
                    written = await self._write(name, batch.entries)
                except BaseException as exc:
                    if not batch.done.done():
                        batch.done.set_exception(exc)
                    batch.done.exception()  # retrieved here: a caller may have stopped waiting
                    if isinstance(exc, asyncio.CancelledError):
                        raise
                    continue
                if not batch.done.done():
                    batch.done.set_result(written)
        finally:
            self._writing.pop(name, None)
            left = self._next.pop(name, None)
            if left is not None:  # cancelled with entries waiting: their evictions do not go out
                left.done.cancel()

    async def _write(self, name: str, entries: set[Recent]) -> dict[str, Any]:
        for _ in range(CONFLICT_RETRIES):
            held = self._held.get(name)
            if held is None:
                held = await self._read(name)
            status = window.ahead_status(held.status, entries, now(), self.window)
            patch = {"metadata": {"resourceVersion": str(held.version)}, "status": status}
            self.writes += 1
            try:
                result = await self.kube.merge_patch_cluster_object(records.API_VERSION, records.PLURAL, name, patch,
                                                                    subresource="status")
            except ApiError as exc:
                if exc.not_found:
                    raise RecordGone(name) from None
                if not exc.conflict:
                    raise
                newer = self._held.get(name)
                if newer is None or newer.version <= held.version:  # else a version noted meanwhile (note)
                    await self._read(name)  # changed since: merge into what it holds now
                continue
            written = dict(result.get("status") or {})
            self.note(result)  # unless a newer version was noted meanwhile (the record's own status write)
            return {"podsEvicted": window.pods_evicted(written),
                    "recentEvictions": written.get("recentEvictions") or []}
        raise ApiError(409, "Conflict", f"the window of record {name} changed {CONFLICT_RETRIES} times while "
                       "it was written")

    async def _read(self, name: str) -> _Held:
        body = await self.kube.get_cluster_object(records.API_VERSION, records.PLURAL, name)
        if body is None:
            self._held.pop(name, None)
            raise RecordGone(name)
        held = self._held[name] = _Held(resource_version(body), dict(body.get("status") or {}))
        return held

