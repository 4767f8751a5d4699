"""The records derived for a whole device's siblings, kept in step one pool at a time (siblings.py decides).

A key is a pool (driver, pool name): a record or a slice of the pool changed. The plan is made from the cache;
deletions, which free devices, are planned again on a live LIST of the records first, so that a cache still
filling after a restart never removes a mark (the same care as quarantine.release_orphans).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Hashable
from typing import cast

from ..cache import Body, Cache
from ..kube.api import Kube
from ..kube.errors import ApiError
from ..runtime.workqueue import Requeue, WorkQueue
from . import records, siblings, slice_marks

log = logging.getLogger("claimwarden.health")

INVALID_SCOPE = "InvalidScope"
REPLACE_RETRY = 1.0  # seconds: a derived record deleted to be made again is made once it is gone

PoolKey = tuple[str, str]


class SiblingRecords:
    """The pool queue, and which bad scopes were reported."""

    def __init__(self, *, cache: Cache, kube: Kube,
                 post_event: Callable[[Body, str, str, str], Awaitable[None]]) -> None:
        self.cache = cache
        self.kube = kube
        self.queue = WorkQueue("health-siblings")
        self._post_event = post_event
        self._reported: set[tuple[str, int]] = set()  # (record uid, generation) whose bad scope an Event named

    def enqueue_record(self, record: Body) -> None:
        ref = records.record_ref(record)
        if ref is not None:
            self.queue.add((ref.driver, ref.pool))

    def enqueue_slice(self, slice_: Body) -> None:
        spec = slice_.get("spec") or {}
        driver, pool = spec.get("driver"), slice_marks.slice_pool(slice_)
        if driver and pool:
            self.queue.add((str(driver), pool))

    def domain_of(self, ref: records.DeviceRef) -> list[str] | None:
        """The device names of the device's fault domain for its record's status; None when no slice lists it."""
        return siblings.domain_devices(ref, self.cache.resource_slices_of_pool(ref.driver, ref.pool))

    def _pool_records(self, key: PoolKey, listing: list[Body]) -> list[Body]:
        return [r for r in listing if (ref := records.record_ref(r)) is not None and (ref.driver, ref.pool) == key]

    async def reconcile(self, key: Hashable) -> None:
        driver, pool = cast(PoolKey, key)
        pool_slices = self.cache.resource_slices_of_pool(driver, pool)
        # From the records' device index, over the devices the pool lists: a scan of every record per event was
        # quadratic in a burst of marks. Records of devices no slice lists are kept anyway (siblings.py rule 3),
        # and the garbage collector removes derived records whose origin is gone.
        devices = {device for item in pool_slices for device in slice_marks.slice_devices(item)}
        cached = siblings.with_origins(
            [r for device in sorted(devices) for r in self.cache.records_marking((driver, pool, device))],
            self.cache.record)
        await self._report_bad_scopes(cached)
        sync = siblings.plan_pool(driver, pool, cached, pool_slices)
        if sync.delete:  # freeing devices: decided again on what the API server holds now
            live = await self.kube.list_cluster_objects(records.API_VERSION, records.PLURAL)
            sync = siblings.plan_pool(driver, pool, self._pool_records((driver, pool), live), pool_slices)
        for name, uid in sync.delete:
            try:
                await self.kube.delete_cluster_object(records.API_VERSION, records.PLURAL, name, uid=uid)
            except ApiError as exc:
                if not exc.conflict:
                    raise
                continue  # replaced meanwhile: its events plan the pool again
            log.info("pool %s/%s: derived record %s removed (no mark of a whole device covers it any more)",
                     driver, pool, name)
        for name, fields in sync.patch:
            await self.kube.merge_patch_cluster_object(records.API_VERSION, records.PLURAL, name, {"spec": fields})
        again = False
        for body in sync.create:
            try:
                await self.kube.create_cluster_object(records.API_VERSION, records.PLURAL, body)
            except ApiError as exc:
                if exc.status != 409:
                    raise
                again = True  # the stale one under its name is still being deleted
                continue
            log.info("pool %s/%s: device %s marked as a sibling: %s", driver, pool, body["spec"]["device"],
                     body["spec"]["reason"])
        if again:
            raise Requeue(REPLACE_RETRY, "a derived record is still being replaced")

    async def _report_bad_scopes(self, pool_records: list[Body]) -> None:
        """A Warning Event on a record whose spec.scope cannot be used (an older CRD let it in), once per
        generation."""
        for record in pool_records:
            problem = siblings.scope_error(record)
            meta = record.get("metadata") or {}
            marker = (str(meta.get("uid") or ""), int(meta.get("generation") or 0))
            if problem is None or marker in self._reported:
                continue
            self._reported.add(marker)
            log.warning("record %s: %s", meta.get("name"), problem)
            await self._post_event(record, "Warning", INVALID_SCOPE, problem)
