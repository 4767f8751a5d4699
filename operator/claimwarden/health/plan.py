"""What the health controller should do for one UnhealthyDevice record: pure decisions, no I/O.

Which pods to evict (and when), which claims hold the device, and the bodies of the objects that
keep new work away from it: the quarantine ResourceClaim and, where served, a DeviceTaintRule.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Iterable, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from claimwarden.health.groups import GroupMembers, group_pods
from claimwarden.health.records import (
    DRAIN_ALLOW_COMPLETION,
    DRAIN_EVICT_AFTER,
    NAME_MAX,
    RECORD_LABEL,
    TAINT_KEY,
    TAINT_VALUE,
    DeviceRef,
    label_value,
    record_drain,
    record_effect,
    record_name,
    record_ref,
    truncate_name,
)
from claimwarden.health.tolerations import NO_EXECUTE, allocation_results, claim_eviction_time, names_device
from claimwarden.objects.claims import is_allocated, is_controlled_by_pod, is_pod_reservation, reserved_for
from claimwarden.objects.meta import is_being_deleted, metadata, spec, status
from claimwarden.objects.pods import TERMINAL_PHASES, extended_resource_claim_name, pod_uid, resolve_claim_names

NO_SCHEDULE = "NoSchedule"
QUARANTINE_EFFECTS = frozenset({NO_EXECUTE, NO_SCHEDULE})
QUARANTINE_REQUEST = "quarantine"
QUARANTINE_DEVICE_CLASS = "claimwarden.io-quarantine"
QUARANTINE_GENERATE_NAME_PREFIX_MAX = 50
DEVICE_ANNOTATION = "claimwarden.io/device"
NODE_ANNOTATION = "claimwarden.io/node"
RULE_NAME_PREFIX = "claimwarden-"
RESOURCE_API_VERSION = "resource.k8s.io/v1"
PREVIEW_NAMES_MAX = 50


@dataclass(frozen=True)
class Eviction:
    """One pod to evict, because of `claim`, at `due` (or as soon as possible after it)."""

    namespace: str
    pod: str
    uid: str
    claim: str
    due: datetime


@dataclass(frozen=True)
class RecordPlan:
    """Everything the health controller should do about one record's device."""

    evict: tuple[Eviction, ...] = ()
    """Pods to evict (effect NoExecute only, not with drain AllowCompletion), sorted by (namespace, pod)."""
    pending: int = 0
    """Pods a NoExecute record still has to get off the device: to evict, or waiting to complete."""
    drain_deadline: datetime | None = None
    """Drain EvictAfter: until when the pods may finish by themselves."""
    would_evict: int = 0
    """Pods that would be evicted if the effect were NoExecute (filled for every effect)."""
    would_evict_names: tuple[str, ...] = ()
    """Those pods as sorted "namespace/name" (all of them; the status shows the first PREVIEW_NAMES_MAX)."""
    tolerated: int = 0
    """Pods using the device whose claims tolerate the taint forever."""
    admin_access: tuple[str, ...] = ()
    """Pods that use the device only through admin-access allocation results (``uses_device``), as sorted
    "namespace/name": never evicted, whatever the effect."""
    holders: tuple[str, ...] = ()
    """The non-quarantine claims allocated the device, as sorted "namespace/name" (admin access included)."""
    exclusive_holders: tuple[str, ...] = ()
    """Those of them that kube-scheduler counts as allocating the device (``keeps_device_allocated``)."""
    quarantine_needed: bool = False
    """Effect NoExecute or NoSchedule: park the device with a quarantine claim."""


class QuarantineStep(enum.Enum):
    """What to do with a record's quarantine claims (the quarantine trap's rules, health/__init__.py)."""

    RELEASE = "release"  # not needed (any more): free the device (rule 3)
    WAIT = "wait"  # other claims hold the device: the scheduler counts it as allocated anyway
    KEEP = "keep"  # one claim holds it and nobody let go since: keep it (allocating it if a crash left it bare)
    ASSERT = "assert"  # none yet with the device free, several, or a holder let go: make a new one (rule 1)


