"""NVSentinel's ExternalFault: which faults claimwarden hands to NVSentinel, the object it creates, and when
a fault counts as repaired (pure).

The contract is NVSentinel's ADR-049 (``docs/designs/049-external-fault.md``; the CRD as claimwarden's tests
apply it is ``tests/integration/nvsentinel/externalfaults.yaml``, with its provenance in its header):

- cluster-scoped ``ExternalFault`` in ``nvsentinel.dgxc.nvidia.com/v1``; ``spec.healthEvent`` is NVSentinel's
  HealthEvent (nodeName, agent, checkName, isFatal, entitiesImpacted[{entityType, entityValue}], ...);
- NVSentinel's validating webhook refuses a second *active* ExternalFault for a node (status.completionTime
  unset), and ``spec.healthEvent.nodeName`` is immutable;
- ``status.conditions[type=FaultCleared]`` turns True once NVSentinel's repair completed and it retracted the
  fault; ``status.completionTime`` is set then (or when an operator deletes the object).

claimwarden follows the webhook's rule itself (the lab has no webhook): at most one open request per node, its
own or another system's. A fault that arrives while one is open waits; it is handed off with the next request
once that one is cleared. Which record faults a request covers is in its annotation ``claimwarden.io/faults``
(a JSON list of ``<record uid>@<mark start>``): a record's fault is repaired when a request covering it is
cleared, and a later mark of the same record (a re-fault) is a new fault.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from claimwarden.health.plan import slice_node
from claimwarden.health.records import DeviceRef, label_value, record_effect, short_hash, to_subdomain_part
from claimwarden.timestamps import format_rfc3339

from .actions import NODE_SCOPED, Recommendation

GROUP, VERSION, PLURAL, KIND = "nvsentinel.dgxc.nvidia.com", "v1", "externalfaults", "ExternalFault"
API_VERSION = f"{GROUP}/{VERSION}"
NODE_LABEL = "claimwarden.io/node"
FAULTS_ANNOTATION = "claimwarden.io/faults"
MANAGED_BY = {"app.kubernetes.io/managed-by": "claimwarden"}
AGENT = "claimwarden"
CHECK_NAME = "ClaimwardenDeviceFault"
CLEARED = "FaultCleared"
GPU_UUID = "GPU_UUID"
UUID_ATTRIBUTES = ("parentUUID", "uuid")
"""Where a device names its physical GPU: a partition's parent first (the repair resets the whole GPU)."""
MESSAGE_MAX = 1024
MARKED = ("NoExecute", "NoSchedule")
"""The effects of a record that marks its device: only those can be node-scoped."""


@dataclass(frozen=True)
class Fault:
    """One record's node-scoped fault, ready to hand off."""

    record: str          # the record's name
    key: str             # "<uid>@<mark start>": this mark of this record
    node: str
    gpu_uuid: str | None
    action: str
    why: str             # the record's reason and where the action came from


def node_scoped(record: Mapping[str, Any], recommendation: Recommendation, *, node_condition: bool) -> bool:
    """True for a fault whose repair takes its node: a marked record (NoExecute, NoSchedule) whose recommended
    action is NodeReboot or Drain, or whose mark a node's condition made (`node_condition`: the deciding rule's
    source is NodeCondition) and that nothing named a repair for (a person's or the rule's None or GpuReset wins).
    A GpuReset of one device is the driver's or the node agent's, not a node repair."""
    if record_effect(dict(record)) not in MARKED:
        return False
    return recommendation.action in NODE_SCOPED or (node_condition and not recommendation.named)


def fault_key(record: Mapping[str, Any]) -> str:
    """This mark of this record: its uid and when the mark began. A signal record's marks come and go
    (status.recovery.markedSince); any other record is one mark for its life (its creation: a time that never
    changes, unlike status.markedAt, which the health controller writes a moment after the record appears)."""
    meta, status = record.get("metadata") or {}, record.get("status") or {}
    since = (status.get("recovery") or {}).get("markedSince") or meta.get("creationTimestamp") or ""
    return f"{meta.get('uid', '')}@{since}"


def device_node(ref: DeviceRef, slices: Iterable[Mapping[str, Any]]) -> tuple[str, Mapping[str, Any]] | None:
    """The node of a published device (health.plan.slice_node) and its slice entry, or None."""
    slices = list(slices)
    node = slice_node(slices, ref)  # type: ignore[arg-type]
    if node is None:
        return None
    for slice_ in slices:
        spec = slice_.get("spec") or {}
        if spec.get("driver") == ref.driver and (spec.get("pool") or {}).get("name") == ref.pool:
            device = next((d for d in spec.get("devices") or [] if d.get("name") == ref.device), None)
            if device is not None:
                return node, device
    return None


def gpu_uuid(driver: str, device: Mapping[str, Any]) -> str | None:
    """The physical GPU's UUID a device publishes (attribute parentUUID, else uuid; bare or driver-qualified)."""
    attributes = device.get("attributes") or {}
    for name in UUID_ATTRIBUTES:
        for key in (name, f"{driver}/{name}"):
            value = (attributes.get(key) or {}).get("string")
            if value:
                return str(value)
    return None


