"""PodGroup claims (KEP-5729, gate DRAWorkloadResourceClaims): pure decisions, no I/O.

A PodGroup (``scheduling.k8s.io``: v1alpha2 on 1.36, v1beta1 on 1.37) lists in ``spec.resourceClaims``
the claims its pods share. A pod uses the group's claim instead of its own when its
``spec.schedulingGroup.podGroupName`` names the group and one of the group's entries has the same
``name`` *and* the same ``resourceClaimName``/``resourceClaimTemplateName`` as the pod's entry
(upstream's ``resourceclaim.BindTo``). Then, as upstream's resourceclaim controller does:

- a template entry is generated **once per PodGroup**: generateName ``<podgroup>-<claim>-`` (the
  same 57-character truncation as for pods), the PodGroup as the only, controlling owner (no
  blockOwnerDeletion), the template's labels and annotations plus
  ``resource.kubernetes.io/pod-claim-name: <claim>``; it is recorded in the PodGroup's
  ``status.resourceClaimStatuses`` and, once it exists, in every member pod's status;
- the claim is reserved for the PodGroup as one ``reservedFor`` entry
  ``{apiGroup: scheduling.k8s.io, resource: podgroups, name, uid}`` (the scheduler writes it), and a
  pod counts as reserved when that entry names its PodGroup (pods do not know the group's UID);
- that entry stays while the PodGroup exists (its pods may come and go) and is dropped when the
  PodGroup is gone or replaced by one with another UID; the claim is then deallocated like any other,
  and the garbage collector deletes a generated one (upstream never deletes PodGroup claims itself).

Deleting a PodGroup whose pods still run does not release the claim early: the PodGroupProtection
admission plugin stamps ``scheduling.k8s.io/podgroup-protection`` on every PodGroup, and
kube-controller-manager's podgroup-protection controller removes it only when no non-terminal pod
names the group (both 1.36.3 and 1.37.2, with GenericWorkload on).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from claimwarden.objects.claims import pod_claim_name_of, reserved_for
from claimwarden.objects.meta import is_being_deleted, metadata, spec
from claimwarden.objects.pods import claim_statuses

from . import generation
from .generation import ClaimPlan, ClaimProblem, CreateClaim, RecordClaim, missing_template_message

GROUP = "scheduling.k8s.io"
PLURAL = "podgroups"
KIND = "PodGroup"
VERSIONS = ("v1", "v1beta1", "v1alpha3", "v1alpha2")
"""Versions that have carried PodGroup claims, newest first: the first one the server serves is used."""
PROTECTION_FINALIZER = "scheduling.k8s.io/podgroup-protection"


# --- pods and their group ---------------------------------------------------------------------------

def podgroup_name_of(pod: dict[str, Any] | None) -> str | None:
    """The PodGroup the pod belongs to (``spec.schedulingGroup.podGroupName``), or None."""
    name = (spec(pod).get("schedulingGroup") or {}).get("podGroupName")
    return str(name) if name else None


def group_entry_for(podgroup: dict[str, Any] | None, pod_entry: Mapping[str, Any]) -> dict[str, Any] | None:
    """The PodGroup's ``spec.resourceClaims`` entry that the pod's entry binds to, or None.

    Name, claim name and template name must all be equal (a missing field equals only a missing field).
    """
    if podgroup is None:
        return None
    for entry in spec(podgroup).get("resourceClaims") or []:
        if (entry.get("name") == pod_entry.get("name")
                and (entry.get("resourceClaimName") or None) == (pod_entry.get("resourceClaimName") or None)
                and (entry.get("resourceClaimTemplateName") or None)
                == (pod_entry.get("resourceClaimTemplateName") or None)):
            return dict(entry)
    return None


def podgroup_reservation(podgroup: dict[str, Any]) -> dict[str, str]:
    """The one ``status.reservedFor`` entry that stands for every pod of the group."""
    return {"apiGroup": GROUP, "resource": PLURAL, "name": str(metadata(podgroup).get("name") or ""),
            "uid": str(metadata(podgroup).get("uid") or "")}


def is_podgroup_reservation(entry: Mapping[str, Any]) -> bool:
    return entry.get("apiGroup") == GROUP and entry.get("resource") == PLURAL


def is_reserved_for_group_of(claim: dict[str, Any], pod: dict[str, Any]) -> bool:
    """True when ``reservedFor`` names the pod's PodGroup (by name: a pod does not know the group's UID)."""
    name = podgroup_name_of(pod)
    return bool(name) and any(is_podgroup_reservation(e) and e.get("name") == name for e in reserved_for(claim))


# --- claims owned by a PodGroup ---------------------------------------------------------------------

def controlling_podgroup_ref(claim: dict[str, Any]) -> dict[str, Any] | None:
    """The claim's controller ownerReference when it is a PodGroup of any scheduling.k8s.io version."""
    for ref in metadata(claim).get("ownerReferences") or []:
        if (ref.get("controller") is True and ref.get("kind") == KIND
                and str(ref.get("apiVersion") or "").startswith(GROUP + "/")):
            return dict(ref)
    return None


