"""What the claims controller should do for one pod: pure decisions, no I/O.

Follows upstream's resourceclaim controller (pod sync), with two differences: every pod claim is
handled even when an earlier one has a problem, and a missing claim does not stop the reservation
of the pod's other claims. A pod claim that binds to the pod's PodGroup uses the group's claim
(podgroups.py): it is never generated per pod, only recorded once the group has it. The generated claims'
actions, body and status entries have one shape for pods and PodGroups (generation.py).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from claimwarden.objects.claims import (
    RESERVED_FOR_MAX,
    is_allocated,
    is_controlled_by_pod,
    is_reserved_for,
    pod_claim_name_of,
    reserved_for,
)
from claimwarden.objects.meta import is_being_deleted, metadata, spec
from claimwarden.objects.pods import ResolvedClaim, claim_statuses, is_pod_done, pod_uid, resolve_claim_names

from .generation import (
    ClaimPlan,
    ClaimProblem,
    CreateClaim,
    RecordClaim,
    age_order,
    generated_claim,
    missing_template_message,
)
from .podgroups import (
    GroupView,
    group_claim_for,
    group_entry_for,
    is_for_group_of,
    is_reserved_for_group_of,
    missing_podgroup_message,
    podgroup_reservation,
)


@dataclass(frozen=True)
class ReserveClaim:
    """Add the (scheduled) pod to the claim's status.reservedFor, or its PodGroup when `consumer` says so."""

    claim_name: str
    consumer: dict[str, str] | None = None
    """None: the pod itself; else the reservedFor entry to add (the PodGroup's)."""


@dataclass(frozen=True)
class PodPlan(ClaimPlan):
    """Everything the claims controller should do for one pod: its generated claims, then its reservations."""

    reserve: tuple[ReserveClaim, ...] = ()

    @property
    def idle(self) -> bool:
        """True when there is nothing to do."""
        return super().idle and not self.reserve


Generation = CreateClaim | RecordClaim | ClaimProblem


# --- before queueing ----------------------------------------------------------------------------

def pod_needs_work(
    pod: dict[str, Any],
    claims: Mapping[str, dict[str, Any]],
    owned_claims: Sequence[dict[str, Any]],
    group: GroupView | None = None,
) -> bool:
    """May `plan_pod` or the duplicate clean-up act on `pod`? Asked before the pod is queued, on every
    pod event and on the events of its claims, so it is cheap rather than exact.

    In the spirit of upstream's ``podNeedsWork``, and deliberately generous: it must say yes whenever
    the reconcile would do anything (a strict superset of the plan's triggers), and may say yes when
    the plan then finds nothing to do. The arguments are those `plan_pod` gets; `group.owned_claims`
    is not read. Yes when:

    - a claim generated for the pod is not the one its status records for that pod claim (a
      duplicate to delete, even for a pod that is done, or a claim in use that wins over the status);
    - the pod waits for its PodGroup (`group.podgroup` is None);
    - a template pod claim has no claim recorded in the status, or the recorded one is not among
      `claims` (the cache plus the claims created but not cached yet), or it is not the pod's own
      (the PodGroup's, for a pod claim that binds to the group);
    - the pod is scheduled and a claim it names is allocated, not being deleted and not reserved
      for it (nor for its PodGroup).
    """
    entries = spec(pod).get("resourceClaims") or []
    if not entries:
        return False
    recorded = {name: entry.get("resourceClaimName") for name, entry in claim_statuses(pod).items()}
    for own in owned_claims:
        made_for = pod_claim_name_of(own)
        if made_for and recorded.get(made_for) != metadata(own).get("name"):
            return True
    if is_being_deleted(pod) or is_pod_done(pod):
        return False
    if group is not None and group.podgroup is None:
        return True
    uid = pod_uid(pod)
    scheduled = bool(spec(pod).get("nodeName"))
    for entry, resolved in zip(entries, resolve_claim_names(pod), strict=True):
        if not resolved.needed:
            continue
        claim = claims.get(resolved.claim_name) if resolved.claim_name else None
        if resolved.from_template:
            if claim is None:
                return True
            binds = group is not None and _binds_to_group(entry, group)
            if not (is_for_group_of(claim, pod) if binds else is_controlled_by_pod(claim, uid)):
                return True
        if scheduled and claim is not None and is_allocated(claim) and not is_being_deleted(claim) \
                and not is_reserved_for(claim, uid) \
                and not (group is not None and is_reserved_for_group_of(claim, pod)):
            return True
    return False


