"""Node conditions (Node Problem Detector, vendor plugins) -> observations, a coarse fallback.

A condition is about a node, not a device: it stands for every device the node holds (of the
drivers a rule names). Each condition is an observation keyed by its ``lastTransitionTime``, so the
same condition seen again (a heartbeat, a re-list) is the same observation, Unhealthy whatever its
status; the policy's rules pick the condition types and statuses that mean a fault (``Ready`` is
normally ``True``, Node Problem Detector's conditions ``False``), which is why a NodeCondition rule
must list its ``values`` (``policy.parse_policy``, the CRD).

Pure functions over plain dicts in the raw Kubernetes JSON shape.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from claimwarden.health.records import DeviceRef
from claimwarden.signals.keys import bounded
from claimwarden.signals.observations import MESSAGE_MAX, SOURCE_NODE, UNHEALTHY, Observation
from claimwarden.timestamps import format_rfc3339, parse_rfc3339


def condition_observations(node: str, conditions: Sequence[Mapping[str, Any]]) -> list[Observation]:
    """One observation per condition with a type, a status and a lastTransitionTime (others skipped).

    Its value is the condition's status (True/False/Unknown) and its time the lastTransitionTime.
    """
    found = []
    for condition in conditions:
        if not isinstance(condition, Mapping):
            continue
        kind, status = condition.get("type"), condition.get("status")
        at = parse_rfc3339(condition.get("lastTransitionTime"))
        if not (isinstance(kind, str) and kind and isinstance(status, str) and status and at is not None):
            continue
        reason, message = condition.get("reason"), condition.get("message")
        text = ": ".join(t for t in (reason, message) if isinstance(t, str) and t)
        found.append(Observation(
            source=SOURCE_NODE, signal=kind, value=status, state=UNHEALTHY, at=at,
            key=bounded(f"{node}/{kind}@{format_rfc3339(at)}"),
            message=(f"node {node}: {kind}={status}" + (f" ({text})" if text else ""))[:MESSAGE_MAX]))
    return found


def devices_of_node(node: str, slices: Iterable[Mapping[str, Any]]) -> list[DeviceRef]:
    """The devices that node holds: every device of a slice with ``spec.nodeName`` == node, and the
    devices with that ``nodeName`` of slices with ``spec.perDeviceNodeSelection``. Sorted, each once.

    Pass complete pools' slices (taints.complete_pools) to leave out devices of older generations.
    """
    found: set[DeviceRef] = set()
    for item in slices:
        spec = item.get("spec")
        if not isinstance(spec, Mapping):
            continue
        driver, pool = spec.get("driver"), spec.get("pool")
        name = pool.get("name") if isinstance(pool, Mapping) else None
        devices = spec.get("devices")
        if not (isinstance(driver, str) and driver and isinstance(name, str) and name and isinstance(devices, list)):
            continue
        whole = spec.get("nodeName") == node
        per_device = spec.get("perDeviceNodeSelection") is True
        for device in devices:
            if not isinstance(device, Mapping) or not isinstance(device.get("name"), str) or not device["name"]:
                continue
            if whole or (per_device and device.get("nodeName") == node):
                found.add(DeviceRef(driver, name, device["name"]))
    return sorted(found, key=lambda ref: (ref.driver, ref.pool, ref.device))