def controlling_podgroup_uid(claim: dict[str, Any]) -> str | None:
    ref = controlling_podgroup_ref(claim)
    return str(ref.get("uid") or "") or None if ref else None


def is_controlled_by_podgroup(claim: dict[str, Any], uid: str) -> bool:
    return bool(uid) and controlling_podgroup_uid(claim) == uid


def is_for_group_of(claim: dict[str, Any], pod: dict[str, Any]) -> bool:
    """True when the claim is controlled by the pod's PodGroup, judged by name (upstream's IsForPod)."""
    ref = controlling_podgroup_ref(claim)
    return ref is not None and bool(podgroup_name_of(pod)) and ref.get("name") == podgroup_name_of(pod)


def group_claim_for(owned_claims: Sequence[dict[str, Any]], uid: str, claim_entry_name: str) -> dict[str, Any] | None:
    """The oldest live claim the PodGroup `uid` controls that was made for its entry `claim_entry_name`."""
    candidates = [c for c in owned_claims if is_controlled_by_podgroup(c, uid)
                  and pod_claim_name_of(c) == claim_entry_name and not is_being_deleted(c)]
    return min(candidates, key=generation.age_order, default=None)


def build_podgroup_claim(podgroup: dict[str, Any], claim_entry_name: str, template: dict[str, Any],
                         api_version: str) -> dict[str, Any]:
    """The ResourceClaim to create for the PodGroup's entry `claim_entry_name` from `template`
    (``generation.generated_claim``): the PodGroup is the only, controlling owner, without blockOwnerDeletion.

    `api_version` is the PodGroup's (``scheduling.k8s.io/<served version>``); upstream writes the
    version it watches, v1alpha2 on 1.36 and v1beta1 on 1.37.
    """
    meta = metadata(podgroup)
    owner = {"apiVersion": api_version, "kind": KIND, "name": meta.get("name"), "uid": meta.get("uid"),
             "controller": True}
    return generation.generated_claim(podgroup, claim_entry_name, template, owner)


# --- the PodGroup's own plan (the pod plan's shape: generation.py) ----------------------------------

def plan_podgroup(podgroup: dict[str, Any], claims: Mapping[str, dict[str, Any]],
                  owned_claims: Sequence[dict[str, Any]], templates: Mapping[str, dict[str, Any]]) -> ClaimPlan:
    """Which of the PodGroup's template entries need a claim created, or an existing one recorded.

    `claims`: claim name -> claim in the group's namespace (at least those its status names);
    `owned_claims`: claims the PodGroup controls; `templates`: template name -> template.
    A PodGroup being deleted gets nothing new (upstream's syncPodGroup).
    """
    if is_being_deleted(podgroup):
        return ClaimPlan()
    uid = str(metadata(podgroup).get("uid") or "")
    recorded = claim_statuses(podgroup)
    create: list[CreateClaim] = []
    record: list[RecordClaim] = []
    problems: list[ClaimProblem] = []
    for entry in spec(podgroup).get("resourceClaims") or []:
        name = str(entry.get("name") or "")
        template_name = entry.get("resourceClaimTemplateName")
        if not template_name:
            continue  # a claim by name is the user's to create; only its reservation is the group's
        if name in recorded:
            claim_name = recorded[name].get("resourceClaimName")
            if not claim_name:
                continue  # deliberately without a claim
            existing = claims.get(str(claim_name))
            if existing is not None and is_controlled_by_podgroup(existing, uid):
                continue
        adoptee = group_claim_for(owned_claims, uid, name)
        if adoptee is not None:
            record.append(RecordClaim(name, str(metadata(adoptee).get("name"))))
        elif template_name not in templates:
            problems.append(ClaimProblem(name, missing_template_message(str(template_name))))
        else:
            create.append(CreateClaim(name, str(template_name)))
    return ClaimPlan(tuple(create), tuple(record), tuple(problems))


# --- what a member pod needs from its group -----------------------------------------------------------

@dataclass(frozen=True)
class GroupView:
    """What planning a pod's claims needs about its PodGroup, where the cluster serves PodGroups.

    `podgroup` is None when the PodGroup does not exist (yet): upstream then waits, creating nothing
    for the pod. `owned_claims` are the claims the PodGroup controls.
    """

    name: str
    podgroup: dict[str, Any] | None
    owned_claims: tuple[dict[str, Any], ...] = ()


def missing_podgroup_message(name: str) -> str:
    return f'PodGroup "{name}" not found; its claims are generated once it exists'


def podgroup_view(podgroup: dict[str, Any] | None) -> dict[str, Any] | None:
    """The part of a PodGroup that reservation decisions use; None for one that does not exist."""
    if podgroup is None:
        return None
    return {"uid": str(metadata(podgroup).get("uid") or ""), "deleting": is_being_deleted(podgroup)}


def should_drop_group_reservation(entry: Mapping[str, Any], view: Mapping[str, Any] | None) -> bool:
    """A PodGroup reservation goes when its PodGroup is gone or replaced; never while it exists,
    even with all its pods finished or while it is being deleted (its pods may still run)."""
    return view is None or view.get("uid") != entry.get("uid")
