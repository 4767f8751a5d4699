"""A record's recommended action: what a repair system should do about its device (pure).

Sources, the first that says something wins:

1. a person's ``spec.recommendedAction`` on the record;
2. the deciding HealthPolicy rule's ``recommendedAction`` (a signal record's ``status.decision.rule``);
3. the signal's documented default, from the newest Unhealthy observation the deciding rule matches
   (``signal_default``);
4. None.

A record whose effect is None (a dry run, a Shadow mark, a recovered signal record) recommends nothing:
a repair system must not reboot a node for a rule that is being tried out.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from claimwarden.health.records import record_effect
from claimwarden.signals.observations import SOURCE_ALERT, SOURCE_TAINT, UNHEALTHY, Observation
from claimwarden.signals.policy import REPAIR_ACTIONS, Rule

NONE, GPU_RESET, NODE_REBOOT, DRAIN = "None", "GpuReset", "NodeReboot", "Drain"
ACTIONS = REPAIR_ACTIONS  # (NONE, GPU_RESET, NODE_REBOOT, DRAIN)
"""Also the enum of the CRDs' recommendedAction fields (UnhealthyDevice spec and status, HealthPolicy rules)."""
NODE_SCOPED = (NODE_REBOOT, DRAIN)
"""Repairs that take the whole node: the faults claimwarden hands to a node-repair system (externalfaults)."""

XID_ACTIONS: Mapping[str, str] = {
    # NVIDIA's Xid catalogue (docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html), column
    # "Resolution Bucket (Immediate Action)": 8, 11 and 13 are RESTART_APP, the workload's to fix.
    "8": NONE, "11": NONE, "13": NONE,
    # 79, "GPU has fallen off the bus": the GPU no longer answers on PCIe, so no reset over the bus can reach it;
    # the catalogue's bucket is a bare-metal restart (RESTART_BM).
    "79": NODE_REBOOT,
}
"""The XIDs whose default claimwarden knows; any other XID recommends nothing unless a rule says so
(docs/guides/handoff-to-repair.md says which rows were checked against a stored copy of the catalogue)."""

RECOVERY_ACTIONS: Mapping[str, str] = {
    # NVML's nvmlDeviceGetRecoveryAction / DCGM field 1523 (DCGM_FI_DEV_GET_GPU_RECOVERY_ACTION), as the
    # reference health-signals-and-recovery.md §1.3 lists the enum: NONE=0, GPU_RESET=1, NODE_REBOOT=2,
    # DRAIN_P2P=3, DRAIN_AND_RESET=4. Draining takes the node's work off it first: Drain.
    "NONE": NONE, "GPU_RESET": GPU_RESET, "NODE_REBOOT": NODE_REBOOT, "DRAIN_P2P": DRAIN, "DRAIN_AND_RESET": DRAIN,
}
GPU_LOST = "gpu-lost"
"""NVIDIA's DRA driver taints a device ``gpu.nvidia.com/gpu-lost`` when NVML no longer sees it: gone from the bus."""


@dataclass(frozen=True)
class Recommendation:
    action: str   # one of ACTIONS
    source: str   # in words, for status.recommendedActionSource and the Event
    named: bool = field(default=False, compare=False)
    """A person or the rule named it (not the signal's default): it wins over a node's condition too."""


def signal_default(o: Observation) -> Recommendation | None:
    """The documented repair of one Unhealthy observation, or None when claimwarden knows none."""
    value = o.value.strip()
    what = f"{o.source} {o.signal}" + (f"={value}" if value else "")
    if value.upper() in RECOVERY_ACTIONS:
        return Recommendation(RECOVERY_ACTIONS[value.upper()], f"{what}: NVML recovery action {value.upper()}")
    is_xid = (o.source == SOURCE_TAINT and o.signal.rsplit("/", 1)[-1].lower() == "xid") or (
        o.source == SOURCE_ALERT and value.isdigit())
    if is_xid and value in XID_ACTIONS:
        return Recommendation(XID_ACTIONS[value], f"{what}: XID {value} per NVIDIA's Xid catalogue")
    if o.source == SOURCE_TAINT and o.signal.rsplit("/", 1)[-1] == GPU_LOST:
        return Recommendation(NODE_REBOOT, f"{what}: the driver lost the GPU")
    return None


def recommend(record: Mapping[str, Any], *, rule: Rule | None, policy: str | None,
              observations: Sequence[Observation]) -> Recommendation:
    """The record's recommended action (see the module docstring). `rule`: the HealthPolicy rule that decided a
    signal record's mark (None for other records, or when the rule is gone); `observations`: the record's."""
    if record_effect(dict(record)) == "None":
        return Recommendation(NONE, "effect None: nothing is marked, nothing is to repair")
    asked = ((record.get("spec") or {}).get("recommendedAction"))
    if asked in ACTIONS:
        return Recommendation(str(asked), "spec.recommendedAction", named=True)
    if rule is not None and rule.recommended_action is not None:
        return Recommendation(rule.recommended_action, f"HealthPolicy {policy}, rule {rule.name}", named=True)
    for o in _newest_first(o for o in observations if o.state == UNHEALTHY and (rule is None or rule.matches(o))):
        found = signal_default(o)
        if found is not None:
            return found
    return Recommendation(NONE, "no rule or known signal names a repair")


def _newest_first(found: Iterable[Observation]) -> list[Observation]:
    return sorted(found, key=lambda o: (o.at, o.key), reverse=True)