# --- the claim body -----------------------------------------------------------------------------

def build_claim(pod: dict[str, Any], pod_claim_name: str, template: dict[str, Any]) -> dict[str, Any]:
    """The ResourceClaim to create for `pod_claim_name` of `pod` from `template` (``generation.generated_claim``):
    the pod is the only owner (controller, blockOwnerDeletion, as kube-controller-manager v1.34 sets them)."""
    return generated_claim(pod, pod_claim_name, template, _pod_owner_reference(pod))


def _pod_owner_reference(pod: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "name": metadata(pod).get("name"),
        "uid": metadata(pod).get("uid"),
        "controller": True,
        "blockOwnerDeletion": True,
    }


# --- the plan -----------------------------------------------------------------------------------

def plan_pod(
    pod: dict[str, Any],
    claims: Mapping[str, dict[str, Any]],
    owned_claims: Sequence[dict[str, Any]],
    templates: Mapping[str, dict[str, Any]],
    group: GroupView | None = None,
) -> PodPlan:
    """Decide which claims to create, adopt and reserve for `pod`.

    `claims`: claim name → claim in the pod's namespace; `owned_claims`: claims controlled by the
    pod's UID; `templates`: template name → template in the pod's namespace; `group`: the pod's
    PodGroup where the cluster serves PodGroups and the pod names one, else None.
    """
    if is_being_deleted(pod) or is_pod_done(pod):
        return PodPlan()
    uid = pod_uid(pod)
    entries = spec(pod).get("resourceClaims") or []
    resolved = resolve_claim_names(pod)
    generations: list[Generation] = []
    adopted: dict[str, dict[str, Any]] = {}
    for entry, claim in zip(entries, resolved, strict=True):
        if group is not None:
            generation, adoptee = _plan_group_generation(entry, claim, pod, group, claims)
            # A missing PodGroup holds back every claim of the pod, as upstream's failing sync does.
            if generation is not None or adoptee is not None or group.podgroup is None \
                    or _binds_to_group(entry, group):
                _collect(generations, adopted, claim, generation, adoptee)
                continue
        generation, adoptee = _plan_generation(entry, claim, uid, claims, owned_claims, templates)
        _collect(generations, adopted, claim, generation, adoptee)
    reserve = _plan_reservations(pod, resolved, claims, adopted, group) if spec(pod).get("nodeName") else ()
    return PodPlan(
        create=tuple(g for g in generations if isinstance(g, CreateClaim)),
        record=tuple(g for g in generations if isinstance(g, RecordClaim)),
        problems=tuple(g for g in generations if isinstance(g, ClaimProblem)),
        reserve=reserve,
    )


def _plan_generation(
    entry: dict[str, Any],
    resolved: ResolvedClaim,
    uid: str,
    claims: Mapping[str, dict[str, Any]],
    owned_claims: Sequence[dict[str, Any]],
    templates: Mapping[str, dict[str, Any]],
) -> tuple[Generation | None, dict[str, Any] | None]:
    """What one pod claim needs: nothing, an adoption (with the adopted claim), a problem or a creation."""
    if not resolved.from_template or not resolved.needed:
        return None, None
    in_use = _claim_in_use(resolved, uid, owned_claims)
    if in_use is not None:
        return RecordClaim(resolved.pod_claim_name, str(metadata(in_use).get("name"))), in_use
    if _has_usable_generated_claim(resolved, uid, claims):
        return None, None
    adoptee = _claim_to_adopt(resolved.pod_claim_name, uid, owned_claims)
    if adoptee is not None:
        return RecordClaim(resolved.pod_claim_name, str(metadata(adoptee).get("name"))), adoptee
    template_name = str(entry.get("resourceClaimTemplateName"))
    if template_name not in templates:
        return ClaimProblem(resolved.pod_claim_name, missing_template_message(template_name)), None
    return CreateClaim(resolved.pod_claim_name, template_name), None


