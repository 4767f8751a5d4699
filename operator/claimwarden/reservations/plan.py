"""What the reservations controller should do for one claim: pure decisions, no I/O.

Follows upstream's resourceclaim controller (claim sync), plus what upstream leaves undone:
reservations that are not pods are kept instead of stopping all work on the claim, and a claim
near the 256-entry reservedFor limit is flagged. Where the cluster serves PodGroups, a PodGroup
reservation is dropped once its PodGroup is gone or replaced (claims/podgroups.py), as upstream
1.36+ does; elsewhere it is kept.

A pod "view" is the little of a pod this needs: `{"uid", "phase", "nodeName", "deleting"}`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from claimwarden.claims.podgroups import is_podgroup_reservation, should_drop_group_reservation
from claimwarden.objects.claims import (
    DELETE_PROTECTION_FINALIZER,
    RESERVED_FOR_MAX,
    controlling_pod_uid,
    is_allocated,
    is_generated_claim,
    is_pod_reservation,
    reserved_for,
)
from claimwarden.objects.meta import has_finalizer, is_being_deleted, metadata, spec, status
from claimwarden.objects.pods import TERMINAL_PHASES

# A claim this full of reservations gets a Warning Event and counts as near the limit.
NEAR_LIMIT_RATIO = 0.9


@dataclass(frozen=True)
class ClaimPlan:
    """Everything the reservations controller should do for one claim."""

    drop: tuple[dict[str, Any], ...] = ()
    """reservedFor entries to remove."""
    keep: tuple[dict[str, Any], ...] = ()
    """reservedFor entries that stay."""
    deallocate: bool = False
    """Clear status.allocation (in the same status write as the drops)."""
    remove_finalizer: bool = False
    """Then remove the delete-protection finalizer."""
    delete_claim: bool = False
    """Then delete the claim (a generated claim whose pod is finished or replaced)."""
    unknown_pods: tuple[str, ...] = ()
    """Pods missing from the cache: confirm with a live GET, then plan again."""
    unknown_podgroups: tuple[str, ...] = ()
    """PodGroups missing from the cache: the same."""
    near_limit: bool = False
    """reservedFor is close to its 256-entry limit."""


def pod_view(pod: dict[str, Any] | None) -> dict[str, Any] | None:
    """The part of a pod that reservation decisions use; None for a pod that does not exist."""
    if pod is None:
        return None
    return {
        "uid": str(metadata(pod).get("uid") or ""),
        "phase": status(pod).get("phase") or None,
        "nodeName": spec(pod).get("nodeName") or None,
        "deleting": is_being_deleted(pod),
    }


def is_view_done(view: Mapping[str, Any]) -> bool:
    """True when the viewed pod no longer needs its claims (terminal, or deleted before scheduling)."""
    if view.get("phase") in TERMINAL_PHASES:
        return True
    return bool(view.get("deleting")) and not view.get("nodeName")


def pod_may_release(pod: dict[str, Any], *, deleted: bool) -> bool:
    """May this pod event change what `plan_claim` decides for the pod's claims? Asked before queueing
    them (in the spirit of upstream's ``podNeedsClaims``).

    A pod's part in the plan is its view (`pod_view`): a reservation or an owned claim is let go only
    when the pod is gone, replaced or done (`is_view_done`). A pod event can only bring that about
    when the pod is deleted, terminal, or being deleted (done if it was never scheduled; said yes
    for scheduled ones too, so a superset). A replacement under another UID arrives as the old
    pod's DELETED event. Everything else (a new reservation, the delete-protection finalizer, the
    limit warning) changes the claim, whose own events queue it.
    """
    return deleted or is_being_deleted(pod) or status(pod).get("phase") in TERMINAL_PHASES


def reserved_for_predecessor(claim: dict[str, Any] | None, pod_name: str, pod_uid: str) -> bool:
    """True when the claim is reserved for a pod of this name under another UID: a pod replaced while a
    watch was down, whose DELETED event never came (a re-listing watch delivers none). The new pod's
    events are then the only ones that tell the claim to let the old one go."""
    return claim is not None and any(
        is_pod_reservation(entry) and entry.get("name") == pod_name and entry.get("uid") != pod_uid
        for entry in reserved_for(claim))


def plan_claim(
    claim: dict[str, Any],
    pods: Mapping[str, dict[str, Any] | None],
    owner: dict[str, Any] | None,
    limit_ratio: float = NEAR_LIMIT_RATIO,
    podgroups: Mapping[str, dict[str, Any] | None] | None = None,
) -> ClaimPlan:
    """Decide which reservations of `claim` to drop and whether to deallocate, unprotect or delete it.

    `pods`: pod name → view (None = confirmed gone) for the claim's namespace; a reserved pod that
    is absent from it is unknown, and then nothing destructive is planned. `owner`: view of the
    claim's controlling pod when it has one and it is in the cache, else None. `podgroups`: PodGroup
    name → view (`podgroups.podgroup_view`, None = confirmed gone) where the cluster serves PodGroups,
    else None (PodGroup reservations are then kept); a reserved PodGroup absent from it is unknown too.
    """
    entries = reserved_for(claim)
    unknown = _unknown_pods(entries, pods)
    unknown_groups = _unknown_podgroups(entries, podgroups)
    if unknown or unknown_groups:
        return ClaimPlan(keep=tuple(entries), unknown_pods=unknown, unknown_podgroups=unknown_groups,
                         near_limit=is_near_limit(len(entries), limit_ratio))
    drop = [entry for entry in entries if _should_drop(entry, pods, podgroups)]
    keep = [entry for entry in entries if not _should_drop(entry, pods, podgroups)]
    deallocate, remove_finalizer = _release(claim, dropped=bool(drop), remaining=bool(keep))
    return ClaimPlan(
        drop=tuple(drop),
        keep=tuple(keep),
        deallocate=deallocate,
        remove_finalizer=remove_finalizer,
        delete_claim=not keep and _owner_is_finished(claim, owner),
        near_limit=is_near_limit(len(keep), limit_ratio),
    )


def _unknown_pods(entries: list[dict[str, Any]], pods: Mapping[str, dict[str, Any] | None]) -> tuple[str, ...]:
    names: list[str] = []
    for entry in entries:
        name = str(entry.get("name") or "")
        if is_pod_reservation(entry) and name not in pods and name not in names:
            names.append(name)
    return tuple(names)


def _unknown_podgroups(entries: list[dict[str, Any]],
                       podgroups: Mapping[str, dict[str, Any] | None] | None) -> tuple[str, ...]:
    if podgroups is None:
        return ()
    names: list[str] = []
    for entry in entries:
        name = str(entry.get("name") or "")
        if is_podgroup_reservation(entry) and name not in podgroups and name not in names:
            names.append(name)
    return tuple(names)


def _should_drop(entry: dict[str, Any], pods: Mapping[str, dict[str, Any] | None],
                 podgroups: Mapping[str, dict[str, Any] | None] | None = None) -> bool:
    """A pod reservation whose pod is gone, replaced (other UID) or done; a PodGroup reservation whose
    PodGroup is gone or replaced (where PodGroups are served); never any other entry."""
    if podgroups is not None and is_podgroup_reservation(entry):
        return should_drop_group_reservation(entry, podgroups.get(str(entry.get("name") or "")))
    if not is_pod_reservation(entry):
        return False
    view = pods.get(str(entry.get("name") or ""))
    if view is None:
        return True
    return view.get("uid") != entry.get("uid") or is_view_done(view)


def _release(claim: dict[str, Any], *, dropped: bool, remaining: bool) -> tuple[bool, bool]:
    """(deallocate, remove_finalizer).

    Only a claim protected by the delete-protection finalizer is released: when this plan drops its
    last reservation, or when it is being deleted with no reservations (unblocking the deletion).
    A claim that simply was never reserved keeps its allocation.
    """
    if not has_finalizer(claim, DELETE_PROTECTION_FINALIZER) or remaining:
        return False, False
    if dropped:
        return True, True
    if is_being_deleted(claim):
        return is_allocated(claim), True
    return False, False


def _owner_is_finished(claim: dict[str, Any], owner: Mapping[str, Any] | None) -> bool:
    """True when the claim's controlling pod (known in the cache) is replaced or done.

    A claim whose owner is missing from the cache is left to the garbage collector; a claim that is
    not a generated claim (a pod owner and the pod-claim-name annotation, as claimwarden and upstream
    make them, or the scheduler's extended-resource claim, 1.36+) is never deleted, whatever
    ownerReference a user gave it; nor is one already being deleted.
    """
    owner_uid = controlling_pod_uid(claim)
    if owner_uid is None or owner is None or is_being_deleted(claim) or not is_generated_claim(claim):
        return False
    return owner.get("uid") != owner_uid or is_view_done(owner)


def is_near_limit(reservations: int, limit_ratio: float = NEAR_LIMIT_RATIO) -> bool:
    """True when this many reservedFor entries reach the warning share of the 256-entry limit."""
    return reservations >= limit_ratio * RESERVED_FOR_MAX
