"""What a record's status conditions say: Quarantined, Evicting, and how a condition keeps its transition time.

A condition's lastTransitionTime moves only when its status does, as Kubernetes conditions do; the
reason and message follow what the record's plan says now. Pure: no I/O (the clock is read for a
condition that changes).
"""

from __future__ import annotations

import datetime
from typing import Any

from ..cache import Body
from ..timestamps import format_rfc3339, now
from . import plan, records


def condition(status: Body, kind: str, state: str, reason: str, message: str) -> dict[str, Any]:
    """The condition `kind` as it should stand, keeping the lastTransitionTime of `status`'s one while its state
    is the same."""
    previous = next((c for c in status.get("conditions") or [] if c.get("type") == kind), None)
    changed = previous is None or previous.get("status") != state
    since = format_rfc3339(now()) if changed or previous is None else previous.get("lastTransitionTime")
    return {"type": kind, "status": state, "reason": reason, "message": message,
            "lastTransitionTime": since or format_rfc3339(now())}


def condition_true(record: Body, kind: str, status: str = "True") -> bool:
    """True when the record's status carries the condition `kind` with `status`."""
    return any(c.get("type") == kind and c.get("status") == status
               for c in (record.get("status") or {}).get("conditions") or [])


def evicting(pending: int, evicted: int, drain: records.Drain,
             deadline: datetime.datetime | None) -> tuple[str, str, str]:
    """The Evicting condition of a NoExecute record: (status, reason, message), saying why pods wait."""
    if not pending:
        return "False", "Completed", f"{evicted} pod(s) evicted, none pending"
    if drain.mode == records.DRAIN_ALLOW_COMPLETION:
        return ("False", "WaitingForCompletion", f"{pending} pod(s) may run to completion (drain AllowCompletion); "
                "the device takes no new work")
    if deadline is not None and deadline > now():
        return ("True", "WaitingForDeadline", f"{pending} pod(s) may finish until {format_rfc3339(deadline)} "
                f"(drain {drain}), then they are evicted; the device takes no new work")
    return "True", "PodsPendingEviction", f"{pending} pod(s) still to evict"


def quarantined(effect: str, quarantine: list[str], record_plan: plan.RecordPlan) -> tuple[str, str, str]:
    """The Quarantined condition: (status, reason, message)."""
    if quarantine:
        return "True", "QuarantineClaimAllocated", f"held by {', '.join(quarantine)}"
    if record_plan.quarantine_needed and record_plan.exclusive_holders:
        # Claims that hold a device keep it from new work as well; the quarantine claim follows them.
        return ("True", "HeldByClaims", f"held by {', '.join(record_plan.exclusive_holders)}; a quarantine claim "
                "takes the device when they let go")
    if record_plan.quarantine_needed:
        return "False", "QuarantinePending", "the quarantine claim is being made"
    return "False", "NotQuarantined", f"effect {effect} does not quarantine"


def settling(record_plan: plan.RecordPlan, *, evicting_now: bool, held_back: bool) -> bool:
    """True while the record's device is changing hands: claims the scheduler counts still hold a device to
    be quarantined, and its pods are being evicted now or have all been evicted (or need not be), with
    nothing (the breaker, a PodDisruptionBudget) holding the evictions back. Its first status then waits
    for them to let go."""
    if not record_plan.quarantine_needed or not record_plan.exclusive_holders or held_back:
        return False
    return evicting_now or record_plan.pending == 0
