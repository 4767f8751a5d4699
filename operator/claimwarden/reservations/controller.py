"""reservations: drop reservations of pods that are gone, free devices, delete finished pods' claims.

The decisions are in plan.py; this module gathers the view, re-reads before anything destructive
and applies the plan with conflict-safe patches.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Hashable
from dataclasses import replace
from typing import Any, cast

from .. import metrics
from ..cache import Body, Cache
from ..claims.podgroups import is_podgroup_reservation, podgroup_view
from ..kube.api import Kube
from ..kube.errors import ApiError
from ..podclaims import (
    DELETE_PROTECTION_FINALIZER,
    RESERVED_FOR_MAX,
    controlling_pod_ref,
    is_pod_reservation,
    reserved_for,
)
from ..workqueue import WorkQueue
from . import plan

log = logging.getLogger("claimwarden.reservations")

NAME = "reservations"
NEAR_LIMIT_REASON = "ReservationsNearLimit"


class ReservationsController:
    def __init__(self, cache: Cache, kube: Kube, quarantined: Callable[[Body], bool] | None = None,
                 podgroup_version: str | None = None) -> None:
        self.cache = cache
        self.kube = kube
        # The served PodGroup version, or None where the cluster serves no PodGroups (their entries are kept).
        self.podgroup_version = podgroup_version
        self._quarantined = quarantined or (lambda _claim: False)
        self.queue = WorkQueue(NAME)
        self._warned_near_limit: set[str] = set()

    def enqueue_claim(self, namespace: str, name: str) -> None:
        self.queue.add((namespace, name))

    async def reconcile(self, key: Hashable) -> None:
        namespace, name = cast(tuple[str, str], key)
        cached = self.cache.claim(namespace, name)
        if cached is None:
            return
        claim_plan = await self._plan(cached)
        await self._note_limit(cached, claim_plan)
        if not _destructive(claim_plan):
            return
        # Before anything destructive, decide again on a fresh read of the claim and of every pod
        # the first plan would let go of: the cache may hold a pod deleted while a watch was down.
        fresh = await self.kube.get_claim(namespace, name)
        if fresh is None:
            return
        live = {entry["name"] for entry in claim_plan.drop if is_pod_reservation(entry)}
        live_groups = {entry["name"] for entry in claim_plan.drop if is_podgroup_reservation(entry)}
        owner_ref = controlling_pod_ref(cached)
        if claim_plan.delete_claim and owner_ref is not None:
            live.add(owner_ref["name"])
        claim_plan = await self._plan(fresh, live=live, live_groups=live_groups)
        if _destructive(claim_plan):
            await self._apply(fresh, claim_plan)

    async def _plan(self, claim: Body, live: set[str] | frozenset[str] = frozenset(),
                    live_groups: set[str] | frozenset[str] = frozenset()) -> plan.ClaimPlan:
        """The plan from cached pods and PodGroups, except those named in `live`/`live_groups`, which are
        read from the API."""
        namespace = claim["metadata"]["namespace"]
        pods: dict[str, dict[str, Any] | None] = {}
        for entry in reserved_for(claim):
            if is_pod_reservation(entry):
                pods[entry["name"]] = await self._pod_view(namespace, entry["name"], entry["name"] in live)
        owner_ref = controlling_pod_ref(claim)
        owner = None
        if owner_ref is not None:
            owner_name = owner_ref["name"]
            owner = pods.get(owner_name) if owner_name in pods else plan.pod_view(
                await self.kube.get_pod(namespace, owner_name) if owner_name in live
                else self.cache.pod(namespace, owner_name))
        podgroups = None
        if self.podgroup_version is not None:
            podgroups = {}
            for entry in reserved_for(claim):
                if is_podgroup_reservation(entry):
                    podgroups[entry["name"]] = await self._podgroup_view(namespace, entry["name"],
                                                                         entry["name"] in live_groups)
        return plan.plan_claim(claim, pods, owner, podgroups=podgroups)

    async def _podgroup_view(self, namespace: str, name: str, live: bool) -> dict[str, Any] | None:
        """From the cache, or a live GET when asked to or when the cache does not have it (it may be too new)."""
        podgroup = None if live else self.cache.podgroup(namespace, name)
        if podgroup is None and self.podgroup_version is not None:
            podgroup = await self.kube.get_podgroup(self.podgroup_version, namespace, name)
        return podgroup_view(podgroup)

    async def _pod_view(self, namespace: str, name: str, live: bool) -> dict[str, Any] | None:
        """From the cache, or a live GET when asked to or when the cache does not have it."""
        pod = None if live else self.cache.pod(namespace, name)
        if pod is None:
            pod = await self.kube.get_pod(namespace, name)
        return plan.pod_view(pod)

    async def _apply(self, claim: Body, claim_plan: plan.ClaimPlan) -> None:
        meta = claim["metadata"]
        namespace, name = meta["namespace"], meta["name"]
        status = claim.get("status") or {}
        # A generated claim on a quarantined device is released by deleting it with its allocation:
        # a deallocation would wake pending pods while the scheduler briefly sees the device free.
        keep_allocation = claim_plan.deallocate and controlling_pod_ref(claim) is not None and self._quarantined(claim)
        if keep_allocation:
            claim_plan = replace(claim_plan, deallocate=False)
        if claim_plan.drop or (claim_plan.deallocate and status.get("allocation")):
            ops: list[dict[str, Any]] = [{"op": "test", "path": "/metadata/resourceVersion",
                                          "value": meta["resourceVersion"]}]
            if claim_plan.drop:
                ops.append({"op": "replace", "path": "/status/reservedFor", "value": list(claim_plan.keep)}
                           if claim_plan.keep else {"op": "remove", "path": "/status/reservedFor"})
            if claim_plan.deallocate and status.get("allocation"):
                # status.devices is the driver's to clean up (1.36+ guards it with resourceclaims/driver).
                ops.append({"op": "remove", "path": "/status/allocation"})
            claim = await self.kube.patch_claim_status(namespace, name, ops)
            metrics.RESERVATIONS_REMOVED.inc(len(claim_plan.drop))
            if claim_plan.deallocate:
                metrics.DEALLOCATIONS.inc()
            log.info("claim %s/%s: removed reservations for %s%s", namespace, name,
                     ", ".join(("PodGroup " if is_podgroup_reservation(e) else "") + e.get("name", "?")
                               for e in claim_plan.drop) or "nobody",
                     "; deallocated" if claim_plan.deallocate else "")
        if claim_plan.remove_finalizer:
            finalizers = claim["metadata"].get("finalizers") or []
            if DELETE_PROTECTION_FINALIZER in finalizers:
                index = finalizers.index(DELETE_PROTECTION_FINALIZER)
                claim = await self.kube.patch_claim(namespace, name, [
                    {"op": "test", "path": "/metadata/resourceVersion", "value": claim["metadata"]["resourceVersion"]},
                    {"op": "test", "path": f"/metadata/finalizers/{index}", "value": DELETE_PROTECTION_FINALIZER},
                    {"op": "remove", "path": f"/metadata/finalizers/{index}"}])
        if claim_plan.delete_claim and await self.kube.delete_claim(namespace, name, meta["uid"]):
            metrics.CLAIM_DELETIONS.inc()
            log.info("claim %s/%s: deleted, its pod is done", namespace, name)

    async def _note_limit(self, claim: Body, claim_plan: plan.ClaimPlan) -> None:
        """A Warning Event once when a claim crosses 90 % of the reservation limit."""
        uid = claim["metadata"].get("uid", "")
        if not claim_plan.near_limit:
            self._warned_near_limit.discard(uid)
            return
        if uid in self._warned_near_limit:
            return
        self._warned_near_limit.add(uid)
        count = len((claim.get("status") or {}).get("reservedFor") or [])
        try:
            await self.kube.post_event(claim, "Warning", NEAR_LIMIT_REASON,
                                       f"{count} of {RESERVED_FOR_MAX} status.reservedFor entries are in use; "
                                       "further pods cannot share this claim once it is full")
        except ApiError as exc:
            log.warning("could not post event on claim %s: %s", claim["metadata"].get("name"), exc)

    def forget(self, uid: str) -> None:
        self._warned_near_limit.discard(uid)


def _destructive(claim_plan: plan.ClaimPlan) -> bool:
    return bool(claim_plan.drop or claim_plan.deallocate or claim_plan.remove_finalizer or claim_plan.delete_claim)
