"""What an eviction attempt reads before the call, and how little it reads in a burst.

Each attempt decides on a fresh read of the record, because the indices may hold a record cleared
while a watch was down, and on the cached pod, pinned by the eviction's preconditions: its UID and
resourceVersion (the server refuses the eviction with 409 when the pod changed since the cache saw
it). A pod is evicted only while the record still says so and its claim holds the device reserved for
it (or for the pod's PodGroup, with the pod using it: groups.py); under drain Node, while it runs on
the device's node.

A burst costs little more than the evictions themselves (docs/concepts/safety.md "The eviction budget",
throughput): evictions that wait for a read together share one metadata-only LIST of the records (or,
when few of many records are asked, a GET of each: ``RECORD_LIST_ITEMS_PER_GET``), a single eviction
reads its record by name; the pod comes from the cache where no PodDisruptionBudget may count it; the
claim is taken from the cache when it agrees (a claim reserved for the running pod keeps its
allocation) and read only to confirm a no.
"""

from __future__ import annotations

import asyncio
import logging

from .. import metrics
from ..cache import Body, Cache
from ..kube.api import Kube
from ..kube.errors import ApiError
from ..kube.next_read import NextRead
from ..objects.claims import is_reserved_for
from ..objects.meta import is_being_deleted
from . import groups, plan, records

log = logging.getLogger("claimwarden.health")

PDB_API = "/apis/policy/v1"
RECORD_LIST_ITEMS_PER_GET = 20  # assumed: a metadata-only LIST item costs about 1/20 of a GET, either side


