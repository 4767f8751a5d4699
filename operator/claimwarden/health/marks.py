"""Slice annotations -> UnhealthyDevice records (the decisions are in slice_marks.plan_slice).

A bad annotation changes nothing and is reported once, as a Warning Event on the slice.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Hashable, Iterable
from typing import cast

from ..cache import Body, Cache, resource_version
from ..kube.api import Kube
from ..kube.errors import ApiError
from ..runtime.workqueue import WorkQueue
from . import records, slice_marks

CHANGED_RETRY = 0.5  # seconds before a slice whose record changed under its plan is planned again
log = logging.getLogger("claimwarden.health")

MARK_ERROR = "InvalidUnhealthyMark"
CREATE_AT_ONCE = 16


class Marks:
    """The slice queue and which bad annotations were already reported."""

    def __init__(self, *, cache: Cache, kube: Kube,
                 post_event: Callable[[Body, str, str, str], Awaitable[None]]) -> None:
        self.cache = cache
        self.kube = kube
        self.queue = WorkQueue("health-slices")
        self._post_event = post_event
        self._reported: set[tuple[str, str, str]] = set()
        self._labels_written: dict[str, tuple[int, str]] = {}
        """Record name -> (resourceVersion our SLICE_LABEL patch returned, the label), until the cache has it."""

    async def reconcile(self, key: Hashable) -> None:
        name = cast(str, key)
        slice_ = self.cache.resource_slice(name)
        if slice_ is None:
            self._look_at_pools_of(name, self.cache.records())
            return
        existing = self._records(self._records_of_devices(slice_))
        pool_slices = self.cache.resource_slices_of_pool(str(slice_["spec"].get("driver") or ""),
                                                         slice_marks.slice_pool(slice_))
        sync = slice_marks.plan_slice(slice_, existing, pool_slices)
        for error in sync.errors:
            marker = (slice_["metadata"].get("uid", ""), error.key, error.message)
            if marker not in self._reported:
                self._reported.add(marker)
                await self._post_event(slice_, "Warning", MARK_ERROR, error.message)
                log.warning("slice %s: %s", name, error.message)
        # A slice's records go out together (a rack's worth of marks is one round trip per CREATE_AT_ONCE).
        slots = asyncio.Semaphore(CREATE_AT_ONCE)

        async def create(body: Body) -> None:
            async with slots:
                try:
                    await self.kube.create_cluster_object(records.API_VERSION, records.PLURAL, body)
                except ApiError as exc:
                    if exc.status != 409:
                        raise
            log.info("slice %s: device %s marked unhealthy: %s", name, body["spec"]["device"], body["spec"]["reason"])

        failed = [r for r in await asyncio.gather(*(create(b) for b in sync.create), return_exceptions=True)
                  if isinstance(r, Exception)]
        if failed:  # the queue retries the slice; records already created are 409s then
            raise failed[0]
        for record_name, reason in sync.update_reason:
            await self.kube.merge_patch_cluster_object(records.API_VERSION, records.PLURAL, record_name,
                                                       {"spec": {"reason": reason}})
        for record_name, drain in sync.update_drain:
            await self.kube.merge_patch_cluster_object(records.API_VERSION, records.PLURAL, record_name,
                                                       {"spec": {"drain": drain}})
            log.info("slice %s: record %s drains with %s", name, record_name, drain)
        for record_name, target in sync.relabel:
            label = records.label_value(target)
            result = await self.kube.merge_patch_cluster_object(records.API_VERSION, records.PLURAL, record_name, {
                "metadata": {"labels": {records.SLICE_LABEL: label}}})
            self._labels_written[record_name] = (resource_version(result), label)
            log.info("slice %s: record %s now follows the mark on slice %s", name, record_name, target)
        for record_name in sync.delete:
            # Pinned to the record as planned: another slice of the pool may have taken it over meanwhile
            # (follow_marks), and that slice's mark must keep it. Planned again on the fresh record if so.
            meta = existing[record_name]["metadata"]
            try:
                await self.kube.delete_cluster_object(records.API_VERSION, records.PLURAL, record_name,
                                                      uid=meta.get("uid"), resource_version=meta.get("resourceVersion"))
            except ApiError as exc:
                if not exc.conflict:
                    raise
                log.info("slice %s: record %s changed since it was planned; planning again", name, record_name)
                self.queue.add_after(name, CHANGED_RETRY)
                continue
            log.info("slice %s: record %s cleared (annotation removed)", name, record_name)

    def _records_of_devices(self, slice_: Body) -> list[Body]:
        """The records of the devices the slice lists, from the records' device index: all that `plan_slice`
        looks at (a scan of every record per slice event was quadratic when a rack was marked)."""
        driver, pool = str(slice_["spec"].get("driver") or ""), slice_marks.slice_pool(slice_)
        found: dict[str, Body] = {}
        for device in slice_marks.slice_devices(slice_):
            for record in self.cache.records_marking((driver, pool, device)):
                found[record["metadata"]["name"]] = record
        return list(found.values())

    def _records(self, cached: Iterable[Body]) -> dict[str, Body]:
        """The records by name, with the slice labels written here that the cache has not brought back
        yet: the annotation's removal may come before the relabelled record, and a plan on the old label
        would leave the record for good (no later event of the slice looks at it again)."""
        existing: dict[str, Body] = {}
        for record in cached:
            name = record["metadata"]["name"]
            written = self._labels_written.get(name)
            if written is not None and resource_version(record) < written[0]:
                labels = {**(record["metadata"].get("labels") or {}), records.SLICE_LABEL: written[1]}
                record = {**record, "metadata": {**record["metadata"], "labels": labels}}
            existing[name] = record
        self._labels_written = {name: written for name, written in self._labels_written.items()
                                if (current := self.cache.record(name)) is not None
                                and resource_version(current) < written[0]}
        return existing

    def _look_at_pools_of(self, gone: str, existing: Iterable[Body]) -> None:
        """A slice is gone: the other slices of its records' pools are looked at again, so that one still
        carrying a mark takes its record over (slice_marks.follow_marks) before that mark is removed there."""
        label = records.label_value(gone)
        pools = {(ref.driver, ref.pool) for record in existing
                 if slice_marks.slice_label(record) == label and (ref := records.record_ref(record)) is not None}
        for driver, pool in sorted(pools):
            for slice_ in self.cache.resource_slices_of_pool(driver, pool):
                self.queue.add(slice_marks.slice_name(slice_))