def _collect(generations: list[Generation], adopted: dict[str, dict[str, Any]], claim: ResolvedClaim,
             generation: Generation | None, adoptee: dict[str, Any] | None) -> None:
    if generation is not None:
        generations.append(generation)
    if adoptee is not None:
        adopted[claim.pod_claim_name] = adoptee


def _binds_to_group(entry: dict[str, Any], group: GroupView) -> bool:
    return group.podgroup is not None and group_entry_for(group.podgroup, entry) is not None


def _plan_group_generation(
    entry: dict[str, Any],
    resolved: ResolvedClaim,
    pod: dict[str, Any],
    group: GroupView,
    claims: Mapping[str, dict[str, Any]],
) -> tuple[Generation | None, dict[str, Any] | None]:
    """A pod claim of a pod in a PodGroup: wait for the group, record the group's claim, or (None, None).

    (None, None) for an entry that does not bind to the group means "plan it as a per-pod claim".
    """
    if not resolved.from_template or not resolved.needed:
        return None, None
    if group.podgroup is None:
        # Upstream waits for the PodGroup (its sync fails and is retried) and creates nothing per pod.
        if resolved.claim_name is None:
            return ClaimProblem(resolved.pod_claim_name, missing_podgroup_message(group.name)), None
        return None, None
    if group_entry_for(group.podgroup, entry) is None:
        return None, None
    current = claims.get(resolved.claim_name) if resolved.claim_name else None
    if current is not None and is_for_group_of(current, pod):
        return None, None
    group_claim = group_claim_for(group.owned_claims, str(metadata(group.podgroup).get("uid") or ""),
                                  resolved.pod_claim_name)
    if group_claim is None:
        return None, None  # the PodGroup's sync creates it; its claim event brings the pod back here
    return RecordClaim(resolved.pod_claim_name, str(metadata(group_claim).get("name"))), group_claim


def _has_usable_generated_claim(resolved: ResolvedClaim, uid: str, claims: Mapping[str, dict[str, Any]]) -> bool:
    """True when the status names a claim that exists and is controlled by the pod."""
    if resolved.claim_name is None:
        return False
    claim = claims.get(resolved.claim_name)
    return claim is not None and is_controlled_by_pod(claim, uid)


