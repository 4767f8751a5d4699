"""Claims generated from templates, for a pod or for its PodGroup: one shape for both plans (pure).

Upstream's resourceclaim controller generates a claim for each template entry of a pod's
``spec.resourceClaims`` and, with KEP-5729, once per PodGroup for each template entry of the group's.
The two are the same work on a different owner. For each entry the plan says one of three things:
record a claim that already exists in the owner's ``status.resourceClaimStatuses`` (``RecordClaim``),
create one from the template (``CreateClaim``), or why neither can happen (``ClaimProblem``; the
controllers prefix its message with upstream's ``PodResourceClaim <name>: `` or
``PodGroupResourceClaim <name>: ``). The entry's name is the *pod claim name* for either owner: the
generated claim carries it in the ``resource.kubernetes.io/pod-claim-name`` annotation, whoever owns it.

The generated claim's body and the owner's status entries are built here too; what differs between
the owners (the owner reference, which claims a pod may adopt, the reservation) stays in ``plan`` and
``podgroups``.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from claimwarden.objects.claims import POD_CLAIM_NAME_ANNOTATION, generate_name
from claimwarden.objects.meta import metadata, spec
from claimwarden.objects.pods import claim_statuses


@dataclass(frozen=True)
class EntryAction:
    """What a plan does for one template entry of its owner, named by the entry."""

    pod_claim_name: str


@dataclass(frozen=True)
class CreateClaim(EntryAction):
    """Create a claim for `pod_claim_name` from the template `template_name`."""

    template_name: str


@dataclass(frozen=True)
class RecordClaim(EntryAction):
    """Write `claim_name` (an existing claim, adopted) into the owner's status for `pod_claim_name`."""

    claim_name: str


@dataclass(frozen=True)
class ClaimProblem(EntryAction):
    """An entry that cannot be handled, and why (without upstream's prefix)."""

    message: str


@dataclass(frozen=True)
class ClaimPlan:
    """What to do for an owner's template entries."""

    create: tuple[CreateClaim, ...] = ()
    record: tuple[RecordClaim, ...] = ()
    problems: tuple[ClaimProblem, ...] = ()

    @property
    def idle(self) -> bool:
        """True when there is nothing to do."""
        return not (self.create or self.record or self.problems)


def missing_template_message(template_name: str) -> str:
    """Upstream's error text for a template that the owner's namespace does not hold."""
    not_found = f'resourceclaimtemplate.resource.k8s.io "{template_name}" not found'
    return f'resource claim template "{template_name}": {not_found}'


def age_order(claim: dict[str, Any]) -> tuple[bool, str, str]:
    """Oldest first (RFC 3339 timestamps sort as text), claims without a timestamp last, then by name."""
    created = metadata(claim).get("creationTimestamp")
    return (not created, str(created or ""), str(metadata(claim).get("name") or ""))


def generated_claim(owner: dict[str, Any], pod_claim_name: str, template: dict[str, Any],
                    owner_reference: dict[str, Any]) -> dict[str, Any]:
    """The ResourceClaim to create for the owner's entry `pod_claim_name` from `template`.

    generateName ``<owner>-<claim>-`` (truncated as upstream does), the owner's namespace, the owner as the
    only owner (`owner_reference`), the template's labels and annotations plus the pod-claim-name
    annotation, and the template's spec copied verbatim. Nothing else.
    """
    owner_meta = metadata(owner)
    template_meta = spec(template).get("metadata") or {}
    claim_meta: dict[str, Any] = {"generateName": generate_name(str(owner_meta.get("name") or ""), pod_claim_name)}
    if owner_meta.get("namespace"):
        claim_meta["namespace"] = owner_meta["namespace"]
    claim_meta["ownerReferences"] = [owner_reference]
    claim_meta["annotations"] = {**(template_meta.get("annotations") or {}), POD_CLAIM_NAME_ANNOTATION: pod_claim_name}
    if template_meta.get("labels"):
        claim_meta["labels"] = dict(template_meta["labels"])
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": claim_meta,
        "spec": copy.deepcopy(spec(template).get("spec") or {}),
    }


def status_entries(owner: dict[str, Any], recorded: Mapping[str, str],
                   applied: Mapping[str, str]) -> list[dict[str, str]]:
    """Every `status.resourceClaimStatuses` entry claimwarden keeps for the owner, in spec order.

    Server-side apply removes the entries an apply leaves out that the same field manager set
    before, so each apply must carry all of them, not only this sync's. For each template entry
    the claim is the one `recorded` now, else the one claimwarden `applied` before (the cache may not
    show it yet), else the one the owner's status already names (perhaps another controller's).
    """
    in_status = {name: str(entry.get("resourceClaimName")) for name, entry in claim_statuses(owner).items()
                 if entry.get("resourceClaimName")}
    entries = []
    for entry in spec(owner).get("resourceClaims") or []:
        name = str(entry.get("name") or "")
        if not entry.get("resourceClaimTemplateName"):
            continue
        claim = recorded.get(name) or applied.get(name) or in_status.get(name)
        if claim:
            entries.append({"name": name, "resourceClaimName": claim})
    return entries
