"""A pod, and the ResourceClaims it names: resolved from spec.resourceClaims, its status and its
extended-resource claim.

A pod event is resolved here once (`pod_view`): the plain body is copied once and its claim names
resolved once, and every controller that wants the event is handed that one `PodView`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .meta import is_being_deleted, metadata, spec, status

TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})


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
    """The pod's (or its PodGroup's: the same field) status.resourceClaimStatuses keyed by pod claim name."""
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


@dataclass(frozen=True)
class PodView:
    """One event of a pod that uses claims, resolved once for every controller that wants it."""

    namespace: str
    name: str
    uid: str
    claim_names: tuple[str, ...]  # `pod_claim_names`: the claims it uses that are known by name
    body: dict[str, Any]  # the plain body, copied once; not to be changed
    deleted: bool = False

    @property
    def lists_claims(self) -> bool:
        """True when `spec.resourceClaims` names claims (an extended-resource claim alone does not)."""
        return bool(spec(self.body).get("resourceClaims"))


def pod_view(namespace: str | None, name: str, body: Mapping[str, Any], *, deleted: bool = False) -> PodView | None:
    """The event's view, or None when the pod uses no claims: then no controller has anything to do."""
    plain = dict(body)
    if not has_claims(plain):
        return None
    return PodView(namespace=namespace or "", name=name, uid=pod_uid(plain),
                   claim_names=tuple(pod_claim_names(plain)), body=plain, deleted=deleted)
