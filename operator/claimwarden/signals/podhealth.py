"""KEP-4680 pod status (``status.containerStatuses[].allocatedResourcesStatus``) -> observations.

The kubelet reports, per container, the health of each DRA device allocated to it:

    allocatedResourcesStatus:
    - name: claim:<claim>/<request>          (or claim:<claim>; <claim> is the container's claim
      resources:                               reference, pod.spec.resourceClaims[].name, not the
      - resourceID: <driver>/<pool>/<device>   ResourceClaim's name: the apiserver refuses that)
        health: Healthy | Unhealthy | Unknown
        message: ...                           (kept from 1.36, gate ResourceHealthStatusMessage)

A pool name may hold '/': the driver ends at the first '/', the device starts after the last.

Only allocated devices are covered, and ``Unknown`` means the signal was lost (never a reason to
evict; the policy counts it). A pod status has no time per entry, so an observation is dated when
claimwarden first sees a health, and a new one is made only when the health of a (pod, container,
device) changes. The gate is ``ResourceHealthStatus`` (beta, on since 1.36; the apiserver drops the
field while it is off).

Pure functions over plain dicts in the raw Kubernetes JSON shape.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from claimwarden.health.records import DeviceRef
from claimwarden.signals.keys import bounded
from claimwarden.signals.observations import (
    HEALTHY,
    MESSAGE_MAX,
    SOURCE_POD,
    UNHEALTHY,
    UNKNOWN,
    Observation,
)

SIGNAL = "allocatedResourcesStatus"
CLAIM_PREFIX = "claim:"
HEALTHS = (HEALTHY, UNHEALTHY, UNKNOWN)


@dataclass(frozen=True)
class DeviceHealth:
    """One device's health as one container of one pod reports it."""

    ref: DeviceRef
    key: str
    """``"{pod uid}/{container}/{resourceID}"``: the identity of this report across status updates."""
    health: str
    message: str


def parse_resource_id(text: object) -> DeviceRef | None:
    """``"<driver>/<pool>/<device>"`` -> the device; None unless all three parts are non-empty."""
    if not isinstance(text, str):
        return None
    driver, _, rest = text.partition("/")
    pool, _, device = rest.rpartition("/")
    if not (driver and pool and device):
        return None
    return DeviceRef(driver, pool, device)


def _list(value: object) -> list[Any]:
    return value if isinstance(value, list) else []


def pod_device_health(pod: Mapping[str, Any]) -> list[DeviceHealth]:
    """Every DRA device health the pod's containers and init containers report.

    Entries that are not claims (device-plugin resources), resource IDs that do not name a device,
    health values other than Healthy/Unhealthy/Unknown and a pod without a UID give nothing.
    """
    metadata = pod.get("metadata")
    uid = metadata.get("uid") if isinstance(metadata, Mapping) else None
    status = pod.get("status")
    if not isinstance(uid, str) or not uid or not isinstance(status, Mapping):
        return []
    found: list[DeviceHealth] = []
    for field in ("initContainerStatuses", "containerStatuses"):
        for container in _list(status.get(field)):
            name = container.get("name") if isinstance(container, Mapping) else None
            if not isinstance(name, str) or not name:
                continue
            for entry in _list(container.get("allocatedResourcesStatus")):
                if not isinstance(entry, Mapping):
                    continue
                claim = entry.get("name")
                if not isinstance(claim, str) or not claim.startswith(CLAIM_PREFIX):
                    continue
                for resource in _list(entry.get("resources")):
                    if not isinstance(resource, Mapping):
                        continue
                    resource_id, health = resource.get("resourceID"), resource.get("health")
                    ref = parse_resource_id(resource_id)
                    if ref is None or health not in HEALTHS:
                        continue
                    message = resource.get("message")
                    found.append(DeviceHealth(
                        ref=ref, key=bounded(f"{uid}/{name}/{resource_id}"), health=str(health),
                        message=message[:MESSAGE_MAX] if isinstance(message, str) else ""))
    return found


def pod_health_observations(entries: Sequence[DeviceHealth], previous: Sequence[Observation],
                            now: datetime) -> list[Observation]:
    """The observations that the health reports of ONE device add to what its record holds.

    A report is new when its health differs from the newest observation with its key (or there is
    none: a new pod's first Healthy report is an observation too, since recovery waits for Healthy
    reports; the caller decides whether a device without a record needs one). Reports with the same
    key count once (the last wins).
    """
    newest: dict[str, Observation] = {}
    for observation in sorted((o for o in previous if o.source == SOURCE_POD), key=lambda o: (o.at, o.key)):
        newest[observation.key] = observation
    latest: dict[str, DeviceHealth] = {}
    for entry in entries:
        latest[entry.key] = entry
    new = []
    for key, entry in latest.items():
        last = newest.get(key)
        if last is not None and last.state == entry.health:
            continue
        message = entry.message or f"the kubelet reports {entry.ref} {entry.health}"
        new.append(Observation(source=SOURCE_POD, signal=SIGNAL, value=entry.health, state=entry.health,
                               at=now, key=key, message=message[:MESSAGE_MAX]))
    return new