def quarantine_step(*, needed: bool, claims: int, held: bool, released: bool) -> QuarantineStep:
    """`claims`: the record's quarantine claims; `held`: other claims hold the device now; `released`: a
    holder let go of it since the last reconcile, so the scheduler has forgotten the device (rule 1).

    A quarantine claim made while other claims hold the device would protect nothing (rule 1 again:
    the scheduler forgets the device the moment they let go, whatever else holds it), so it is made
    when they let go; only then, or when the device is free at marking time, is one needed.
    """
    if not needed:
        return QuarantineStep.RELEASE
    if not released:
        if claims == 1:
            return QuarantineStep.KEEP
        if claims == 0 and held:
            return QuarantineStep.WAIT
    return QuarantineStep.ASSERT


def scheduler_retries_on_claim_deletion(server_version: str) -> bool:
    """True when kube-scheduler retries pending pods on the deletion of an allocated claim, as it does on a
    deallocation: from 1.37 (its DRA plugin registers claim deletions; 1.34 to 1.36 register only additions
    and updates). The scheduler cannot be asked, so the server's version (`/version`'s gitVersion, like
    "v1.37.2") stands for it, as the control plane's components ship together; an unreadable version counts as
    new. Where it does, deleting a claim with its allocation (rule 2) no longer wakes nobody (rule 4)."""
    match = re.match(r"^v?(\d+)\.(\d+)", server_version.strip())
    if match is None:
        return True
    return (int(match.group(1)), int(match.group(2))) >= (1, 37)


# --- taints -------------------------------------------------------------------------------------

def taint_for(record: dict[str, Any]) -> dict[str, Any]:
    """The taint that a record puts on its device, with the record's effect."""
    return {"key": TAINT_KEY, "value": TAINT_VALUE, "effect": record_effect(record)}


def simulated_taint(record: dict[str, Any]) -> dict[str, Any]:
    """The record's taint with effect NoExecute: what eviction decisions (and dry runs) are made with."""
    return {**taint_for(record), "effect": NO_EXECUTE}


# --- claims and pods ----------------------------------------------------------------------------

def is_quarantine_claim(claim: dict[str, Any], namespace: str) -> bool:
    """True for a quarantine claim of claimwarden's: in its own `namespace` and carrying RECORD_LABEL.

    The label alone proves nothing: users set labels on their own claims and templates (generated
    claims copy the template's), and a claim counted as quarantine never has its pods evicted.
    """
    meta = metadata(claim)
    return meta.get("namespace") == namespace and RECORD_LABEL in (meta.get("labels") or {})


def holds_device(claim: dict[str, Any], ref: DeviceRef) -> bool:
    """True when the claim is allocated and one of its allocation results is the device."""
    return is_allocated(claim) and any(names_device(result, ref) for result in allocation_results(claim))


def uses_device(claim: dict[str, Any], ref: DeviceRef) -> bool:
    """True when the claim is allocated the device by a result without admin access.

    An admin-access result (`adminAccess: true`, allowed only in namespaces labelled
    `resource.kubernetes.io/admin-access: "true"`) gives a diagnostics pod a device that others may be
    using; kube-scheduler does not count it as allocated. Such a pod is the one that looks at or repairs
    a broken device, so claimwarden never evicts it for that device (docs/concepts/device-health.md "Admin access").
    """
    return is_allocated(claim) and any(names_device(result, ref) and not result.get("adminAccess")
                                       for result in allocation_results(claim))


def keeps_device_allocated(claim: dict[str, Any], ref: DeviceRef) -> bool:
    """True when kube-scheduler counts the claim as allocating the device: a result for it without admin
    access and without a shareID (admin-access results are not counted, and shared consumable-capacity
    results are counted apart). Only such a claim keeps new work off the device by holding it.
    """
    return is_allocated(claim) and any(names_device(result, ref) and not result.get("adminAccess")
                                       and not result.get("shareID") for result in allocation_results(claim))


