"""A ResourceClaim: who controls it, who it is reserved for, what it was allocated, and its name.

A claim event is resolved here once (`claim_view`): its plain body is copied once and handed to
every controller that wants the event.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .meta import metadata, status

POD_CLAIM_NAME_ANNOTATION = "resource.kubernetes.io/pod-claim-name"
EXTENDED_RESOURCE_CLAIM_ANNOTATION = "resource.kubernetes.io/extended-resource-claim"
DELETE_PROTECTION_FINALIZER = "resource.kubernetes.io/delete-protection"
RESERVED_FOR_MAX = 256

GENERATE_NAME_MAX = 57
"""Upstream's limit for a claim's generateName, trailing hyphen included."""

DeviceKey = tuple[str, str, str]
"""(driver, pool, device): one device, as allocation results name it."""


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


@dataclass(frozen=True)
class ClaimView:
    """One claim event, resolved once for every controller that wants it."""

    namespace: str
    name: str
    body: dict[str, Any]  # the plain body, copied once; not to be changed
    deleted: bool = False


def claim_view(namespace: str | None, name: str, body: Mapping[str, Any], *, deleted: bool = False) -> ClaimView:
    return ClaimView(namespace=namespace or "", name=name, body=dict(body), deleted=deleted)
