"""claims: per-pod ResourceClaims from templates (the queue and the API calls; decisions are in plan.py)."""

from __future__ import annotations

import logging
import time
from collections.abc import Hashable
from typing import Any, cast

from .. import metrics
from ..cache import Body, Cache
from ..kube.api import Kube
from ..kube.errors import ApiError
from ..objects.claims import (
    POD_CLAIM_NAME_ANNOTATION,
    RESERVED_FOR_MAX,
    ClaimView,
    controlling_pod_ref,
    controlling_pod_uid,
    is_allocated,
    is_reserved_for,
)
from ..objects.meta import is_being_deleted
from ..objects.pods import PodView, resolve_claim_names
from ..runtime.workqueue import Retry, WorkQueue
from . import generation, plan
from .creations import (
    APPLIED_FRESH,
    Recents,
    cached_templates,
    complete_templates,
    remember_created,
    warn_failed_creation,
    with_recent,
)
from .podgroup_controller import PodGroupsController
from .podgroups import GroupView, controlling_podgroup_ref, is_reserved_for_group_of, podgroup_name_of

log = logging.getLogger("claimwarden.claims")

NAME = "claims"


class ClaimRetry(Retry):
    """Some pod claims could not be handled yet; the pod is retried with back-off."""


class ClaimsController:
    def __init__(self, cache: Cache, kube: Kube, *, podgroups: PodGroupsController | None = None) -> None:
        self.cache = cache
        self.kube = kube
        # Where the cluster serves PodGroups, their controller (the claims they control, the served
        # version); None where it does not, and pods are planned as before.
        self.podgroups = podgroups
        self.queue = WorkQueue(NAME)
        self._recent: Recents = {}  # keyed by pod UID
        # pod UID -> (when, pod claim name -> claim name, the pod's resourceVersion after the apply):
        # the entries last applied to the pod's status.
        self._applied: dict[str, tuple[float, dict[str, str], str]] = {}

    def enqueue_pod(self, namespace: str, name: str) -> None:
        self.queue.add((namespace, name))

    def enqueue_for_pod(self, pod: PodView) -> None:
        """A pod event: a pod listing claims is queued if it may have work; a deleted one is forgotten
        (and nothing queued: the index no longer holds it)."""
        if not pod.lists_claims:
            return
        if pod.deleted:
            self.forget_pod(pod.uid)
        else:
            self.enqueue_if_needed(pod.namespace, pod.name)

    def enqueue_for_claim(self, claim: ClaimView, *, came_or_went: bool = True) -> None:
        """A claim event: the pods that use it, or control it, are queued if they may have work; a PodGroup's
        claim queues its PodGroup, and, when it `came_or_went` (listed, added, deleted), its member pods."""
        if claim.deleted:
            self.forget_deleted_claim(claim.body)
        pods = set(self.cache.pods_using_claim(claim.namespace, claim.name))
        owner = controlling_pod_ref(claim.body)
        if owner is not None:
            pods.add(owner["name"])  # usually the one pod that uses it: checked once
        for pod in sorted(pods):
            self.enqueue_if_needed(claim.namespace, pod)
        group = controlling_podgroup_ref(claim.body) if self.podgroups is not None else None
        if group is not None and self.podgroups is not None:
            self.podgroups.enqueue(claim.namespace, group["name"])
            if came_or_went:
                # Member pods record the group's claim once it exists (or look for a new one once it is gone).
                for member in self.cache.pods_in_podgroup(claim.namespace, group["name"]):
                    self.enqueue_if_needed(claim.namespace, member)

    def forget_deleted_claim(self, claim: Body) -> None:
        """A claim we created was deleted (maybe before the watch delivered it): stop counting on it."""
        uid = controlling_pod_uid(claim)
        if uid is None:
            return
        recent = self._recent.get(uid, {})
        recent.pop(claim["metadata"]["name"], None)
        if not recent:
            self._recent.pop(uid, None)
        _, applied, _ = self._applied.get(uid, (0.0, {}, ""))
        for pod_claim, claim_name in list(applied.items()):
            if claim_name == claim["metadata"]["name"]:
                del applied[pod_claim]

    def forget_pod(self, uid: str) -> None:
        """The pod is gone: drop what was remembered about it."""
        self._recent.pop(uid, None)
        self._applied.pop(uid, None)

    def enqueue_if_needed(self, namespace: str, name: str) -> bool:
        """Queue the cached pod only if a reconcile may have work (`plan.pod_needs_work`); True if queued.

        Decided from the cache alone: a pod in a PodGroup that the cache does not hold is queued
        (the reconcile reads the PodGroup from the API).
        """
        pod = self.cache.pod(namespace, name)
        if pod is None:
            return False  # nothing to reconcile: the worker would return at once
        owned, claims = self._claims_of(namespace, pod)
        group = None
        group_name = podgroup_name_of(pod)
        if self.podgroups is not None and group_name is not None:
            group = GroupView(group_name, self.cache.podgroup(namespace, group_name))
        if not plan.pod_needs_work(pod, claims, owned, group):
            return False
        self.enqueue_pod(namespace, name)
        return True

    def _claims_of(self, namespace: str, pod: Body) -> tuple[list[Body], dict[str, Body]]:
        """The claims the pod controls (cached or just created), and those by name that planning reads."""
        owned = self._owned_claims(namespace, pod["metadata"].get("uid", ""))
        claims = {c["metadata"]["name"]: c for c in owned}
        for resolved in resolve_claim_names(pod):
            if resolved.claim_name and resolved.claim_name not in claims:
                claim = self.cache.claim(namespace, resolved.claim_name)
                if claim is not None:
                    claims[resolved.claim_name] = claim
        return owned, claims

    async def reconcile(self, key: Hashable) -> None:
        namespace, name = cast(tuple[str, str], key)
        pod = self.cache.pod(namespace, name)
        if pod is None:
            return
        uid = pod["metadata"].get("uid", "")
        owned, claims = self._claims_of(namespace, pod)
        templates = cached_templates(self.cache, namespace, pod["spec"].get("resourceClaims") or [])

        pod_plan = plan.plan_pod(pod, claims, owned, templates, group=await self._group_view(pod))
        if plan.recreates(pod, pod_plan):
            fresh = await self.kube.get_pod(namespace, name)
            if fresh is None or fresh["metadata"].get("uid") != uid or is_being_deleted(fresh):
                return  # gone (or going): its DELETED event has not reached the cache yet
        sources = await complete_templates(self.kube, namespace, templates, {c.template_name for c in pod_plan.create})
        failures: list[str] = []
        recorded = {r.pod_claim_name: r.claim_name for r in pod_plan.record}
        for create in pod_plan.create:
            template = sources[create.template_name]
            if template is None:
                failures.append(f"PodResourceClaim {create.pod_claim_name}: "
                                f"{generation.missing_template_message(create.template_name)}")
                continue
            try:
                created = await self._create(pod, create, template)
            except ApiError as exc:
                metrics.CLAIM_CREATIONS.labels("failure").inc()
                failures.append(f"PodResourceClaim {create.pod_claim_name}: create ResourceClaim: {exc.message}")
                continue
            recorded[create.pod_claim_name] = created["metadata"]["name"]
        if recorded:
            applied_at, applied, version = self._applied.get(uid, (0.0, {}, ""))
            entries = generation.status_entries(pod, recorded, applied)
            wanted = {e["name"]: e["resourceClaimName"] for e in entries}
            if plan.status_apply_due(wanted, applied, version, str(pod["metadata"].get("resourceVersion") or ""),
                                     time.monotonic() - applied_at, fresh=APPLIED_FRESH):
                try:
                    result = await self.kube.apply_pod_claim_statuses(namespace, name, entries)
                except ApiError as exc:
                    if exc.not_found:
                        # Gone: its DELETED event has not reached the cache yet, and the claims it controls go
                        # with it (garbage collector). Retrying would apply to nothing until the cache caught up.
                        log.info("pod %s/%s is gone; its claims are not recorded", namespace, name)
                        return
                    raise
                self._applied[uid] = (time.monotonic(), wanted, str(result["metadata"].get("resourceVersion") or ""))
                log.info("pod %s/%s: recorded claims %s", namespace, name,
                         ", ".join(f"{pcn}={claim}" for pcn, claim in sorted(recorded.items())))
        failures += [f"PodResourceClaim {p.pod_claim_name}: {p.message}" for p in pod_plan.problems]
        for reserve in pod_plan.reserve:
            await self._reserve(pod, reserve.claim_name, reserve.consumer)
        if plan.duplicate_claims(pod, owned):
            await self._delete_duplicates(namespace, name, owned, set(recorded.values()))
        if failures:
            for message in failures:
                await warn_failed_creation(self.kube, pod, message, kind="pod")
            raise ClaimRetry("; ".join(failures))

    async def _group_view(self, pod: Body) -> GroupView | None:
        name = podgroup_name_of(pod)
        if self.podgroups is None or name is None:
            return None
        namespace = pod["metadata"]["namespace"]
        podgroup = self.cache.podgroup(namespace, name)
        if podgroup is None:
            # Not in the cache: confirm before telling the user it is missing (it may be too new, or
            # the PodGroup watch still listing at start-up).
            podgroup = await self.kube.get_podgroup(self.podgroups.version, namespace, name)
        if podgroup is None:
            return GroupView(name, None)
        owned = self.podgroups.owned_claims(namespace, podgroup["metadata"].get("uid", ""))
        return GroupView(name, podgroup, tuple(owned))

    def _owned_claims(self, namespace: str, pod_uid: str) -> list[Body]:
        return with_recent(self.cache.claims_owned_by(namespace, pod_uid), self._recent, pod_uid)

    async def _create(self, pod: Body, create: plan.CreateClaim, template: Body) -> Body:
        namespace = pod["metadata"]["namespace"]
        body = plan.build_claim(pod, create.pod_claim_name, template)
        created = await self.kube.create_claim(namespace, body)
        metrics.CLAIM_CREATIONS.labels("success").inc()
        name = created["metadata"]["name"]
        remember_created(self._recent, pod["metadata"]["uid"], created)
        log.info("pod %s/%s: created ResourceClaim %s from template %s for pod claim %s", namespace,
                 pod["metadata"]["name"], name, create.template_name,
                 created["metadata"].get("annotations", {}).get(POD_CLAIM_NAME_ANNOTATION))
        return created

    async def _reserve(self, pod: Body, claim_name: str, consumer: dict[str, str] | None = None) -> None:
        """Reserve an allocated claim for a pod that was bound without the scheduler (fresh read first),
        or for its PodGroup (`consumer`) when the pod shares the claim through the group."""
        namespace, uid = pod["metadata"]["namespace"], pod["metadata"]["uid"]
        claim = await self.kube.get_claim(namespace, claim_name)
        if claim is None or not is_allocated(claim) or is_being_deleted(claim) or is_reserved_for(claim, uid):
            return
        if consumer is not None and is_reserved_for_group_of(claim, pod):
            return
        reserved = (claim.get("status") or {}).get("reservedFor") or []
        if len(reserved) >= RESERVED_FOR_MAX:
            return
        entry: dict[str, str] = consumer or {"resource": "pods", "name": pod["metadata"]["name"], "uid": uid}
        ops: list[dict[str, Any]] = [{"op": "test", "path": "/metadata/resourceVersion",
                                      "value": claim["metadata"]["resourceVersion"]}]
        ops.append({"op": "add", "path": "/status/reservedFor/-", "value": entry} if reserved else
                   {"op": "add", "path": "/status/reservedFor", "value": [entry]})
        await self.kube.patch_claim_status(namespace, claim_name, ops)
        metrics.RESERVATIONS_ADDED.inc()
        log.info("claim %s/%s: reserved for pre-bound pod %s%s", namespace, claim_name, pod["metadata"]["name"],
                 f" (its PodGroup {entry['name']})" if consumer else "")

    async def _delete_duplicates(self, namespace: str, name: str, owned: list[Body], keep: set[str]) -> None:
        """Second claims for one pod claim (another controller raced us) are removed while unused.

        Decided again on a fresh read of the pod, whose status says which claim won.
        """
        pod = await self.kube.get_pod(namespace, name)
        if pod is None:
            return
        uids = {c["metadata"]["name"]: c["metadata"].get("uid") for c in owned}
        for duplicate in plan.duplicate_claims(pod, owned):
            fresh = await self.kube.get_claim(namespace, duplicate)
            # Only ever the very claim planned on, and only if it is still a generated claim of this pod.
            if duplicate in keep or fresh is None or fresh["metadata"].get("uid") != uids.get(duplicate) \
                    or plan.duplicate_claims(pod, [fresh]) != [duplicate]:
                continue
            # The resourceVersion precondition makes the delete fail if the scheduler took it meanwhile.
            try:
                await self.kube.delete_claim(namespace, duplicate, fresh["metadata"]["uid"],
                                             fresh["metadata"]["resourceVersion"])
            except ApiError as exc:
                if exc.conflict:
                    continue
                raise
            log.info("claim %s/%s: deleted as a duplicate; pod %s uses another claim", namespace, duplicate, name)