def claim_key(claim: dict[str, Any]) -> str:
    """The claim's "namespace/name"."""
    meta = metadata(claim)
    return f"{meta.get('namespace') or ''}/{meta.get('name') or ''}"


def device_holders(claims: Iterable[dict[str, Any]], ref: DeviceRef, namespace: str) -> list[dict[str, Any]]:
    """The claims allocated the device, except quarantine claims in claimwarden's `namespace`."""
    return [claim for claim in claims if not is_quarantine_claim(claim, namespace) and holds_device(claim, ref)]


def pod_uses_claim(pod: dict[str, Any], claim: dict[str, Any]) -> bool:
    """True when one of the pod's spec.resourceClaims resolves to this claim, or it is the pod's
    extended-resource claim (status.extendedResourceClaimStatus, 1.36+).

    A claim generated from a template, like an extended-resource claim, must also be controlled by
    the pod, as upstream requires.
    """
    name = metadata(claim).get("name")
    if name and extended_resource_claim_name(pod) == name and is_controlled_by_pod(claim, pod_uid(pod)):
        return True
    for resolved in resolve_claim_names(pod):
        if resolved.claim_name != name:
            continue
        if not resolved.from_template or is_controlled_by_pod(claim, pod_uid(pod)):
            return True
    return False


def is_evictable(pod: dict[str, Any] | None, uid: str) -> bool:
    """True for an existing pod with this UID that is scheduled, still running and not being deleted.

    A pod being deleted is already on its way out (perhaps evicted by an earlier run), so it is
    never evicted twice. A pod in a terminal phase no longer uses the device.
    """
    if pod is None or not uid or pod_uid(pod) != uid:
        return False
    if not spec(pod).get("nodeName") or is_being_deleted(pod):
        return False
    return status(pod).get("phase") not in TERMINAL_PHASES


def affected_pods(
    claim: dict[str, Any], pods: Mapping[tuple[str, str], dict[str, Any]], evicted: AbstractSet[str] = frozenset(),
    podgroup_members: GroupMembers | None = None,
) -> list[tuple[str, str, str]]:
    """(namespace, name, uid) of the evictable pods the claim is reserved for and that use it; pods whose
    UID is in `evicted` are already on their way out, like pods being deleted.

    With `podgroup_members`, a PodGroup entry of reservedFor stands for the group's pods (groups.py).
    """
    namespace = str(metadata(claim).get("namespace") or "")
    found = []
    for entry in reserved_for(claim):
        if not is_pod_reservation(entry):
            continue
        name, uid = str(entry.get("name") or ""), str(entry.get("uid") or "")
        pod = pods.get((namespace, name))
        if pod is not None and uid not in evicted and is_evictable(pod, uid) and pod_uses_claim(pod, claim):
            found.append((namespace, name, uid))
    if podgroup_members is not None:
        seen = set(found)
        found.extend(member for member in podgroup_evictable(claim, pods, podgroup_members)
                     if member not in seen and member[2] not in evicted)
    return found


def podgroup_evictable(
    claim: dict[str, Any], pods: Mapping[tuple[str, str], dict[str, Any]], podgroup_members: GroupMembers
) -> list[tuple[str, str, str]]:
    """(namespace, name, uid) of the evictable pods that hold the claim through its PodGroup entry."""
    return [(str(metadata(pod).get("namespace") or ""), str(metadata(pod).get("name") or ""), pod_uid(pod))
            for pod in group_pods(claim, pods, podgroup_members) if is_evictable(pod, pod_uid(pod))]


# --- the plan -----------------------------------------------------------------------------------