class EvictionReads:
    """The reads evictions share: the records asked since the last read, and the namespaces PDBs guard."""

    def __init__(self, *, kube: Kube, cache: Cache | None) -> None:
        """`cache`: None in unit tests: every object is then read from the API."""
        self.kube = kube
        self.cache = cache
        self._record_versions = NextRead(self._read_asked_records)
        self._records_asked: set[str] = set()  # the names the read being gathered will answer
        self._guarded_namespaces = NextRead(self._list_guarded_namespaces)

    async def still_due(self, record_name: str, namespace: str, pod_name: str, uid: str, claim_name: str, *,
                        burst: bool) -> tuple[Body, Body, records.DeviceRef, bool] | None:
        """(record read fresh, pod, device, pinned) when the pod is still to be evicted; else None.

        In a `burst` (other evictions queued or reading), the record comes from a shared LIST and, where no
        PodDisruptionBudget is in the pod's namespace, the pod from the cache, pinned (evictions.py ``_evict``);
        otherwise both are read by name."""
        cached_pod = self.cache.pod(namespace, pod_name) if self.cache is not None else None
        burst = burst or self._record_versions.busy
        pinned = False
        pod: Body | None
        if burst and cached_pod is not None and cached_pod["metadata"].get("uid") == uid:
            record, guarded = await asyncio.gather(self.record(record_name, shared=True),
                                                   self.guarded(namespace))
            pinned = not guarded
            pod = cached_pod if pinned else await self.kube.get_pod(namespace, pod_name)
        else:
            record, pod = await asyncio.gather(self.record(record_name, shared=burst),
                                               self.kube.get_pod(namespace, pod_name))
        ref = records.record_ref(record) if record is not None else None
        if record is None or ref is None or records.record_effect(record) != "NoExecute" or \
                is_being_deleted(record):
            return None
        if pod is None or pod["metadata"].get("uid") != uid:
            metrics.EVICTIONS.labels("gone").inc()
            return None
        if is_being_deleted(pod):
            return None
        if records.record_drain(record).mode == records.DRAIN_NODE and self._on_device_node(pod, ref):
            return record, pod, ref, pinned  # drain Node: any pod of the device's node goes
        # The claim from the cache is enough when it says yes: the pod is evicted only as it was seen
        # (running with this UID), and a claim reserved for a running pod keeps its allocation. Only a no is
        # confirmed with a read.
        cached = self.cache.claim(namespace, claim_name) if self.cache is not None else None
        if cached is not None and plan.holds_device(cached, ref) and (
                is_reserved_for(cached, uid) or groups.holds_through_group(cached, pod)):
            return record, pod, ref, pinned
        claim = await self.kube.get_claim(namespace, claim_name)
        if claim is None or not plan.holds_device(claim, ref):
            return None
        if not is_reserved_for(claim, uid) and not groups.holds_through_group(claim, pod):
            return None
        return record, pod, ref, pinned

    def _on_device_node(self, pod: Body, ref: records.DeviceRef) -> bool:
        """True when the pod runs on the node the device is tied to. A device tied to no one node (network-attached)
        drains as Immediate (controller.py ``_drain_node``), so its pods keep the check that their claim holds it."""
        if self.cache is None:
            return False
        node = plan.slice_node(self.cache.resource_slices_of_pool(ref.driver, ref.pool), ref)
        return node is not None and (pod.get("spec") or {}).get("nodeName") == node

    async def record(self, name: str, *, shared: bool) -> Body | None:
        """The record as it is now in the API. `shared` (a burst): through a read that waiting evictions
        share (``NextRead``, `_read_asked_records`): a record answered at the resourceVersion the cache holds
        is the cached record, one missing is gone, one read whole is that, any other is read by name; if the
        shared read fails, by name too. Otherwise the record is read by name."""
        cached = self.cache.record(name) if self.cache is not None else None
        if cached is None or not shared:
            return await self.kube.get_cluster_object(records.API_VERSION, records.PLURAL, name)
        self._records_asked.add(name)
        try:
            answered = await self._record_versions.get()
        except ApiError as exc:
            log.warning("reading the records failed (%s); reading them one by one", exc)
            return await self.kube.get_cluster_object(records.API_VERSION, records.PLURAL, name)
        if name not in answered:
            return None
        found, whole = answered[name]
        if found["metadata"].get("resourceVersion") == cached["metadata"].get("resourceVersion"):
            return cached
        if whole:
            return found
        return await self.kube.get_cluster_object(records.API_VERSION, records.PLURAL, name)

    async def _read_asked_records(self) -> dict[str, tuple[Body, bool]]:
        """name -> (the record now, whether whole or its metadata alone) for the names asked since the last read; a
        record missing or being deleted is left out. One metadata-only LIST of every record when that costs
        less than reading the asked ones by name (RECORD_LIST_ITEMS_PER_GET listed items cost about one GET):
        at 5,000 records, LISTs shared by a few evictions each had cost a third of claimwarden's CPU and
        more of the apiserver's (make bench at 2,500 and 5,000 pods)."""
        asked, self._records_asked = self._records_asked, set()
        total = self.cache.record_count() if self.cache is not None else 0
        if len(asked) * RECORD_LIST_ITEMS_PER_GET >= total:
            return {str(meta.get("name")): ({"metadata": meta}, False)
                    for meta in await self.kube.list_metadata(f"/apis/{records.API_VERSION}", records.PLURAL)
                    if not meta.get("deletionTimestamp")}
        names = sorted(asked)
        bodies = await asyncio.gather(*(self.kube.get_cluster_object(records.API_VERSION, records.PLURAL, name)
                                        for name in names))
        return {name: (body, True) for name, body in zip(names, bodies, strict=True)
                if body is not None and not is_being_deleted(body)}

    async def guarded(self, namespace: str) -> bool:
        """True when a PodDisruptionBudget may count the namespace's pods (or that cannot be told)."""
        try:
            return namespace in await self._guarded_namespaces.get()
        except ApiError as exc:
            log.warning("listing PodDisruptionBudgets failed (%s); pods are read before their eviction", exc)
            return True

    async def _list_guarded_namespaces(self) -> frozenset[str]:
        return frozenset(str(meta.get("namespace"))
                         for meta in await self.kube.list_metadata(PDB_API, "poddisruptionbudgets"))
