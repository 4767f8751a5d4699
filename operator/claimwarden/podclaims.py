"""Pure helpers about pods and their ResourceClaims, shared by the claims and reservations plans.

Every function takes plain dicts in the raw Kubernetes JSON shape (camelCase keys) and tolerates
missing keys: a pod without status, a claim without metadata, and so on.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

POD_CLAIM_NAME_ANNOTATION = "resource.kubernetes.io/pod-claim-name"
EXTENDED_RESOURCE_CLAIM_ANNOTATION = "resource.kubernetes.io/extended-resource-claim"
DELETE_PROTECTION_FINALIZER = "resource.kubernetes.io/delete-protection"
RESERVED_FOR_MAX = 256

GENERATE_NAME_MAX = 57
"""Upstream's limit for a claim's generateName, trailing hyphen included."""

TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})

DeviceKey = tuple[str, str, str]
"""(driver, pool, device): one device, as allocation results name it."""


# --- generic object accessors -------------------------------------------------------------------

def metadata(obj: dict[str, Any] | None) -> dict[str, Any]:
    """The object's metadata, or an empty dict."""
    return (obj or {}).get("metadata") or {}


def spec(obj: dict[str, Any] | None) -> dict[str, Any]:
    """The object's spec, or an empty dict."""
    return (obj or {}).get("spec") or {}


def status(obj: dict[str, Any] | None) -> dict[str, Any]:
    """The object's status, or an empty dict."""
    return (obj or {}).get("status") or {}


def is_being_deleted(obj: dict[str, Any] | None) -> bool:
    """True when the object has a deletionTimestamp."""
    return bool(metadata(obj).get("deletionTimestamp"))


def has_finalizer(obj: dict[str, Any] | None, finalizer: str) -> bool:
    """True when the object's metadata.finalizers lists `finalizer`."""
    return finalizer in (metadata(obj).get("finalizers") or [])


# --- names --------------------------------------------------------------------------------------