def plan_record(
    record: dict[str, Any],
    claims: Iterable[dict[str, Any]],
    pods: Mapping[tuple[str, str], dict[str, Any]],
    marked_at: datetime,
    namespace: str,
    *,
    server_copies_tolerations: bool = False,
    evicted: AbstractSet[str] = frozenset(),
    podgroup_members: GroupMembers | None = None,
) -> RecordPlan:
    """Decide which pods the record evicts and when, and whether its device needs a quarantine claim.

    `claims` need only hold those allocated the device (others are ignored); `namespace` is
    claimwarden's own, where its quarantine claims live. `server_copies_tolerations`: the server's
    allocator copies tolerations into allocation results (tolerations.result_tolerations). `evicted`:
    UIDs of pods evicted already, whose deletion the cached `pods` may not show yet (they are neither
    evicted again nor pending). `podgroup_members` finds the pods of a PodGroup a claim is reserved
    for (None: only pod entries of reservedFor count).

    Due times count from `marked_at` (the record's status.markedAt) plus the smallest matching
    tolerationSeconds. A pod using several claims that hold the device is evicted once, at the
    earliest of their times.
    """
    ref = record_ref(record)
    if ref is None:
        return RecordPlan()
    effect = record_effect(record)
    taint = simulated_taint(record)
    holders = device_holders(claims, ref, namespace)
    earliest: dict[tuple[str, str, str], Eviction] = {}
    using: set[tuple[str, str, str]] = set()
    admin: set[tuple[str, str, str]] = set()
    for claim in sorted(holders, key=claim_key):
        if not uses_device(claim, ref):
            admin.update(affected_pods(claim, pods, evicted, podgroup_members))
            continue
        due = claim_eviction_time(claim, ref, taint, marked_at, server_copies=server_copies_tolerations)
        for pod in affected_pods(claim, pods, evicted, podgroup_members):
            using.add(pod)
            if due is None:
                continue
            current = earliest.get(pod)
            if current is None or due < current.due:
                earliest[pod] = Eviction(pod[0], pod[1], pod[2], str(metadata(claim).get("name") or ""), due)
    evict = sorted(earliest.values(), key=lambda e: (e.namespace, e.pod)) if effect == NO_EXECUTE else []
    # Drain modes (docs/concepts/safety.md "Drain modes"): AllowCompletion evicts nobody, EvictAfter not before
    # its deadline.
    drain = record_drain(record)
    deadline = marked_at + drain.after if drain.mode == DRAIN_EVICT_AFTER and drain.after is not None else None
    if drain.mode == DRAIN_ALLOW_COMPLETION:
        evict = []
    elif deadline is not None:
        evict = [replace(e, due=max(e.due, deadline)) for e in evict]
    return RecordPlan(
        evict=tuple(evict),
        pending=len(earliest) if effect == NO_EXECUTE else 0,
        drain_deadline=deadline if effect == NO_EXECUTE else None,
        would_evict=len(earliest),
        would_evict_names=tuple(sorted(f"{pod[0]}/{pod[1]}" for pod in earliest)),
        tolerated=len(using - earliest.keys()),
        admin_access=tuple(sorted(f"{pod[0]}/{pod[1]}" for pod in admin - using)),
        holders=tuple(sorted(claim_key(claim) for claim in holders)),
        exclusive_holders=tuple(sorted(claim_key(claim) for claim in holders if keeps_device_allocated(claim, ref))),
        quarantine_needed=effect in QUARANTINE_EFFECTS,
    )


# --- bodies -------------------------------------------------------------------------------------

def _record_name(record: dict[str, Any]) -> str:
    return str(metadata(record).get("name") or "")


def device_label(ref: DeviceRef) -> str:
    """The RECORD_LABEL value of the device's quarantine claims: the label value of the device's annotation
    record name (``records.record_name``), whichever record asked for the quarantine.

    A device has one quarantine claim, however many records mark it (an annotation record and an admin's,
    say): a claim per record broke the quarantine when one record was cleared (health/__init__.py, "one
    claim per device"). An annotation record's name is this name, so its claims carry the same label as
    before.
    """
    return label_value(record_name(ref))


