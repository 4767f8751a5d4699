"""Approvals of a record's evictions past the breaker: which ones claimwarden honours. Pure, no I/O.

An approval is two annotations on an UnhealthyDevice, `claimwarden.io/approved-by` (who) and
`claimwarden.io/approved-generation` (the record's metadata.generation the approver saw). Kubernetes
records neither who set an annotation nor why, so the ValidatingAdmissionPolicy `claimwarden-approval`
(manifests/approval) checks both when they are set: the requester is in the approvers group, the name
is the requester's own, the generation is the record's at that moment, and no record is created
approved (docs/concepts/safety.md "The breaker").

claimwarden honours an approval only
- while that policy and a binding that denies are installed (``policy_in_force``). Without them any
  string approves: claimwarden then removes every approval it sees (``removal``), loudly (log,
  Warning Event, condition, metric), so that none set meanwhile counts once the policy is back; an
  approver approves again then. So it does with the approvals present when the policy or its binding
  was re-created between two reads (admission.py), since they may have been set in between;
- for the generation it was given for: a spec change afterwards (effect None to NoExecute, another
  drain mode) bumps metadata.generation and the approval is stale until someone approves again.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from ..objects.meta import metadata

APPROVED_BY = "claimwarden.io/approved-by"
APPROVED_GENERATION = "claimwarden.io/approved-generation"
POLICY = "claimwarden-approval"
POLICY_REVISION_ANNOTATION = "claimwarden.io/approval-policy"
POLICY_REVISION = "2"
"""The revision of manifests/approval whose checks claimwarden relies on; an older policy (revision 1
checked only that the name was the requester's) counts as missing."""
CONDITION = "Approved"

HONOURED, STALE, UNVERIFIED, INCOMPLETE = "Approved", "ApprovalStale", "ApprovalPolicyMissing", "ApprovalIncomplete"


@dataclass(frozen=True)
class Verdict:
    """What claimwarden makes of a record's approval annotations."""

    reason: str
    """HONOURED, STALE, UNVERIFIED or INCOMPLETE; "" without an approval."""
    by: str = ""
    generation: int | None = None
    """The generation the approval was given for."""
    current: int | None = None
    """The record's metadata.generation."""
    message: str = ""

    @property
    def honoured(self) -> str | None:
        """The approver, when the approval counts; else None."""
        return self.by if self.reason == HONOURED else None


def judge(record: dict[str, Any], *, policy_in_force: bool, why: str = "") -> Verdict:
    """Whether the record's approval counts now; `why` the policy is not in force, for the message."""
    meta = metadata(record)
    annotations = meta.get("annotations") or {}
    by = str(annotations.get(APPROVED_BY) or "")
    if not by:
        return Verdict(reason="")
    current = _integer(meta.get("generation"))
    generation = _integer(annotations.get(APPROVED_GENERATION))
    if not policy_in_force:
        why = why or f"the ValidatingAdmissionPolicy {POLICY} (revision {POLICY_REVISION}) or its binding is missing"
        return Verdict(UNVERIFIED, by, generation, current,
                       f"approval by {by} is not honoured: {why}, so the API server did not check who approved")
    if generation is None:
        return Verdict(INCOMPLETE, by, None, current,
                       f"approval by {by} is not honoured: it names no {APPROVED_GENERATION}; approve again with "
                       f"`kubectl claimwarden approve`")
    if generation != current:
        return Verdict(STALE, by, generation, current,
                       f"approval by {by} was given for generation {generation}; the spec changed since (generation "
                       f"{current}), so it is not honoured; approve again to evict as the record now says")
    return Verdict(HONOURED, by, generation, current, f"evictions approved by {by} for generation {generation}")


REMOVED = "; claimwarden removed it: approve again once the policy is installed (manifests/approval)"


def removal(record: dict[str, Any]) -> dict[str, Any]:
    """The merge patch that removes the record's approval, only from the version judged (409 otherwise)."""
    meta = metadata(record)
    return {"metadata": {"resourceVersion": meta.get("resourceVersion"),
                         "annotations": {APPROVED_BY: None, APPROVED_GENERATION: None}}}


def status_approval(verdict: Verdict, previous: dict[str, Any] | None, at: str) -> dict[str, Any] | None:
    """status.approval: who approved which generation, and when claimwarden first honoured it; None unless
    the approval counts."""
    if verdict.honoured is None:
        return None
    previous = previous or {}
    if previous.get("by") == verdict.by and previous.get("generation") == verdict.generation and previous.get("at"):
        return previous
    return {"by": verdict.by, "generation": verdict.generation, "at": at}


def policy_in_force(policy: dict[str, Any] | None, bindings: Iterable[dict[str, Any]]) -> tuple[bool, str]:
    """(in force, why not): the approval policy at the expected revision, failing closed, and a binding of it
    that denies."""
    if policy is None:
        return False, f"ValidatingAdmissionPolicy {POLICY} is not installed"
    bindings = list(bindings)
    revision = (metadata(policy).get("annotations") or {}).get(POLICY_REVISION_ANNOTATION)
    if revision != POLICY_REVISION:
        return False, (f"ValidatingAdmissionPolicy {POLICY} is not revision {POLICY_REVISION} (annotation "
                       f"{POLICY_REVISION_ANNOTATION}={revision!r}): it may not check the approvers group")
    if ((policy.get("spec") or {}).get("failurePolicy") or "Fail") != "Fail":
        return False, f"ValidatingAdmissionPolicy {POLICY} has failurePolicy Ignore: a failed check would admit"
    denying = [b for b in bindings if (b.get("spec") or {}).get("policyName") == POLICY
               and "Deny" in ((b.get("spec") or {}).get("validationActions") or [])]
    if not denying:
        return False, f"no ValidatingAdmissionPolicyBinding of {POLICY} with validationActions Deny is installed"
    return True, ""


def policy_uids(policy: dict[str, Any] | None, bindings: Iterable[dict[str, Any]]) -> tuple[str, ...]:
    """The UIDs of the approval policy and its bindings: changed UIDs mean they were deleted and created again."""
    found = sorted(str(metadata(b).get("uid")) for b in bindings if (b.get("spec") or {}).get("policyName") == POLICY)
    return (str(metadata(policy).get("uid")) if policy else "", *found)


def policy_bound(name: str, policy: dict[str, Any] | None, bindings: Iterable[dict[str, Any]]) -> bool:
    """True when the policy `name` exists and a binding denies by it (the marking policy: reported only)."""
    return policy is not None and any((b.get("spec") or {}).get("policyName") == name
                                      and "Deny" in ((b.get("spec") or {}).get("validationActions") or [])
                                      for b in bindings)


def _integer(value: Any) -> int | None:
    try:
        return int(str(value))
    except (TypeError, ValueError):
        return None
