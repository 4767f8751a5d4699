"""mark / clear: which device a `[driver/]pool/device` argument names, and the record or annotation
change that marks or clears it (the paths docs/concepts/device-health.md documents: an UnhealthyDevice record with
source `manual`, or removing the slice annotation a record came from). Pure functions."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from claimwarden.health import records
from claimwarden.health.records import DeviceRef

from .snapshot import Obj, Snapshot

_DAYS = re.compile(r"^\d+d$")


class MarkError(ValueError):
    """Bad input for mark/clear; the message names the fix."""


def resolve(snapshot: Snapshot, text: str) -> DeviceRef:
    """The device `[driver/]pool/device` names, among published devices and existing records."""
    parts = [p for p in text.split("/")]
    if len(parts) < 2 or not all(parts):
        raise MarkError(f"{text!r} is not [driver/]pool/device, e.g. kwok-node-0/gpu-3 or "
                        "gpu.example.com/kwok-node-0/gpu-3 ('kubectl claimwarden devices' lists them)")
    known = {*snapshot.device_index, *snapshot.records_by_device}
    device = parts[-1]
    candidates = set()
    if len(parts) >= 3:
        candidates |= {k for k in known if k == (parts[0], "/".join(parts[1:-1]), device)}
    candidates |= {k for k in known if k[1] == "/".join(parts[:-1]) and k[2] == device}
    if len(candidates) == 1:
        return DeviceRef(*next(iter(candidates)))
    if not candidates:
        raise MarkError(f"no ResourceSlice publishes a device {text!r} and no record names it; "
                        "'kubectl claimwarden devices' lists the devices")
    names = ", ".join(sorted("/".join(c) for c in candidates))
    raise MarkError(f"{text!r} names more than one device ({names}); give driver/pool/device")


def expiry(text: str | None, now: datetime) -> str | None:
    """--expires: a Go duration from now (30m, 12h, 168h) or an RFC 3339 date-time."""
    if not text:
        return None
    from claimwarden import durations
    from claimwarden.timestamps import parse_rfc3339

    try:
        delta = durations.parse(text, negative=True)  # refused below with the reason, not as unreadable
    except durations.DurationError:
        if _DAYS.match(text):
            raise MarkError(f"--expires {text!r}: a Go duration has no days; write {int(text[:-1]) * 24}h") from None
        if parse_rfc3339(text) is None:
            raise MarkError(f"--expires {text!r} is neither a Go duration (30m, 12h, 168h) nor an RFC 3339 "
                            "date-time (2026-12-31T00:00:00Z)") from None
        return text
    if delta <= timedelta(0):
        raise MarkError(f"--expires {text!r}: the mark would lapse at once; give a positive duration")
    return (now + delta).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class MarkPlan:
    create: Obj | None = None
    patch_name: str | None = None
    patch: Obj | None = None


def plan_mark(snapshot: Snapshot, ref: DeviceRef, *, reason: str, effect: str, expires_at: str | None,
              scope: str | None = None, drain: str | None = None) -> MarkPlan:
    """A new manual record, or a patch of the existing manual record of the device (a mark again replaces
    expiresAt, scope and drain: those not given go back to their defaults)."""
    from claimwarden.health.siblings import SCOPES

    if effect not in records.EFFECTS:
        raise MarkError(f"--effect {effect!r}: choose one of {', '.join(records.EFFECTS)}")
    if scope is not None and scope not in SCOPES:
        raise MarkError(f"--scope {scope!r}: choose one of {', '.join(SCOPES)}")
    mode = None if drain is None else records.parse_drain(drain)
    if drain is not None and mode is None:
        raise MarkError(f"--drain {drain!r}: use {records.DRAIN_SYNTAX}")
    if mode is not None and effect != "NoExecute":
        raise MarkError(f"--drain says how a NoExecute mark empties the device; --effect {effect} evicts nobody")
    if not reason.strip():
        raise MarkError("--reason is empty; say why the device is unhealthy (it shows in events and records)")
    spec: dict[str, Any] = {"driver": ref.driver, "pool": ref.pool, "device": ref.device, "effect": effect,
                            "reason": reason[: records.REASON_MAX], "source": records.SOURCE_MANUAL}
    if expires_at:
        spec["expiresAt"] = expires_at
    if scope is not None:
        spec["scope"] = scope
    if mode is not None:
        spec["drain"] = str(mode)
    existing = snapshot.records_by_device.get((ref.driver, ref.pool, ref.device))
    from claimwarden.signals.records import is_signal_record

    # The signals' record is theirs and a derived one its origin's: a person's mark is apart.
    if existing is None or is_signal_record(existing) or records.record_source(existing) == records.SOURCE_SIBLING:
        return MarkPlan(create={"apiVersion": records.API_VERSION, "kind": records.KIND,
                                "metadata": {"name": records.record_name(ref)}, "spec": spec})
    if records.is_from_annotation(existing):
        raise MarkError(f"{ref} is already marked by a slice annotation (record "
                        f"{existing['metadata']['name']}); change or remove the annotation instead")
    return MarkPlan(patch_name=existing["metadata"]["name"],
                    patch={"spec": {k: spec[k] for k in ("effect", "reason")}
                           | {"expiresAt": expires_at, "scope": scope, "drain": spec.get("drain")}})


@dataclass(frozen=True)
class ClearPlan:
    delete_record: str | None = None
    remove_annotation: tuple[str, str] | None = None
    """(slice name, annotation key)"""
    verify_record: str | None = None
    """A signal record to annotate with a person's verified clear (claimwarden.io/verified-at)."""