def quarantine_claim_body(ref: DeviceRef, namespace: str, node_name: str | None) -> dict[str, Any]:
    """The quarantine ResourceClaim that parks the device (its allocation is written after).

    Deliberately not owned by a record: the garbage collector would delete it, and the scheduler
    does not look at pending pods again when a claim is deleted (up to 1.36). claimwarden deallocates
    it first (which wakes pending pods) and then deletes it. The device and node are repeated in
    annotations for people reading `kubectl get resourceclaims -o yaml`.
    """
    annotations = {DEVICE_ANNOTATION: str(ref)}
    if node_name:
        annotations[NODE_ANNOTATION] = node_name
    return {
        "apiVersion": RESOURCE_API_VERSION,
        "kind": "ResourceClaim",
        "metadata": {
            "generateName": f"{truncate_name(record_name(ref), QUARANTINE_GENERATE_NAME_PREFIX_MAX)}-",
            "namespace": namespace,
            "labels": {RECORD_LABEL: device_label(ref)},
            "annotations": annotations,
        },
        "spec": {"devices": {"requests": [{
            "name": QUARANTINE_REQUEST,
            "exactly": {"deviceClassName": QUARANTINE_DEVICE_CLASS, "allocationMode": "ExactCount", "count": 1},
        }]}},
    }


def quarantine_allocation(ref: DeviceRef, node_name: str | None) -> dict[str, Any]:
    """The status.allocation of a quarantine claim: exactly the device, on its node when known."""
    allocation: dict[str, Any] = {"devices": {"results": [{
        "request": QUARANTINE_REQUEST, "driver": ref.driver, "pool": ref.pool, "device": ref.device,
    }]}}
    if node_name:
        allocation["nodeSelector"] = {"nodeSelectorTerms": [{"matchFields": [
            {"key": "metadata.name", "operator": "In", "values": [node_name]},
        ]}]}
    return allocation


def device_taint_rule_name(record: dict[str, Any]) -> str:
    """The name of the DeviceTaintRule kept in step with the record."""
    return truncate_name(f"{RULE_NAME_PREFIX}{_record_name(record)}", NAME_MAX)


def device_taint_rule_body(record: dict[str, Any], api_version: str) -> dict[str, Any]:
    """The DeviceTaintRule that shows the record's device as tainted to taint-aware tools.

    Always NoSchedule, whatever the record's effect: a NoExecute rule would make upstream's
    device-taint eviction controller delete the pods itself, with plain DELETEs that ignore
    PodDisruptionBudgets. Eviction stays claimwarden's, through the Eviction API.
    """
    ref = record_ref(record)
    selector = {"driver": ref.driver, "pool": ref.pool, "device": ref.device} if ref else {}
    return {
        "apiVersion": api_version,
        "kind": "DeviceTaintRule",
        "metadata": {"name": device_taint_rule_name(record),
                     "labels": {RECORD_LABEL: label_value(_record_name(record))}},
        "spec": {
            "deviceSelector": selector,
            "taint": {"key": TAINT_KEY, "value": TAINT_VALUE, "effect": NO_SCHEDULE},
        },
    }


# --- slices -------------------------------------------------------------------------------------

def slice_node(slices: Iterable[dict[str, Any]], ref: DeviceRef) -> str | None:
    """The node of the device: from the newest-generation slice of its pool that lists it.

    The device's own nodeName (per-device node selection) wins over the slice's spec.nodeName.
    None when no slice lists the device or it is not tied to one node.
    """
    best: tuple[int, str] | None = None
    node: str | None = None
    for slice_ in slices:
        body = spec(slice_)
        pool = body.get("pool") or {}
        if body.get("driver") != ref.driver or pool.get("name") != ref.pool:
            continue
        device = next((d for d in body.get("devices") or [] if d.get("name") == ref.device), None)
        if device is None:
            continue
        rank = (int(pool.get("generation") or 0), str(metadata(slice_).get("name") or ""))
        if best is None or rank > best:
            best, node = rank, device.get("nodeName") or body.get("nodeName") or None
    return str(node) if node else None
