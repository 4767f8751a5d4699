"""devices: one row per published device, as people think of them: node, pool, device, model,
state and who holds it. Pure functions over a `Snapshot`.

States: `free`; `allocated` (a user's claim holds it); `marked` (an UnhealthyDevice record names
it and it is not parked, e.g. a dry run, or pods still hold it); `quarantined` (only claimwarden's
quarantine claim holds it).
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass

from .snapshot import Device, Snapshot

STATES = ("free", "allocated", "marked", "quarantined")


@dataclass(frozen=True)
class DeviceRow:
    node: str
    driver: str
    pool: str
    device: str
    model: str
    state: str
    holder: str
    claim: str
    reason: str
    siblings: str = ""
    """The other devices of its fault domain, comma-separated (a mark of the whole device takes them along)."""

    def as_dict(self) -> dict[str, str]:
        return asdict(self)


class SelectorError(ValueError):
    """A malformed -l selector."""


_REQUIREMENT = re.compile(r"^\s*(!?)([A-Za-z0-9_./-]+)\s*(?:(==|=|!=)\s*([A-Za-z0-9_.+-]*))?\s*$")


def parse_selector(text: str) -> list[tuple[str, str, str | None]]:
    """`model=H100,index!=3,!uuid` -> [(name, op, value)]; op is =, !=, exists or !exists."""
    out: list[tuple[str, str, str | None]] = []
    for part in [p for p in text.split(",") if p.strip()]:
        match = _REQUIREMENT.match(part)
        if not match:
            raise SelectorError(f"cannot parse -l {text!r} at {part.strip()!r}; use name=value, name!=value, name "
                                "or !name, comma-separated (names are device attributes, e.g. model=H100)")
        negate, name, op, value = match.groups()
        if op:
            if negate:
                raise SelectorError(f"cannot parse -l {text!r}: '!' goes only before a bare name")
            out.append((name, "!=" if op == "!=" else "=", value.strip()))
        else:
            out.append((name, "!exists" if negate else "exists", None))
    return out


def _matches(device: Device, requirements: list[tuple[str, str, str | None]]) -> bool:
    for name, op, value in requirements:
        actual = device.attribute(name)
        text = None if actual is None else (str(actual).lower() if isinstance(actual, bool) else str(actual))
        if op == "exists" and text is None:
            return False
        if op == "!exists" and text is not None:
            return False
        if op == "=" and text != value:
            return False
        if op == "!=" and text == value:
            return False
    return True


def rows(snapshot: Snapshot) -> list[DeviceRow]:
    out = []
    for device in snapshot.devices:
        holders = snapshot.holders.get(device.id, [])
        users = [h for h in holders if not h.quarantine]
        record = snapshot.records_by_device.get(device.id)
        parked = any(h.quarantine for h in holders)
        if record is not None and (users or not parked):
            state = "marked"
        elif parked and not users:
            state = "quarantined"
        elif users:
            state = "allocated"
        else:
            state = "free"
        pods = [p for h in users for p in h.pods]
        node = device.node_name or ("<all nodes>" if device.node_spec.get("allNodes") else "<selector>")
        out.append(DeviceRow(node, device.driver, device.pool, device.name, device.model, state,
                             ",".join(pods), ",".join(h.ref for h in (users or holders)),
                             str(((record or {}).get("spec") or {}).get("reason") or ""),
                             ",".join(snapshot.fault_domains.get(device.id, []))))
    return out


def select(all_rows: list[DeviceRow], snapshot: Snapshot, *, node: str | None = None, state: str | None = None,
           selector: str | None = None) -> list[DeviceRow]:
    """Filter by node, state and attribute selector (-l)."""
    requirements = parse_selector(selector) if selector else []
    by_id = snapshot.device_index
    out = []
    for row in all_rows:
        if node and row.node != node:
            continue
        if state and row.state != state:
            continue
        if requirements and not _matches(by_id[(row.driver, row.pool, row.device)], requirements):
            continue
        out.append(row)
    return out