def generate_name(pod_name: str, pod_claim_name: str) -> str:
    """The generateName of a claim made for `pod_claim_name` of pod `pod_name`.

    `<pod>-<claim>-` when that fits in 57 characters; otherwise both parts shrink in proportion to
    their share of the untruncated length and are joined by one hyphen, without a trailing one.
    """
    full = f"{pod_name}-{pod_claim_name}-"
    if len(full) <= GENERATE_NAME_MAX:
        return full
    pod_part = pod_name[: len(pod_name) * GENERATE_NAME_MAX // len(full)]
    claim_part = pod_claim_name[: len(pod_claim_name) * GENERATE_NAME_MAX // len(full)]
    return f"{pod_part}-{claim_part}"


# --- pods ---------------------------------------------------------------------------------------

def pod_uid(pod: dict[str, Any] | None) -> str:
    """The pod's UID, or "" when unknown."""
    return str(metadata(pod).get("uid") or "")


def is_pod_done(pod: dict[str, Any]) -> bool:
    """True when the pod no longer needs its claims.

    That is a terminal phase (Succeeded or Failed), or a deletionTimestamp on a pod that was never
    scheduled. A scheduled pod that is terminating still needs them until it is really gone.
    """
    if status(pod).get("phase") in TERMINAL_PHASES:
        return True
    return is_being_deleted(pod) and not spec(pod).get("nodeName")


@dataclass(frozen=True)
class ResolvedClaim:
    """One `spec.resourceClaims` entry of a pod, resolved to the claim it uses.

    `claim_name` is None when the claim is not known: a template claim not generated yet
    (`needed` True) or one the pod deliberately runs without (`needed` False).
    """

    pod_claim_name: str
    claim_name: str | None
    from_template: bool
    needed: bool


def extended_resource_claim_name(pod: dict[str, Any]) -> str | None:
    """The claim the scheduler made for the pod's DRA-backed extended resources, or None.

    Kubernetes 1.36+ (`DRAExtendedResource`): a pod asking for an extended resource that a
    DeviceClass maps (`spec.extendedResourceName`) gets one special claim, created by the scheduler
    in PreBind, controlled by the pod, annotated `resource.kubernetes.io/extended-resource-claim:
    "true"`, and named in `status.extendedResourceClaimStatus.resourceClaimName`. It is not in
    `spec.resourceClaims`.
    """
    name = (status(pod).get("extendedResourceClaimStatus") or {}).get("resourceClaimName")
    return str(name) if name else None


def has_claims(pod: dict[str, Any] | None) -> bool:
    """True when the pod uses ResourceClaims: in `spec.resourceClaims` or an extended-resource claim."""
    return bool(spec(pod).get("resourceClaims")) or extended_resource_claim_name(pod or {}) is not None


def pod_claim_names(pod: dict[str, Any]) -> list[str]:
    """Every claim the pod uses that is known by name: resolved `spec.resourceClaims` entries, then
    the extended-resource claim (upstream's `resourceclaim.PodClaims`)."""
    names = [r.claim_name for r in resolve_claim_names(pod) if r.claim_name]
    extended = extended_resource_claim_name(pod)
    if extended and extended not in names:
        names.append(extended)
    return names


def claim_statuses(pod: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The pod's status.resourceClaimStatuses keyed by pod claim name."""
    entries = status(pod).get("resourceClaimStatuses") or []
    return {entry["name"]: entry for entry in entries if entry.get("name")}


def resolve_claim_names(pod: dict[str, Any]) -> list[ResolvedClaim]:
    """Resolve every `spec.resourceClaims` entry of the pod, in order.

    An entry naming neither a claim nor a template (an API this code does not know) resolves to
    "not needed", so nobody acts on it.
    """
    recorded = claim_statuses(pod)
    return [_resolve_one(entry, recorded) for entry in spec(pod).get("resourceClaims") or []]


def _resolve_one(entry: dict[str, Any], recorded: dict[str, dict[str, Any]]) -> ResolvedClaim:
    name = str(entry.get("name") or "")
    if entry.get("resourceClaimName"):
        return ResolvedClaim(name, str(entry["resourceClaimName"]), from_template=False, needed=True)
    if not entry.get("resourceClaimTemplateName"):
        return ResolvedClaim(name, None, from_template=False, needed=False)
    if name not in recorded:
        return ResolvedClaim(name, None, from_template=True, needed=True)
    claim_name = recorded[name].get("resourceClaimName")
    if not claim_name:
        return ResolvedClaim(name, None, from_template=True, needed=False)
    return ResolvedClaim(name, str(claim_name), from_template=True, needed=True)


# --- claims -------------------------------------------------------------------------------------

def controlling_pod_ref(claim: dict[str, Any]) -> dict[str, Any] | None:
    """The claim's controller ownerReference when it is a v1 Pod, else None."""
    for ref in metadata(claim).get("ownerReferences") or []:
        if ref.get("controller") is True and ref.get("apiVersion") == "v1" and ref.get("kind") == "Pod":
            return dict(ref)
    return None


def controlling_pod_uid(claim: dict[str, Any]) -> str | None:
    """UID of the pod that controls the claim (controller ownerReference, v1 Pod), else None."""
    ref = controlling_pod_ref(claim)
    return str(ref.get("uid") or "") or None if ref else None


def is_controlled_by_pod(claim: dict[str, Any], uid: str) -> bool:
    """True when the claim's controlling owner is the pod with this UID."""
    return bool(uid) and controlling_pod_uid(claim) == uid


def is_extended_resource_claim(claim: dict[str, Any]) -> bool:
    """True for a claim the scheduler made for a pod's extended resources (by its annotation)."""
    return (metadata(claim).get("annotations") or {}).get(EXTENDED_RESOURCE_CLAIM_ANNOTATION) == "true"


def is_generated_claim(claim: dict[str, Any]) -> bool:
    """True for a claim made for one pod by a controller: from a template (the pod-claim-name
    annotation) or by the scheduler for extended resources. Only these are deleted when their pod is done."""
    return bool(pod_claim_name_of(claim)) or is_extended_resource_claim(claim)


def pod_claim_name_of(claim: dict[str, Any]) -> str:
    """The pod claim name a generated claim was made for (its annotation), or ""."""
    return str((metadata(claim).get("annotations") or {}).get(POD_CLAIM_NAME_ANNOTATION) or "")


def reserved_for(claim: dict[str, Any]) -> list[dict[str, Any]]:
    """The claim's status.reservedFor entries."""
    return list(status(claim).get("reservedFor") or [])


def is_pod_reservation(entry: dict[str, Any]) -> bool:
    """True for a reservedFor entry that names a core pod."""
    return (entry.get("apiGroup") or "") == "" and entry.get("resource") == "pods"


def is_reserved_for(claim: dict[str, Any], pod_uid: str) -> bool:
    """True when status.reservedFor has an entry with this pod's UID."""
    return any(entry.get("uid") == pod_uid for entry in reserved_for(claim))


def is_allocated(claim: dict[str, Any]) -> bool:
    """True when the claim has a status.allocation."""
    return status(claim).get("allocation") is not None


def allocated_devices(claim: dict[str, Any]) -> list[DeviceKey]:
    """The (driver, pool, device) of each of the claim's allocation results."""
    allocation = status(claim).get("allocation") or {}
    return [(str(r.get("driver") or ""), str(r.get("pool") or ""), str(r.get("device") or ""))
            for r in (allocation.get("devices") or {}).get("results") or []]


def used_devices(claim: dict[str, Any]) -> list[DeviceKey]:
    """The (driver, pool, device) of the claim's allocation results without admin access: the devices its
    pods use as their own (an admin-access result shares a device with its users, for diagnostics)."""
    allocation = status(claim).get("allocation") or {}
    return [(str(r.get("driver") or ""), str(r.get("pool") or ""), str(r.get("device") or ""))
            for r in (allocation.get("devices") or {}).get("results") or [] if not r.get("adminAccess")]


def claim_source(claim: dict[str, Any]) -> str:
    """Where the claim came from: "extended_resource", "resource_claim_template" or "user"."""
    annotations = metadata(claim).get("annotations") or {}
    if annotations.get(EXTENDED_RESOURCE_CLAIM_ANNOTATION) == "true":
        return "extended_resource"
    if annotations.get(POD_CLAIM_NAME_ANNOTATION):
        return "resource_claim_template"
    return "user"
