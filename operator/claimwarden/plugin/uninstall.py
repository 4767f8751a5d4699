"""uninstall --check: which marked devices an uninstall would hand back to the scheduler. Pure, over a `Snapshot`.

What keeps new work off a marked device, and what takes each away (docs/installation.md "Uninstalling"):

- its quarantine claim in claimwarden's namespace: deleting the namespace deletes it;
- claimwarden's DeviceTaintRule (owned by the record): deleting the CRDs deletes the records, and the garbage
  collector the rule;
- a DeviceTaintRule owned by no record (a person's, or a handed-over one) with effect NoSchedule or NoExecute:
  nothing of claimwarden's removal takes it away.

The removal steps are taken in the documented order: claimwarden (its Deployment), then the namespace, then the
CRDs. Removing claimwarden alone deletes nothing, but a device that other claims hold as well is forgotten by the
scheduler when they let go (the quarantine trap, health/__init__.py rule 1), and nobody re-asserts the quarantine.

uninstall --hand-over, where DeviceTaintRule is served, writes for each marked device that no lasting rule keeps
off a NoSchedule DeviceTaintRule owned by nothing (``hand_over_rules``): it outlives claimwarden, its namespace and
its CRDs, and is deleted by hand once the device is repaired. Running it again writes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from claimwarden.health.records import KIND as RECORD_KIND
from claimwarden.health.records import NAME_MAX, TAINT_KEY, TAINT_VALUE, DeviceRef, record_name, truncate_name

from .snapshot import DeviceId, Obj, Snapshot, name_of

STEPS = ("claimwarden", "namespace", "crds")
"""The removal steps, in the documented order."""
MARKING_EFFECTS = ("NoSchedule", "NoExecute")
HANDED_OVER_LABEL = "claimwarden.io/handed-over"
DEVICE_ANNOTATION = "claimwarden.io/device"
REASON_ANNOTATION = "claimwarden.io/reason"
HANDED_OVER_PREFIX = "handed-over-"
_NARROWING = ("deviceClassName", "selectors")  # not evaluated here: such a rule is not counted as keeping a device


@dataclass(frozen=True)
class Release:
    """One marked device and what keeps new work off it now."""

    device: DeviceId
    node: str
    effect: str
    reason: str
    records: tuple[str, ...]
    quarantine_claims: tuple[str, ...]
    claimwarden_rules: tuple[str, ...]
    lasting_rules: tuple[str, ...]
    """DeviceTaintRules owned by no record: they outlive the uninstall."""
    other_holders: tuple[str, ...]
    released_by: str | None
    """The first removal step (STEPS) after which nothing keeps new work off the device; None: it stays kept off."""

    def as_dict(self) -> dict[str, object]:
        return {"device": "/".join(self.device), "node": self.node, "effect": self.effect, "reason": self.reason,
                "records": list(self.records), "quarantineClaims": list(self.quarantine_claims),
                "claimwardenTaintRules": list(self.claimwarden_rules), "lastingTaintRules": list(self.lasting_rules),
                "otherHolders": list(self.other_holders), "releasedBy": self.released_by}


@dataclass(frozen=True)
class Plan:
    releases: list[Release] = field(default_factory=list)
    taint_rules_served: bool = False

    @property
    def freed(self) -> list[Release]:
        """The marked devices some removal step hands back to the scheduler."""
        return [r for r in self.releases if r.released_by]

    def as_dict(self) -> dict[str, object]:
        return {"devices": [r.as_dict() for r in self.releases], "wouldRelease": len(self.freed),
                "taintRulesServed": self.taint_rules_served}


def rule_keeps_off(rule: Obj, device: DeviceId) -> bool:
    """Whether a DeviceTaintRule keeps new pods off the device: effect NoSchedule or NoExecute and a selector whose
    driver, pool and device fields (those set) match. Rules narrowed by a device class or CEL are not evaluated and
    not counted (the check errs towards saying a device would be freed)."""
    spec = rule.get("spec") or {}
    if ((spec.get("taint") or {}).get("effect")) not in MARKING_EFFECTS:
        return False
    selector = spec.get("deviceSelector") or {}
    if any(selector.get(name) for name in _NARROWING):
        return False
    return all(not selector.get(name) or selector.get(name) == value
               for name, value in zip(("driver", "pool", "device"), device, strict=True))


def owned_by_record(rule: Obj) -> bool:
    return any(ref.get("kind") == RECORD_KIND for ref in (rule.get("metadata") or {}).get("ownerReferences") or [])


def _released_by(*, quarantine: bool, claimwarden_rules: bool, lasting_rules: bool, other_holders: bool) -> str | None:
    if lasting_rules:
        return None
    if claimwarden_rules:  # a rule of claimwarden's keeps pods off until the CRDs (and so the records) go
        return "crds"
    if other_holders:  # when they let go, the scheduler forgets the device and nobody re-asserts the quarantine
        return "claimwarden"
    return "namespace" if quarantine else "claimwarden"


def plan(snapshot: Snapshot) -> Plan:
    """Every device marked NoSchedule or NoExecute, in device order, with what keeps it and what would free it."""
    marks: dict[DeviceId, list[Obj]] = {}
    for record in snapshot.records:
        spec = record.get("spec") or {}
        if str(spec.get("effect") or "NoExecute") not in MARKING_EFFECTS:
            continue
        key = (str(spec.get("driver", "")), str(spec.get("pool", "")), str(spec.get("device", "")))
        marks.setdefault(key, []).append(record)
    rules = snapshot.taint_rules or []
    releases = []
    for device_id in sorted(marks):
        records = sorted(marks[device_id], key=name_of)
        strongest = next((r for r in records if (r.get("spec") or {}).get("effect", "NoExecute") == "NoExecute"),
                         records[0])
        holders = snapshot.holders.get(device_id, [])
        quarantine = tuple(sorted(h.ref for h in holders if h.quarantine))
        others = tuple(sorted(h.ref for h in holders if not h.quarantine))
        keeping = [r for r in rules if rule_keeps_off(r, device_id)]
        ours = tuple(sorted(name_of(r) for r in keeping if owned_by_record(r)))
        lasting = tuple(sorted(name_of(r) for r in keeping if not owned_by_record(r)))
        device = snapshot.device_index.get(device_id)
        releases.append(Release(
            device=device_id, node=(device.node_name if device else None) or "",
            effect=str((strongest.get("spec") or {}).get("effect") or "NoExecute"),
            reason=str((strongest.get("spec") or {}).get("reason") or ""),
            records=tuple(name_of(r) for r in records), quarantine_claims=quarantine, claimwarden_rules=ours,
            lasting_rules=lasting, other_holders=others,
            released_by=_released_by(quarantine=bool(quarantine), claimwarden_rules=bool(ours),
                                     lasting_rules=bool(lasting), other_holders=bool(others))))
    return Plan(releases, taint_rules_served=snapshot.taint_rules is not None)


def hand_over_rules(found: Plan, api_version: str) -> list[Obj]:
    """The DeviceTaintRules that keep each marked device off after the uninstall: one per device that no lasting rule
    keeps off yet. NoSchedule (a NoExecute rule would have upstream's eviction controller delete pods, past their
    PodDisruptionBudgets), claimwarden's taint key and value (a pod tolerating the mark tolerates this), no owner."""
    rules = []
    for release in found.releases:
        if release.lasting_rules:
            continue
        driver, pool, device = release.device
        rules.append({
            "apiVersion": api_version,
            "kind": "DeviceTaintRule",
            "metadata": {
                "name": hand_over_name(release.device),
                "labels": {HANDED_OVER_LABEL: "true"},
                "annotations": {DEVICE_ANNOTATION: "/".join(release.device),
                                REASON_ANNOTATION: f"{release.effect}: {release.reason}"},
            },
            "spec": {"deviceSelector": {"driver": driver, "pool": pool, "device": device},
                     "taint": {"key": TAINT_KEY, "value": TAINT_VALUE, "effect": "NoSchedule"}},
        })
    return rules