def _claim_in_use(resolved: ResolvedClaim, uid: str, owned_claims: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """A claim of this pod claim that is reserved for the pod while the status names another one.

    Two controllers writing the status (claimwarden beside kube-controller-manager) can leave it
    naming one claim while the scheduler reserved the other; the claim in use is the truth.
    """
    for claim in owned_claims:
        if (pod_claim_name_of(claim) == resolved.pod_claim_name and is_controlled_by_pod(claim, uid)
                and is_reserved_for(claim, uid) and metadata(claim).get("name") != resolved.claim_name):
            return claim
    return None


def _claim_to_adopt(pod_claim_name: str, uid: str, owned_claims: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """The oldest claim controlled by the pod, made for this pod claim and not being deleted."""
    candidates = [
        claim for claim in owned_claims
        if is_controlled_by_pod(claim, uid)
        and pod_claim_name_of(claim) == pod_claim_name
        and not is_being_deleted(claim)
    ]
    return min(candidates, key=age_order, default=None)


def _plan_reservations(
    pod: dict[str, Any],
    resolved: Sequence[ResolvedClaim],
    claims: Mapping[str, dict[str, Any]],
    adopted: Mapping[str, dict[str, Any]],
    group: GroupView | None = None,
) -> tuple[ReserveClaim, ...]:
    """Claims of a scheduled pod that are allocated but not yet reserved for it (or for its PodGroup,
    for a claim the pod shares through the group: upstream's BindTo)."""
    entries = {str(e.get("name") or ""): e for e in spec(pod).get("resourceClaims") or []}
    reserve: dict[str, ReserveClaim] = {}
    for entry in resolved:
        claim = adopted.get(entry.pod_claim_name) or _known_claim(entry, claims)
        if claim is None:
            continue
        bound = group is not None and group.podgroup is not None \
            and group_entry_for(group.podgroup, entries.get(entry.pod_claim_name) or {}) is not None
        if bound and group is not None and group.podgroup is not None:
            if not _can_reserve(claim, entry, pod, for_group=True):
                continue
            consumer: dict[str, str] | None = podgroup_reservation(group.podgroup)
        elif not _can_reserve(claim, entry, pod, for_group=False) \
                or (group is not None and is_reserved_for_group_of(claim, pod)):
            continue
        else:
            consumer = None
        name = str(metadata(claim).get("name"))
        reserve.setdefault(name, ReserveClaim(name, consumer))
    return tuple(reserve.values())


def _known_claim(entry: ResolvedClaim, claims: Mapping[str, dict[str, Any]]) -> dict[str, Any] | None:
    if not entry.needed or entry.claim_name is None:
        return None
    return claims.get(entry.claim_name)


def _can_reserve(claim: dict[str, Any], entry: ResolvedClaim, pod: dict[str, Any], *, for_group: bool) -> bool:
    """May the claim be reserved for the pod (`for_group`: for its PodGroup)? A generated claim must be the
    pod's own (the PodGroup's); the claim must be allocated, not reserved for the pod yet (nor for its group,
    `for_group`), not being deleted, and have room left in reservedFor."""
    uid = pod_uid(pod)
    if entry.from_template and not (is_for_group_of(claim, pod) if for_group else is_controlled_by_pod(claim, uid)):
        return False
    return (
        is_allocated(claim)
        and not is_reserved_for(claim, uid)
        and not (for_group and is_reserved_for_group_of(claim, pod))
        and not is_being_deleted(claim)
        and len(reserved_for(claim)) < RESERVED_FOR_MAX
    )


# --- the pod's status ----------------------------------------------------------------------------

def recreates(pod: dict[str, Any], pod_plan: PodPlan) -> bool:
    """True when the plan creates a claim again: the pod's status already names one for that pod claim.

    The named claim is gone. Its pod may be gone too (the garbage collector deletes the claims of a
    deleted pod, and their DELETED events can overtake the pod's own), so this is decided on a
    fresh read of the pod, not the cache.
    """
    creating = {create.pod_claim_name for create in pod_plan.create}
    return any(r.claim_name for r in resolve_claim_names(pod) if r.pod_claim_name in creating)


def status_apply_due(wanted: Mapping[str, str], applied: Mapping[str, str], applied_version: str,
                     cached_version: str, age: float, *, fresh: float = 10.0, lagging: float = 300.0) -> bool:
    """Should the pod's claim statuses be applied (again)?

    Yes when they differ from what was applied last. The same entries again only once the cache
    has seen our apply (the cached pod is at or past the version the apply returned) and still
    lacks them, i.e. someone removed them: while the watch lags behind, an apply again changes
    nothing but costs a write. (Versions compare as numbers, as etcd's are; any other version falls
    back to `fresh` seconds. After `lagging` seconds the apply is repeated anyway.)
    """
    if dict(wanted) != dict(applied):
        return True
    if applied_version.isdigit() and cached_version.isdigit():
        return int(cached_version) >= int(applied_version) or age > lagging
    return age > fresh


# --- duplicates ---------------------------------------------------------------------------------

def duplicate_claims(pod: dict[str, Any], owned_claims: Sequence[dict[str, Any]]) -> list[str]:
    """Names of surplus claims generated for the pod, safe to delete.

    A claim is surplus when it is controlled by the pod and made for one of its pod claims, while
    the pod's status names another claim for that pod claim; it must also be unallocated,
    unreserved and not being deleted. Two controllers racing can each create one.
    """
    uid = pod_uid(pod)
    recorded = claim_statuses(pod)
    duplicates = []
    for claim in owned_claims:
        pod_claim_name = pod_claim_name_of(claim)
        if not pod_claim_name or not is_controlled_by_pod(claim, uid):
            continue
        recorded_name = (recorded.get(pod_claim_name) or {}).get("resourceClaimName")
        name = metadata(claim).get("name")
        if not recorded_name or recorded_name == name:
            continue
        if is_allocated(claim) or reserved_for(claim) or is_being_deleted(claim):
            continue
        duplicates.append(str(name))
    return sorted(duplicates)
