"""Holders and taints: why a request may not take a device that its selectors let through.

A device's taints are its own plus those of every DeviceTaintRule that selects it (by driver, pool,
device, a DeviceClass's selectors and CEL selectors); since 1.34 every taint must be tolerated,
whatever its effect. A device's holders are the claims whose allocations name it
(`Snapshot.holders`), quarantine claims included. The texts here name both for the funnel's rows.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from claimwarden.cel import CelError

from .requests import class_selectors
from .snapshot import Device, DeviceId, Obj, Snapshot, name_of


def device_tolerates(tolerations: Iterable[Obj], taint: Obj) -> bool:
    """resourceclaim.ToleratesTaint: effect and key when set must be equal; Equal compares values."""
    for toleration in tolerations:
        if toleration.get("effect") and toleration["effect"] != taint.get("effect"):
            continue
        if toleration.get("key") and toleration["key"] != taint.get("key"):
            continue
        operator = toleration.get("operator") or "Equal"
        same_value = (toleration.get("value") or "") == (taint.get("value") or "")
        if operator == "Exists" or (operator == "Equal" and same_value):
            return True
    return False


def rule_taints(snapshot: Snapshot, *, matches: Callable[[Device, str], bool]) -> dict[DeviceId, list[Obj]]:
    """The taints of every DeviceTaintRule, by the devices each selects; `matches` evaluates one selector
    (raising CelError)."""
    found: dict[DeviceId, list[Obj]] = {}
    for rule in snapshot.taint_rules or []:
        spec = rule.get("spec") or {}
        taint = dict(spec.get("taint") or {}, rule=name_of(rule))
        for candidate in _rule_devices(snapshot, spec.get("deviceSelector"), matches):
            found.setdefault(candidate.id, []).append(taint)
    return found


def _rule_devices(snapshot: Snapshot, selector: Obj | None, matches: Callable[[Device, str], bool]) -> list[Device]:
    selector = selector or {}
    out = []
    for device in snapshot.devices:
        if any(selector.get(k) and selector[k] != v for k, v in
               (("driver", device.driver), ("pool", device.pool), ("device", device.name))):
            continue
        try:
            if selector.get("deviceClassName"):
                cls = snapshot.class_index.get(selector["deviceClassName"])
                if cls is None or not all(matches(device, e) for e in class_selectors(cls)):
                    continue
            if not all(matches(device, str((s.get("cel") or {}).get("expression", "")))
                       for s in selector.get("selectors") or []):
                continue
        except CelError:
            continue  # upstream reports it on the rule and leaves the device untainted
        out.append(device)
    return out


def holder_text(snapshot: Snapshot, ids: Iterable[DeviceId], exclude: str, limit: int = 4) -> str:
    """Who holds the devices, apart from the claim `exclude`: claims with their pods, quarantine claims named so."""
    claims: dict[str, list[str]] = {}
    quarantine: set[str] = set()
    for device_id in ids:
        for holder in snapshot.holders.get(device_id, []):
            if holder.ref == exclude:
                continue
            claims.setdefault(holder.ref, holder.pods)
            if holder.quarantine:
                quarantine.add(holder.ref)
    parts = []
    for ref, pods in list(claims.items())[:limit]:
        if ref in quarantine:
            parts.append(f"{ref} (quarantine claim)")
        else:
            parts.append(f"{ref} (pods {', '.join(pods)})" if pods else f"{ref} (no pod)")
    more = len(claims) - limit
    return "; ".join(parts) + (f"; and {more} more claims" if more > 0 else "")


def taints_text(dropped: list[Device], *, untolerated: Callable[[Device], list[Obj]]) -> str:
    """The funnel's row for the taints step: how many devices it dropped and the first taints, by name."""
    if not dropped:
        return ""
    taints = sorted({f"{t.get('key') or '(any key)'}" + (f"={t['value']}" if t.get("value") else "")
                     + f":{t.get('effect')}"
                     + (f" (DeviceTaintRule {t['rule']})" if t.get("rule") else "")
                     for d in dropped for t in untolerated(d)})
    return f"{len(dropped)} tainted without a toleration: " + ", ".join(taints[:3])