def hand_over_name(device: DeviceId) -> str:
    return truncate_name(HANDED_OVER_PREFIX + record_name(DeviceRef(*device)), NAME_MAX)


def report(found: Plan) -> list[str]:
    """The text report: one paragraph per marked device, then the verdict."""
    if not found.releases:
        return ["no marked devices: an uninstall releases nothing"]
    lines = []
    for release in found.releases:
        lines.append(f"{'/'.join(release.device)} (node {release.node or '-'}): marked {release.effect}"
                     + (f" ({release.reason})" if release.reason else "")
                     + f"; record(s) {', '.join(release.records)}")
        lines.append("  kept off by: " + (", ".join(
            [f"quarantine claim {c}" for c in release.quarantine_claims]
            + [f"claimwarden's devicetaintrule {r}" for r in release.claimwarden_rules]
            + [f"devicetaintrule {r} (outlives the uninstall)" for r in release.lasting_rules]) or "nothing"))
        if release.other_holders:
            lines.append(f"  also held by: {', '.join(release.other_holders)}")
        lines.append("  " + _verdict(release.released_by))
    freed = found.freed
    lines.append(f"{len(freed)} of {len(found.releases)} marked device(s) would go back to the scheduler"
                 + ("" if found.taint_rules_served else
                    "; this cluster serves no DeviceTaintRule, so only repair or clearing the marks keeps them safe"))
    return lines


def _verdict(step: str | None) -> str:
    return {
        None: "stays kept off after the uninstall",
        "claimwarden": "released once claimwarden stops (no quarantine claim that lasts, or other claims hold it: "
                       "when they let go, the scheduler forgets the device and nobody re-asserts the quarantine)",
        "namespace": "released when claimwarden's namespace is deleted (its quarantine claim goes with it)",
        "crds": "released when the CRDs are deleted (the records go, and the garbage collector deletes "
                "claimwarden's DeviceTaintRule)",
    }[step]