def plan_clear(snapshot: Snapshot, ref: DeviceRef, *, verified: bool = False) -> ClearPlan:
    """What `clear` does: remove the annotation or delete the record; for the signals' record of the device, only
    with `verified` (a person checked the device): the annotation claimwarden.io/verified-at, after which the
    signals controller recovers it and never counts older observations again. Deleting it would lose that history
    and the next reconcile would mark the device again from the same observations."""
    from claimwarden.signals.records import is_signal_record, signal_record_name

    signal = next((r for r in snapshot.records if is_signal_record(r)
                   and (r.get("metadata") or {}).get("name") == signal_record_name(ref)), None)
    if verified:
        if signal is None:
            raise MarkError(f"{ref} has no signal record ({signal_record_name(ref)}): --verified clears only marks "
                            "made from health signals")
        return ClearPlan(verify_record=signal["metadata"]["name"])
    others = [r for r in snapshot.records if r is not signal and records.record_ref(r) == ref]
    derived = [r for r in others if records.record_source(r) == records.SOURCE_SIBLING]
    others = [r for r in others if r not in derived]
    if derived and not others and signal is None:
        origins = ", ".join(sorted(str(o.get("name")) for r in derived
                                   for o in (r.get("metadata") or {}).get("ownerReferences") or []))
        raise MarkError(f"{ref} is marked as a sibling of a marked whole device (record {origins}); clear that "
                        "device, or mark it with scope Device")
    if signal is not None and not others:
        raise MarkError(f"{ref} was marked from health signals (record {signal['metadata']['name']}); after checking "
                        "the device, clear it with --verified")
    record = others[0] if others else None
    if record is None:
        raise MarkError(f"{ref} is not marked (no UnhealthyDevice record names it)")
    if records.is_from_annotation(record):
        key = f"{records.ANNOTATION_PREFIX}{ref.device}"
        for slice_ in snapshot.slices:
            spec = slice_.get("spec") or {}
            if spec.get("driver") == ref.driver and (spec.get("pool") or {}).get("name") == ref.pool \
                    and key in ((slice_.get("metadata") or {}).get("annotations") or {}):
                return ClearPlan(remove_annotation=(slice_["metadata"]["name"], key))
    return ClearPlan(delete_record=record["metadata"]["name"])


@dataclass(frozen=True)
class Preview:
    """What marking a device NoExecute would evict now (`mark --dry-run`), computed like claimwarden does."""

    evict: tuple[str, ...]
    """The pods ("namespace/name") that would be evicted, sorted."""
    tolerating: int
    """Pods on the device whose claims tolerate the taint forever."""


def preview(snapshot: Snapshot, ref: DeviceRef) -> Preview:
    """The pods a NoExecute mark of `ref` would evict, by the health controller's own plan."""
    from claimwarden.health.groups import members_of
    from claimwarden.health.plan import plan_record
    from claimwarden.health.tolerations import copies_tolerations

    record = {"metadata": {"name": records.record_name(ref)},
              "spec": {"driver": ref.driver, "pool": ref.pool, "device": ref.device, "effect": "NoExecute"}}
    pods = {(str((p.get("metadata") or {}).get("namespace")), str((p.get("metadata") or {}).get("name"))): p
            for p in snapshot.pods}
    decided = plan_record(record, snapshot.claims, pods, snapshot.now, snapshot.claimwarden_namespace,
                          server_copies_tolerations=copies_tolerations(snapshot.claims),
                          podgroup_members=members_of(snapshot.pods))
    return Preview(tuple(sorted(f"{e.namespace}/{e.pod}" for e in decided.evict)), decided.tolerated)


def derived_records(snapshot: Snapshot, origin: Obj) -> list[Obj]:
    """The records derived for the siblings of `origin` (health/siblings.py), by name: an approval of a whole
    device's mark is one of its siblings' evictions too (their pods are the ones the breaker holds back)."""
    uid = str((origin.get("metadata") or {}).get("uid") or "")
    found = []
    for record in snapshot.records:
        if records.record_source(record) != records.SOURCE_SIBLING:
            continue
        owners = (record.get("metadata") or {}).get("ownerReferences") or []
        if uid and any(isinstance(o, dict) and o.get("controller") and o.get("uid") == uid for o in owners):
            found.append(record)
    return sorted(found, key=lambda r: str((r.get("metadata") or {}).get("name") or ""))


def approval(record: Obj, username: str) -> dict[str, Any]:
    """The merge patch that approves a record's evictions past the breaker, as `username`, for the record's
    generation as read (the spec the user is shown).

    The ValidatingAdmissionPolicy in manifests/approval refuses it unless the user is in the approvers group,
    the name is the user's own, and the generation is still the record's, so the record's status.approval can
    say who approved what.
    """
    from claimwarden.health.approval import APPROVED_BY, APPROVED_GENERATION

    name = (record.get("metadata") or {}).get("name")
    if not username:
        raise MarkError(f"cannot approve record {name!r}: the cluster did not say who you are")
    generation = (record.get("metadata") or {}).get("generation")
    if generation is None:
        raise MarkError(f"cannot approve record {name!r}: it shows no metadata.generation")
    return {"metadata": {"annotations": {APPROVED_BY: username, APPROVED_GENERATION: str(generation)}}}
