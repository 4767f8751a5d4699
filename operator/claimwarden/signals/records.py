"""The signal record of a device: its name, its body and the status fields the signals own.

A device's signals live in one UnhealthyDevice of their own (``spec.source: signals``), apart from a
person's or an annotation's record of the same device: clearing one never clears the other, and the
health controller already acts on several records of one device (health/__init__.py).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from claimwarden.health import records
from claimwarden.health.records import DeviceRef
from claimwarden.timestamps import parse_rfc3339

from . import decide, observations
from .observations import Observation

SOURCE = "signals"
SOURCE_LABEL = "claimwarden.io/source"
VERIFIED_ANNOTATION = "claimwarden.io/verified-at"
"""A person's verified clear (``kubectl claimwarden clear --verified``): RFC 3339, not in the future."""
STATUS_FIELDS = ("observations", "decision", "recovery")
"""The status fields the signals controller owns; the health controller's status patches never name them."""


def signal_record_name(ref: DeviceRef) -> str:
    return records.record_name(ref, salt=f"{SOURCE}/")


def is_signal_record(record: Mapping[str, Any]) -> bool:
    return str((record.get("spec") or {}).get("source") or "") == SOURCE


def record_body(ref: DeviceRef, spec: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": records.API_VERSION, "kind": records.KIND,
        "metadata": {"name": signal_record_name(ref), "labels": {SOURCE_LABEL: SOURCE}},
        "spec": {"driver": ref.driver, "pool": ref.pool, "device": ref.device, "source": SOURCE,
                 **{key: value for key, value in spec.items() if value is not None}},
    }


def desired_spec(decision: decide.Decision) -> dict[str, Any]:
    """spec.effect, spec.reason, spec.drain and spec.scope of a decision (a scope of None removes the field in a
    merge patch and is left out of a new record).

    The reason names who decided, not the decision's wording (that is status.decision.why): a spec change bumps
    metadata.generation, and an approval counts only for the generation it was given for, so a reason that
    followed every new observation would make approved evictions wait for a new approval."""
    return {"effect": decision.effect, "reason": stable_reason(decision)[:records.REASON_MAX],
            "drain": decision.drain or records.DRAIN_IMMEDIATE, "scope": decision.scope}


def stable_reason(decision: decide.Decision) -> str:
    """"HealthPolicy <policy>, rule <rule> (<mode>)", with what holds: escalated, orphaned, a workload fault."""
    if decision.rule is None:
        return "signals: no mark (see status.decision)"
    notes = [note for flag, note in ((decision.escalated, "escalated"), (decision.orphaned, "its rule is gone"),
                                     (decision.workload_fault, "a workload fault")) if flag]
    return (f"HealthPolicy {decision.policy}, rule {decision.rule} ({decision.mode or 'Shadow'})"
            + (f": {', '.join(notes)}" if notes else "") + "; status.decision says why")


def record_observations(record: Mapping[str, Any] | None) -> list[Observation]:
    """The observations a record's status holds (malformed entries left out)."""
    found = []
    for entry in ((record or {}).get("status") or {}).get("observations") or []:
        parsed = observations.from_json(entry) if isinstance(entry, Mapping) else None
        if parsed is not None:
            found.append(parsed)
    return found


def record_history(record: Mapping[str, Any] | None) -> decide.History:
    raw = ((record or {}).get("status") or {}).get("recovery")
    return decide.history_from_json(raw) if isinstance(raw, Mapping) else decide.History()


def desired_status(merged: Sequence[Observation], decision: decide.Decision, previous: Mapping[str, Any],
                   moment: datetime) -> dict[str, Any]:
    """status.observations, status.decision and status.recovery; decision.at moves only when the decision does."""
    stored = previous.get("decision") or {}
    shown = decide.decision_to_json(decision, parse_rfc3339(stored.get("at")) or moment)
    if {k: v for k, v in shown.items() if k != "at"} != {k: v for k, v in stored.items() if k != "at"}:
        shown = decide.decision_to_json(decision, moment)
    return {"observations": [_without_nulls(observations.to_json(o)) for o in merged],
            "decision": _without_nulls(shown), "recovery": _without_nulls(decide.history_to_json(decision.history))}


def _without_nulls(value: Mapping[str, Any]) -> dict[str, Any]:
    """The fields that are set: a merge patch's null removes a field, and the record read back lacks it, so a
    desired status with nulls would never compare equal (a write on every reconcile)."""
    return {k: v for k, v in value.items() if v is not None}


def verified_at(record: Mapping[str, Any] | None) -> tuple[datetime | None, str]:
    """The record's verified clear and "" , or (None, why it is not used) when the annotation is bad, or (None, "")."""
    raw = (((record or {}).get("metadata") or {}).get("annotations") or {}).get(VERIFIED_ANNOTATION)
    if raw is None:
        return None, ""
    parsed = parse_rfc3339(raw)
    if parsed is None:
        return None, f"annotation {VERIFIED_ANNOTATION}={raw!r} is not an RFC 3339 date-time; ignored"
    return parsed, ""