def is_cleared(fault: Mapping[str, Any]) -> bool:
    return any(c.get("type") == CLEARED and c.get("status") == "True"
               for c in (fault.get("status") or {}).get("conditions") or [])


def is_open(fault: Mapping[str, Any]) -> bool:
    """Active as NVSentinel's webhook counts it: no completionTime; and not cleared (FaultCleared and the time
    are written together, but a reader may see one first)."""
    return not (fault.get("status") or {}).get("completionTime") and not is_cleared(fault)


def fault_node(fault: Mapping[str, Any]) -> str:
    return str((((fault.get("spec") or {}).get("healthEvent") or {}).get("nodeName")) or "")


def covered_keys(fault: Mapping[str, Any]) -> set[str]:
    """The record faults a request of claimwarden's covers (none for another system's, or a bad annotation)."""
    raw = ((fault.get("metadata") or {}).get("annotations") or {}).get(FAULTS_ANNOTATION)
    try:
        keys = json.loads(raw) if isinstance(raw, str) else []
    except ValueError:
        return set()
    return {str(k) for k in keys if isinstance(k, str)} if isinstance(keys, list) else set()


def fault_name(node: str, first_key: str) -> str:
    """``claimwarden-<node>-<hash>``: one name per node and first fault, so a retried create is the same object."""
    return f"claimwarden-{to_subdomain_part(node, 200).replace('.', '-')}-{short_hash(f'{node}/{first_key}')}"


def external_fault(node: str, faults: Sequence[Fault], now: datetime) -> dict[str, Any]:
    """The ExternalFault that hands the node's faults to NVSentinel.

    As ADR-049's example: recommendedAction CUSTOM with customRecommendedAction external-remediation (NVSentinel's
    ExternalFault reconciler re-emits the event with those anyway); what claimwarden recommends, and for which
    records, is in healthEvent.metadata."""
    ordered = sorted(faults, key=lambda f: f.key)
    uuids = sorted({f.gpu_uuid for f in ordered if f.gpu_uuid})
    actions = sorted({f.action for f in ordered})
    message = "; ".join(f"{f.record}: {f.why}" for f in ordered)
    return {
        "apiVersion": API_VERSION, "kind": KIND,
        "metadata": {"name": fault_name(node, ordered[0].key),
                     "labels": {NODE_LABEL: label_value(node), **MANAGED_BY},
                     "annotations": {FAULTS_ANNOTATION: json.dumps([f.key for f in ordered])}},
        "spec": {"healthEvent": {
            "version": 1, "agent": AGENT, "componentClass": "GPU", "checkName": CHECK_NAME,
            "isFatal": True, "isHealthy": False,
            "message": message if len(message) <= MESSAGE_MAX else message[:MESSAGE_MAX - 1] + "…",
            "recommendedAction": "CUSTOM", "customRecommendedAction": "external-remediation",
            "errorCode": actions,
            "entitiesImpacted": [{"entityType": GPU_UUID, "entityValue": uuid} for uuid in uuids],
            "metadata": {"claimwarden.io/recommendedAction": ",".join(actions),
                         "claimwarden.io/records": ",".join(sorted({f.record for f in ordered}))},
            "generatedTimestamp": format_rfc3339(now),
            "nodeName": node,
        }},
    }


@dataclass(frozen=True)
class NodePlan:
    create: dict[str, Any] | None   # the ExternalFault to create now, if any
    open: tuple[str, ...]           # the node's open requests (anyone's)
    waiting: tuple[str, ...]        # record faults not handed off yet (an open request of the node holds them)


def plan_node(node: str, faults: Sequence[Fault], existing: Iterable[Mapping[str, Any]], now: datetime) -> NodePlan:
    """What to do for one node: open a request for the faults no request covers yet, unless one is open."""
    on_node = [f for f in existing if fault_node(f) == node]
    covered = set().union(*(covered_keys(f) for f in on_node)) if on_node else set()
    open_names = tuple(sorted(str((f.get("metadata") or {}).get("name")) for f in on_node if is_open(f)))
    uncovered = [f for f in faults if f.node == node and f.key not in covered]
    if not uncovered:
        return NodePlan(None, open_names, ())
    if open_names:
        return NodePlan(None, open_names, tuple(sorted(f.key for f in uncovered)))
    return NodePlan(external_fault(node, uncovered, now), (), ())


def may_open(key: str, node: str, existing: Iterable[Mapping[str, Any]]) -> bool:
    """Whether a request may open for this record fault now: none covers it and the node has none open
    (plan_node's create can be non-None only then; the cheap test comes first)."""
    return not any(key in covered_keys(f) or (fault_node(f) == node and is_open(f)) for f in existing)


def recovery_hold(key: str, node: str, existing: Iterable[Mapping[str, Any]]) -> str | None:
    """Why a verified recovery of this record fault must wait, or None once a request covering it is cleared."""
    covering = [f for f in existing if key in covered_keys(f)]
    if any(is_cleared(f) for f in covering):
        return None
    if covering:
        names = ", ".join(sorted(str((f.get("metadata") or {}).get("name")) for f in covering))
        return f"its repair was handed to NVSentinel (ExternalFault {names}) and is not FaultCleared yet"
    return f"its repair is not handed to NVSentinel yet (node {node} has an open ExternalFault, or none was made)"
