"""reservations: drop reservations of pods that are gone, free devices, delete finished pods' claims.

The decisions are in plan.py; this module gathers the view and applies the plan with conflict-safe
writes, as upstream's resourceclaim controller does:

- A pod's view comes from the cache when the cache holds the very pod (same UID) a reservation
  names: a pod that is terminal, or being deleted before it was scheduled, never comes back, and a
  running one is kept. A UID seen in a pod's DELETED event (`DeletedPods`) is gone for good. Only a
  reservation for a pod the cache does not hold under that UID, and not known deleted, is confirmed
  with a live GET (the pod may be too new for the cache, or the cache may still hold an older pod of
  that name).
- The claim is not read again before writing: every write carries the cached resourceVersion (a
  JSON patch ``test`` op, a delete precondition). If the claim changed meanwhile the write fails
  (422 or 409); the claim is then read once and the plan made again on the fresh copy.
- A PodGroup reservation is dropped only after a live GET of the PodGroup confirms it is gone. A GET
  the server answers with "not served" (the PodGroup version found at start-up was dropped by an
  upgrade or a --runtime-config change) confirms nothing: the claim is left as it is, the served
  version is looked up again, and the claim is planned again at that version.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import replace
from typing import Any, cast

from .. import metrics
from ..cache import Body, Cache
from ..claims import podgroups
from ..claims.podgroups import is_podgroup_reservation, podgroup_view
from ..kube.api import Kube
from ..kube.errors import ApiError, NotServed
from ..objects.claims import (
    DELETE_PROTECTION_FINALIZER,
    RESERVED_FOR_MAX,
    controlling_pod_ref,
    is_pod_reservation,
    reserved_for,
)
from ..objects.meta import is_being_deleted
from ..objects.pods import PodView, claim_statuses, pod_uid
from ..runtime.workqueue import Requeue, WorkQueue
from . import plan

log = logging.getLogger("claimwarden.reservations")
HELD_RECHECK = 1.0  # seconds before a release that was held is looked at again
KEPT_RECHECK = 5.0  # seconds before a claim kept on a quarantined device (rule 4) is looked at again
RELEASE_GATHER = 1.0  # seconds a shared claim's release waits for more of its pods to go
PODGROUP_REDISCOVERED = 1.0  # seconds before a claim is planned again at the PodGroup version served now
RELEASE_SPACING = 1.0
"""Seconds at least between two releases of one claim. Every write's echo (and the scheduler's updates)
queues the claim at once, so without it a claim whose 256 pods go over some seconds is patched once per
round trip (41 writes measured on a loaded machine), not once per second."""

NAME = "reservations"
NEAR_LIMIT_REASON = "ReservationsNearLimit"
DELETED_PODS_REMEMBERED = 4096
"""Enough for a burst of evictions or a finished job; a UID that fell out costs one GET, no wrong decision."""


class DeletedPods:
    """The UIDs of the last pods seen deleted, oldest forgotten first. A UID is never reused, so a UID
    found here belongs to a pod that is gone for good."""

    def __init__(self, size: int = DELETED_PODS_REMEMBERED) -> None:
        self._size = size
        self._uids: OrderedDict[str, None] = OrderedDict()

    def add(self, uid: str) -> None:
        if not uid:
            return
        self._uids[uid] = None
        self._uids.move_to_end(uid)
        while len(self._uids) > self._size:
            self._uids.popitem(last=False)

    def __contains__(self, uid: object) -> bool:
        return uid in self._uids

    def __len__(self) -> int:
        return len(self._uids)


def _stale(exc: ApiError) -> bool:
    """The write was refused because the claim changed since it was read: a failed resourceVersion
    ``test`` op of a JSON patch (422) or a failed delete precondition (409)."""
    return exc.status in (409, 422)


class ReservationsController:
    def __init__(self, cache: Cache, kube: Kube, quarantined: Callable[[Body], bool] | None = None,
                 podgroup_version: str | None = None, *, held: Callable[[Body], bool] | None = None,
                 kept: Callable[[Body], bool] | None = None) -> None:
        """`held(claim)`: the claim's release should wait a moment (health's eviction wave, health/wave.py).
        `kept(claim)`: a generated claim on a quarantined device keeps its allocation until the mark is cleared
        (rule 4 of the quarantine trap, health/__init__.py)."""
        self.cache = cache
        self.kube = kube
        self._held = held or (lambda _claim: False)
        self._kept = kept or (lambda _claim: False)
        # The served PodGroup version, or None where the cluster serves no PodGroups (their entries are kept).
        self.podgroup_version = podgroup_version
        self._quarantined = quarantined or (lambda _claim: False)
        self.queue = WorkQueue(NAME)
        self._warned_near_limit: set[str] = set()
        self.deleted_pods = DeletedPods()
        self._last_release: dict[tuple[str, str], float] = {}

    def enqueue_claim(self, namespace: str, name: str, *, gather: bool = False) -> None:
        """`gather`: a pod of a shared claim let go; pods leaving within RELEASE_GATHER seconds of it are
        released by the same write (256 pods of one claim deleted together: a few writes, not one each)."""
        if gather:
            self.queue.add_after((namespace, name), RELEASE_GATHER)
        else:
            self.queue.add((namespace, name))

    def enqueue_for_pod(self, pod: PodView) -> None:
        """The claims a pod event may let go: all the pod uses and controls once it may release them
        (`plan.pod_may_release`), else those still reserved for a predecessor of the same name."""
        if pod.deleted:
            self.note_deleted_pod(pod.uid)
        releasing = plan.pod_may_release(pod.body, deleted=pod.deleted)
        for claim_name in pod.claim_names:
            claim = self.cache.claim(pod.namespace, claim_name)
            if releasing or plan.reserved_for_predecessor(claim, pod.name, pod.uid):
                shared = len(((claim or {}).get("status") or {}).get("reservedFor") or []) > 1
                self.enqueue_claim(pod.namespace, claim_name, gather=shared)
        if releasing:
            for claim in self.cache.claims_owned_by(pod.namespace, pod.uid):
                self.enqueue_claim(pod.namespace, claim["metadata"]["name"])

    def enqueue_for_podgroup(self, namespace: str, podgroup: Body, *, deleted: bool) -> None:
        """A PodGroup going away: every claim it may hold a reservation on, named in its spec or status or
        controlled by it."""
        if not deleted and not is_being_deleted(podgroup):
            return
        names = {str(e["resourceClaimName"]) for e in (podgroup.get("spec") or {}).get("resourceClaims") or []
                 if e.get("resourceClaimName")}
        names |= {str(e["resourceClaimName"]) for e in claim_statuses(podgroup).values()
                  if e.get("resourceClaimName")}
        uid = (podgroup.get("metadata") or {}).get("uid", "")
        names |= {c["metadata"]["name"] for c in self.cache.claims_owned_by_podgroup(namespace, uid)}
        for name in names:
            self.enqueue_claim(namespace, name)

    def note_deleted_pod(self, uid: str) -> None:
        """A pod's DELETED event (or a confirmed stale entry): its reservations go without a GET."""
        self.deleted_pods.add(uid)

    async def reconcile(self, key: Hashable) -> None:
        namespace, name = cast(tuple[str, str], key)
        cached = self.cache.claim(namespace, name)
        if cached is None:
            return
        claim_plan = await self._plan(cached)
        await self._note_limit(cached, claim_plan)
        if not _destructive(claim_plan):
            return
        if self._held(cached):
            raise Requeue(HELD_RECHECK, "held")
        wait = self._release_spacing_left((namespace, name)) if claim_plan.drop else 0.0
        if wait > 0:
            raise Requeue(wait, "gathering releases")
        try:
            kept = await self._apply(cached, claim_plan)
            self._released((namespace, name), claim_plan)
        except ApiError as exc:
            if not _stale(exc):
                raise
            log.debug("claim %s/%s changed since it was cached (%s): reading it again", namespace, name, exc)
            fresh = await self.kube.get_claim(namespace, name)
            if fresh is None:
                return
            claim_plan = await self._plan(fresh)
            if not _destructive(claim_plan):
                return
            kept = await self._apply(fresh, claim_plan)
            self._released((namespace, name), claim_plan)
        if kept:  # looked at again until the mark is cleared (the record's events do not queue this claim)
            raise Requeue(KEPT_RECHECK, "kept on a quarantined device")

    def _release_spacing_left(self, key: tuple[str, str]) -> float:
        last = self._last_release.get(key)
        return 0.0 if last is None else last + RELEASE_SPACING - asyncio.get_running_loop().time()

    def _released(self, key: tuple[str, str], claim_plan: plan.ClaimPlan) -> None:
        if not claim_plan.drop:
            return
        now = asyncio.get_running_loop().time()
        if len(self._last_release) >= DELETED_PODS_REMEMBERED:
            self._last_release = {k: t for k, t in self._last_release.items() if now - t < RELEASE_SPACING}
        self._last_release[key] = now

    async def _plan(self, claim: Body) -> plan.ClaimPlan:
        """The plan from the pod views (`_pod_view`) and the cached PodGroups; a plan that would drop a
        PodGroup's reservation is made again with those PodGroups read from the API."""
        claim_plan = await self._plan_with(claim)
        live_groups = {entry["name"] for entry in claim_plan.drop if is_podgroup_reservation(entry)}
        if live_groups:
            claim_plan = await self._plan_with(claim, live_groups)
        return claim_plan

    async def _plan_with(self, claim: Body, live_groups: set[str] | frozenset[str] = frozenset()) -> plan.ClaimPlan:
        namespace = claim["metadata"]["namespace"]
        owner_ref = controlling_pod_ref(claim)
        reserved: dict[str, set[str]] = {}
        for entry in reserved_for(claim):
            if is_pod_reservation(entry):
                reserved.setdefault(entry["name"], set()).add(str(entry.get("uid") or ""))
        if owner_ref is not None and owner_ref["name"] in reserved:
            reserved[owner_ref["name"]].add(str(owner_ref.get("uid") or ""))
        pods = {pod: await self._pod_view(namespace, pod, uids) for pod, uids in reserved.items()}
        owner = None
        if owner_ref is not None:
            # An owner the cache does not hold at all is left to the garbage collector, as before.
            owner = pods[owner_ref["name"]] if owner_ref["name"] in pods else await self._pod_view(
                namespace, owner_ref["name"], {str(owner_ref.get("uid") or "")}, confirm_missing=False)
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
            try:
                podgroup = await self.kube.get_podgroup(self.podgroup_version, namespace, name)
            except NotServed:
                await self._rediscover_podgroup_version()
                raise Requeue(PODGROUP_REDISCOVERED, "PodGroup version looked up again") from None
        return podgroup_view(podgroup)

    async def _rediscover_podgroup_version(self) -> None:
        """The server no longer serves PodGroups at `podgroup_version`: take the version it serves now,
        or None (PodGroup reservations are then kept, as on a cluster without PodGroups)."""
        old = self.podgroup_version
        self.podgroup_version = await self.kube.served_version(podgroups.GROUP, podgroups.PLURAL, podgroups.VERSIONS)
        if self.podgroup_version != old:
            found = (f"reads them at {podgroups.GROUP}/{self.podgroup_version} now" if self.podgroup_version
                     else "serves them at no version claimwarden knows: their reservations are kept")
            log.warning("PodGroups are no longer served at %s/%s; the server %s (restart claimwarden to "
                        "watch them again)", podgroups.GROUP, old, found)

    async def _pod_view(self, namespace: str, name: str, uids: set[str], *,
                        confirm_missing: bool = True) -> dict[str, Any] | None:
        """The view of pod `name`, named with `uids` by the claim: the cached pod's when every UID is
        either the cached pod's or known deleted; else the API's (see the module docstring). With
        `confirm_missing` False a pod the cache does not hold is taken as unknown (None) without a GET."""
        cached = self.cache.pod(namespace, name)
        cached_uid = pod_uid(cached) if cached is not None else None
        if all(uid == cached_uid or uid in self.deleted_pods for uid in uids):
            return plan.pod_view(cached)
        if cached is None and not confirm_missing:
            return None
        return plan.pod_view(await self.kube.get_pod(namespace, name))

    async def _apply(self, claim: Body, claim_plan: plan.ClaimPlan) -> bool:
        """Apply the plan; True when the claim is kept on a quarantined device (rule 4) and must be looked at
        again."""
        meta = claim["metadata"]
        namespace, name = meta["namespace"], meta["name"]
        status = claim.get("status") or {}
        # A generated claim (its pod's, its PodGroup's, or the scheduler's for an extended resource) on a
        # quarantined device is released by deleting it with its allocation (rule 2 of the quarantine trap,
        # health/__init__.py; docs/concepts/device-health.md "Keeping new work away"): a deallocation would wake
        # pending pods while the scheduler briefly sees the device free.
        keep_allocation = claim_plan.deallocate and _owned(claim) and self._quarantined(claim)
        # Rule 4: where the scheduler also retries pending pods on a claim's deletion (1.37+) and no DeviceTaintRule
        # keeps them off, even the deletion opens a window: the claim keeps its allocation and its delete-protection
        # finalizer, and is not deleted (its reservations go), until the mark is cleared.
        kept = (keep_allocation or claim_plan.remove_finalizer or claim_plan.delete_claim) and _owned(claim) and \
            self._kept(claim)
        if keep_allocation:
            claim_plan = replace(claim_plan, deallocate=False)
        if kept:
            claim_plan = replace(claim_plan, remove_finalizer=False, delete_claim=False)
        # Such a claim goes (the garbage collector deletes it, or claimwarden does below): its reservations
        # go with it, and only its finalizer needs a write. It holds the device until it is gone, as above.
        going = keep_allocation and not kept and not claim_plan.keep and claim_plan.remove_finalizer
        if going and controlling_pod_ref(claim) is None and not is_being_deleted(claim) and \
                any(is_podgroup_reservation(entry) for entry in claim_plan.drop):
            # A PodGroup's claim whose PodGroup is gone (or replaced): the garbage collector would delete it
            # too, and deleting it now keeps its allocation to the end.
            claim_plan = replace(claim_plan, delete_claim=True)
        if going:
            metrics.RESERVATIONS_REMOVED.inc(len(claim_plan.drop))
            log.info("claim %s/%s: on a quarantined device, released with its reservations and allocation",
                     namespace, name)
        elif claim_plan.drop or (claim_plan.deallocate and status.get("allocation")):
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
        # Pinned to the version the plan saw (or the last write returned): a claim changed since fails with 409.
        if claim_plan.delete_claim and await self.kube.delete_claim(namespace, name, meta["uid"],
                                                                    claim["metadata"].get("resourceVersion")):
            metrics.CLAIM_DELETIONS.inc()
            log.info("claim %s/%s: deleted, its %s", namespace, name,
                     "pod is done" if controlling_pod_ref(claim) is not None else "PodGroup is gone")
        if kept:
            log.info("claim %s/%s: kept with its allocation on a quarantined device until the mark is cleared",
                     namespace, name)
        return kept

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


def _owned(claim: Body) -> bool:
    """A generated claim: controlled by a pod (from a template, or the scheduler's extended-resource claim) or by
    a PodGroup (1.36+). Such a claim is deleted once its owner is done, never reused."""
    return controlling_pod_ref(claim) is not None or podgroups.controlling_podgroup_ref(claim) is not None


def _destructive(claim_plan: plan.ClaimPlan) -> bool:
    return bool(claim_plan.drop or claim_plan.deallocate or claim_plan.remove_finalizer or claim_plan.delete_claim)
