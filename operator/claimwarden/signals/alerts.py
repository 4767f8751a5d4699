"""Alertmanager's webhook payload, and which device an alert is about; pure.

Alertmanager posts a group of alerts as JSON (`version: "4"`, `alerts[]` with `status`, `labels`,
`annotations`, `startsAt`, `endsAt`, `fingerprint`). An alert becomes an observation of one device:

- a *firing* alert is an Unhealthy observation, at its `startsAt`, keyed `{fingerprint}@{startsAt}` so that
  Alertmanager's repeated notifications (every group change, every repeat_interval) are one observation;
- a *resolved* alert is never an observation: an exporter that crashes also "resolves" its alerts, so
  resolving is not a healthy signal (docs/guides/alerting.md "The Alertmanager webhook").

The device comes from the alert's labels, in this order:

1. `dra_driver_name`, `dra_pool_name`, `dra_device_name`: dcgm-exporter adds them (KUBERNETES_ENABLE_DRA)
   to the series of GPUs allocated through DRA, and Prometheus keeps them on the alert;
2. `UUID` and `Hostname`: every dcgm-exporter series carries them, allocated or not; the device is the one
   whose attribute `uuid` (in any domain: `uuid`, `gpu.nvidia.com/uuid`) has that value, on a ResourceSlice
   of the node `Hostname`;
3. `claimwarden_device: driver/pool/device`, for any other alert a rule wants to point at a device (the pool
   may contain '/': the driver is before the first '/', the device after the last).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from claimwarden.health.records import DeviceRef
from claimwarden.timestamps import format_rfc3339, parse_rfc3339

from .observations import MESSAGE_MAX, SOURCE_ALERT, UNHEALTHY, Observation

PAYLOAD_VERSION = "4"
FIRING, RESOLVED = "firing", "resolved"

DRA_DRIVER, DRA_POOL, DRA_DEVICE = "dra_driver_name", "dra_pool_name", "dra_device_name"
UUID_LABEL, HOSTNAME_LABEL = "UUID", "Hostname"
DEVICE_LABEL = "claimwarden_device"
# The observation's value: the XID code of dcgm-exporter's series (label `xid`), else a rule's own `code`.
VALUE_LABELS = ("xid", "code")
UUID_ATTRIBUTE = "uuid"
# Within what a record's status.observations[] accepts (the HealthPolicy and UnhealthyDevice CRDs).
NAME_MAX = 253  # alertname (the signal) and the value
FINGERPRINT_MAX = 128  # Alertmanager's are 16 hex digits


@dataclass(frozen=True)
class Alert:
    status: str  # FIRING | RESOLVED
    labels: Mapping[str, str]
    annotations: Mapping[str, str] = field(default_factory=dict)
    starts_at: datetime | None = None  # None only for an alert parse_payload would refuse
    fingerprint: str = ""


def _string_map(value: object) -> dict[str, str] | None:
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        return None
    return dict(value)


def labels_fingerprint(labels: Mapping[str, str]) -> str:
    """A stable stand-in for an alert without `fingerprint` (Alertmanager's is also a hash of the labels)."""
    text = json.dumps(sorted(labels.items()), separators=(",", ":"))
    return "labels:" + hashlib.sha256(text.encode()).hexdigest()[:16]


def _alert(index: int, item: object) -> tuple[Alert | None, str | None]:
    where = f"alerts[{index}]"
    if not isinstance(item, dict):
        return None, f"{where} is not an object"
    status = item.get("status")
    if status not in (FIRING, RESOLVED):
        return None, f"{where}.status is {status!r}, not 'firing' or 'resolved'"
    labels = _string_map(item.get("labels"))
    if labels is None:
        return None, f"{where}.labels is not an object of strings"
    annotations = _string_map(item.get("annotations", {}))
    if annotations is None:
        return None, f"{where}.annotations is not an object of strings"
    starts_at = parse_rfc3339(item.get("startsAt"))
    if starts_at is None:
        return None, f"{where}.startsAt is not an RFC 3339 date-time: {item.get('startsAt')!r}"
    fingerprint = item.get("fingerprint", "")
    if not isinstance(fingerprint, str) or len(fingerprint) > FINGERPRINT_MAX:
        return None, f"{where}.fingerprint is not a string of at most {FINGERPRINT_MAX} characters"
    return Alert(status=status, labels=labels, annotations=annotations, starts_at=starts_at,
                 fingerprint=fingerprint or labels_fingerprint(labels)), None


def parse_payload(body: bytes) -> tuple[list[Alert], str | None]:
    """The alerts of one webhook call, or ([], why) when the body is not a version 4 payload.

    One malformed alert refuses the whole call (400: Alertmanager does not retry it), so that a payload
    is either recorded whole or not at all.
    """
    try:
        payload: Any = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        return [], f"the body is not JSON: {exc}"
    if not isinstance(payload, dict):
        return [], "the body is not a JSON object"
    if payload.get("version") != PAYLOAD_VERSION:
        return [], f"version is {payload.get('version')!r}; claimwarden reads Alertmanager's version '4'"
    items = payload.get("alerts")
    if not isinstance(items, list):
        return [], "alerts is not a list"
    alerts: list[Alert] = []
    for index, item in enumerate(items):
        alert, why = _alert(index, item)
        if alert is None:
            return [], why
        alerts.append(alert)
    return alerts, None


def _split_device(text: str) -> DeviceRef | None:
    """`driver/pool/device`, the pool possibly containing '/'."""
    driver, _, rest = text.partition("/")
    pool, _, device = rest.rpartition("/")
    if not (driver and pool and device):
        return None
    return DeviceRef(driver, pool, device)


def _generation(slice_: Mapping[str, Any]) -> int:
    value = ((slice_.get("spec") or {}).get("pool") or {}).get("generation")
    return value if isinstance(value, int) else 0


def _device_node(slice_spec: Mapping[str, Any], device: Mapping[str, Any]) -> str | None:
    node = device.get("nodeName") if slice_spec.get("perDeviceNodeSelection") else slice_spec.get("nodeName")
    return node if isinstance(node, str) else None


def _uuid_of(device: Mapping[str, Any]) -> str | None:
    for name, attribute in (device.get("attributes") or {}).items():
        if isinstance(name, str) and name.rpartition("/")[2] == UUID_ATTRIBUTE and isinstance(attribute, dict):
            value = attribute.get("string")
            if isinstance(value, str):
                return value
    return None


def device_by_uuid(uuid: str, hostname: str, slices: Iterable[Mapping[str, Any]]) -> DeviceRef | None:
    """The device on node `hostname` whose `uuid` attribute is `uuid` (GPU UUIDs compare case-insensitively).

    Only a pool's newest generation counts (a driver re-publishing its slices leaves older ones behind
    for a moment); two different devices claiming one UUID resolve to none.
    """
    wanted = uuid.casefold()
    found: dict[DeviceRef, int] = {}
    newest: dict[tuple[str, str], int] = {}
    for slice_ in slices:
        spec = slice_.get("spec") or {}
        driver, pool = spec.get("driver"), (spec.get("pool") or {}).get("name")
        if not (isinstance(driver, str) and isinstance(pool, str)):
            continue
        generation = _generation(slice_)
        newest[(driver, pool)] = max(newest.get((driver, pool), generation), generation)
        if not spec.get("perDeviceNodeSelection") and spec.get("nodeName") != hostname:
            continue  # another node's slice: its devices need not be looked at
        for device in spec.get("devices") or []:
            name = device.get("name")
            if (isinstance(name, str) and _device_node(spec, device) == hostname
                    and (_uuid_of(device) or "").casefold() == wanted):
                ref = DeviceRef(driver, pool, name)
                found[ref] = max(found.get(ref, generation), generation)
    current = {ref for ref, generation in found.items() if generation == newest[(ref.driver, ref.pool)]}
    return next(iter(current)) if len(current) == 1 else None


def resolve_device(alert: Alert, slices: Iterable[Mapping[str, Any]]) -> DeviceRef | None:
    """The device an alert is about (module docstring: dra_* labels, else UUID + Hostname, else
    claimwarden_device); None when no way names one."""
    labels = alert.labels
    driver, pool, device = labels.get(DRA_DRIVER), labels.get(DRA_POOL), labels.get(DRA_DEVICE)
    if driver and pool and device:
        return DeviceRef(driver, pool, device)
    uuid, hostname = labels.get(UUID_LABEL), labels.get(HOSTNAME_LABEL)
    if uuid and hostname:
        ref = device_by_uuid(uuid, hostname, slices)
        if ref is not None:
            return ref
    named = labels.get(DEVICE_LABEL)
    return _split_device(named) if named else None


def observation_key(alert: Alert) -> str:
    assert alert.starts_at is not None
    return f"{alert.fingerprint}@{format_rfc3339(alert.starts_at)}"


def alert_observation(alert: Alert) -> Observation | None:
    """A firing alert as an Unhealthy observation; None for a resolved one (resolving is not recovery) and for
    one without an alertname (no rule could name it; Prometheus always sets it)."""
    signal = alert.labels.get("alertname", "")
    if alert.status != FIRING or alert.starts_at is None or not signal or len(signal) > NAME_MAX:
        return None
    value = next((alert.labels[label] for label in VALUE_LABELS if alert.labels.get(label)), "")[:NAME_MAX]
    message = alert.annotations.get("summary") or alert.annotations.get("description") or ""
    return Observation(source=SOURCE_ALERT, signal=signal, value=value,
                       state=UNHEALTHY, at=alert.starts_at, key=observation_key(alert),
                       message=" ".join(message.split())[:MESSAGE_MAX])
