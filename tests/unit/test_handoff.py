"""Hand-off to repair (issue 22, part 3), pure parts: the recommended action, which faults are node-scoped,
the ExternalFault body, one open request per node, and when a verified recovery may apply."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any, cast

import pytest

from claimwarden import cli, metrics
from claimwarden.handoff import actions, externalfaults
from claimwarden.handoff.actions import Recommendation, recommend, signal_default
from claimwarden.handoff.controller import HandoffController
from claimwarden.handoff.externalfaults import Fault, plan_node, recovery_hold
from claimwarden.health.records import DeviceRef
from claimwarden.signals.observations import Observation
from claimwarden.signals.policy import Rule, parse_policy

T0 = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)
XID = "gpu.nvidia.com/xid"


def _obs(source: str, signal: str, value: str, *, state: str = "Unhealthy", minute: int = 0) -> Observation:
    return Observation(source=source, signal=signal, value=value, state=state, at=T0 + timedelta(minutes=minute),
                       key=f"{source}/{signal}/{value}/{minute}")


def _record(*, effect: str = "NoSchedule", spec: dict[str, Any] | None = None, status: dict[str, Any] | None = None,
            uid: str = "u1", device: str = "gpu-1") -> dict[str, Any]:
    return {"metadata": {"name": f"rec-{device}", "uid": uid, "creationTimestamp": "2026-12-02T11:00:00Z"},
            "spec": {"driver": "gpu.nvidia.com", "pool": "node-a", "device": device, "effect": effect,
                     "reason": "broken", **(spec or {})},
            "status": status or {}}


# --- the recommended action ---------------------------------------------------------------------

@pytest.mark.parametrize(("observation", "expected"), [
    (_obs("DriverTaint", XID, "79"), actions.NODE_REBOOT),
    (_obs("DriverTaint", XID, "13"), actions.NONE),
    (_obs("Alertmanager", "GPUXidError", "79"), actions.NODE_REBOOT),
    (_obs("DriverTaint", "gpu.nvidia.com/gpu-lost", ""), actions.NODE_REBOOT),
    (_obs("Alertmanager", "GPURecoveryAction", "GPU_RESET"), actions.GPU_RESET),
    (_obs("Alertmanager", "GPURecoveryAction", "drain_and_reset"), actions.DRAIN),
    (_obs("Alertmanager", "GPURecoveryAction", "DRAIN_P2P"), actions.DRAIN),
])
def test_a_known_signal_has_its_documented_repair(observation: Observation, expected: str) -> None:
    found = signal_default(observation)
    assert found is not None and found.action == expected, found


@pytest.mark.parametrize("observation", [
    _obs("DriverTaint", XID, "48"),               # not in claimwarden's table: a rule must say
    _obs("Alertmanager", "GPUHot", "thermal"),     # not an XID, not a recovery action
    _obs("NodeCondition", "GPUProblem", "True"),
    _obs("DriverTaint", "gpu.nvidia.com/unmonitored", ""),
])
def test_an_unknown_signal_recommends_nothing_by_itself(observation: Observation) -> None:
    assert signal_default(observation) is None


def test_a_persons_spec_wins_over_the_rule_and_the_signal() -> None:
    rule = Rule("xid", "DriverTaint", XID, recommended_action=actions.GPU_RESET)
    found = recommend(_record(spec={"recommendedAction": "Drain"}), rule=rule, policy="p",
                      observations=[_obs("DriverTaint", XID, "79")])
    assert found == Recommendation(actions.DRAIN, "spec.recommendedAction")


def test_the_rule_wins_over_the_signals_default() -> None:
    rule = Rule("xid", "DriverTaint", XID, recommended_action=actions.GPU_RESET)
    found = recommend(_record(), rule=rule, policy="p", observations=[_obs("DriverTaint", XID, "79")])
    assert found == Recommendation(actions.GPU_RESET, "HealthPolicy p, rule xid")


def test_without_a_rules_action_the_newest_matching_signal_decides() -> None:
    rule = Rule("xid", "DriverTaint", XID)
    observations = [_obs("DriverTaint", XID, "79", minute=0), _obs("DriverTaint", XID, "13", minute=5),
                    _obs("DriverTaint", "gpu.nvidia.com/gpu-lost", "", minute=9)]  # not this rule's signal
    found = recommend(_record(), rule=rule, policy="p", observations=observations)
    assert found.action == actions.NONE and "XID 13" in found.source
    older_only = recommend(_record(), rule=rule, policy="p", observations=observations[:1])
    assert older_only.action == actions.NODE_REBOOT


def test_a_record_that_marks_nothing_recommends_nothing() -> None:
    found = recommend(_record(effect="None", spec={"recommendedAction": "NodeReboot"}), rule=None, policy=None,
                      observations=[_obs("DriverTaint", XID, "79")])
    assert found.action == actions.NONE


def test_a_record_with_no_source_recommends_none() -> None:
    assert recommend(_record(), rule=None, policy=None, observations=[]).action == actions.NONE


def test_a_policy_rule_reads_and_checks_its_recommended_action() -> None:
    body = {"metadata": {"name": "p"}, "spec": {"rules": [
        {"name": "ok", "source": "DriverTaint", "signal": XID, "effect": "NoExecute", "recommendedAction": "Drain"},
        {"name": "bad", "source": "DriverTaint", "signal": XID, "effect": "NoExecute", "recommendedAction": "Reboot"},
    ]}}
    parsed, errors = parse_policy(body)
    assert parsed is None
    assert errors == ["spec.rules[1].recommendedAction: 'Reboot' is not one of None, GpuReset, NodeReboot, Drain"]
    del body["spec"]["rules"][1]
    parsed, errors = parse_policy(body)
    assert errors == [] and parsed is not None and parsed.rules[0].recommended_action == "Drain"


# --- node-scoped faults and the ExternalFault -----------------------------------------------------

@pytest.mark.parametrize(("effect", "action", "node_condition", "expected"), [
    ("NoExecute", actions.NODE_REBOOT, False, True),
    ("NoSchedule", actions.DRAIN, False, True),
    ("NoExecute", actions.GPU_RESET, False, False),   # one GPU's reset is not a node repair
    ("NoExecute", actions.NONE, True, True),          # a node's condition made the mark
    ("None", actions.NODE_REBOOT, False, False),      # a dry run asks for nothing
])
def test_which_faults_are_node_scoped(effect: str, action: str, node_condition: bool, expected: bool) -> None:
    assert externalfaults.node_scoped(_record(effect=effect), Recommendation(action, "x"),
                                      node_condition=node_condition) is expected


def test_a_fault_key_names_this_mark_of_this_record() -> None:
    assert externalfaults.fault_key(_record()) == "u1@2026-12-02T11:00:00Z"
    # markedAt is written a moment after the record appears: the key must not move with it.
    assert externalfaults.fault_key(_record(status={"markedAt": "2026-12-02T11:05:00Z"})) == "u1@2026-12-02T11:00:00Z"
    signal = _record(status={"markedAt": "2026-12-02T11:05:00Z", "recovery": {"markedSince": "2026-12-02T11:07:00Z"}})
    assert externalfaults.fault_key(signal) == "u1@2026-12-02T11:07:00Z"


def test_the_device_names_its_node_and_its_physical_gpu() -> None:
    slices = [{"spec": {"driver": "gpu.example.com", "pool": {"name": "node-a"}, "nodeName": "node-a", "devices": [
        {"name": "gpu-0", "attributes": {"uuid": {"string": "GPU-0"}}},
        {"name": "gpu-0-half-0", "attributes": {"uuid": {"string": "GPU-0-h0"}, "parentUUID": {"string": "GPU-0"}}},
        {"name": "nic-0", "attributes": {"gpu.example.com/uuid": {"string": "NIC-0"}}}]}}]
    node, gpu = externalfaults.device_node(DeviceRef("gpu.example.com", "node-a", "gpu-0"), slices) or ("", {})
    assert node == "node-a" and externalfaults.gpu_uuid("gpu.example.com", gpu) == "GPU-0"
    _, half = externalfaults.device_node(DeviceRef("gpu.example.com", "node-a", "gpu-0-half-0"), slices) or ("", {})
    assert externalfaults.gpu_uuid("gpu.example.com", half) == "GPU-0"
    _, nic = externalfaults.device_node(DeviceRef("gpu.example.com", "node-a", "nic-0"), slices) or ("", {})
    assert externalfaults.gpu_uuid("gpu.example.com", nic) == "NIC-0"
    assert externalfaults.device_node(DeviceRef("gpu.example.com", "node-a", "gpu-9"), slices) is None
    assert externalfaults.device_node(DeviceRef("other", "node-a", "gpu-0"), slices) is None


def _fault(record: str, key: str, uuid: str | None = "GPU-1", node: str = "node-a") -> Fault:
    return Fault(record=record, key=key, node=node, gpu_uuid=uuid, action=actions.NODE_REBOOT, why="XID 79")


def test_the_external_fault_names_the_node_and_the_gpus() -> None:
    body = externalfaults.external_fault("node-a", [_fault("r2", "u2@t", "GPU-2"), _fault("r1", "u1@t", "GPU-1"),
                                                    _fault("r3", "u3@t", None)], T0)
    assert (body["apiVersion"], body["kind"]) == ("nvsentinel.dgxc.nvidia.com/v1", "ExternalFault")
    event = body["spec"]["healthEvent"]
    assert event["nodeName"] == "node-a" and event["isHealthy"] is False and event["agent"] == "claimwarden"
    assert event["entitiesImpacted"] == [{"entityType": "GPU_UUID", "entityValue": "GPU-1"},
                                         {"entityType": "GPU_UUID", "entityValue": "GPU-2"}]
    assert event["recommendedAction"] == "CUSTOM" and event["errorCode"] == ["NodeReboot"]
    assert event["generatedTimestamp"] == "2026-12-02T12:00:00Z"
    assert json.loads(body["metadata"]["annotations"][externalfaults.FAULTS_ANNOTATION]) == ["u1@t", "u2@t", "u3@t"]
    assert body["metadata"]["labels"][externalfaults.NODE_LABEL] == "node-a"
    again = externalfaults.external_fault("node-a", [_fault("r1", "u1@t"), _fault("r2", "u2@t")], T0)
    assert again["metadata"]["name"] == body["metadata"]["name"], "the name is the node's and its first fault's"
    assert len(body["metadata"]["name"]) <= 253 and body["metadata"]["name"].startswith("claimwarden-node-a-")


def _existing(name: str, node: str, keys: list[str] | None, *, cleared: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if keys is not None:
        meta["annotations"] = {externalfaults.FAULTS_ANNOTATION: json.dumps(keys)}
    status: dict[str, Any] = {"conditions": [{"type": "FaultCleared", "status": "True" if cleared else "False"}]}
    if cleared:
        status["completionTime"] = "2026-12-02T12:30:00Z"
    return {"metadata": meta, "spec": {"healthEvent": {"nodeName": node}}, "status": status}


def test_a_node_without_a_request_gets_one_for_all_its_faults() -> None:
    node_plan = plan_node("node-a", [_fault("r1", "u1@t"), _fault("r2", "u2@t"), _fault("r9", "u9@t", node="b")],
                          [_existing("other-node", "node-b", None)], T0)
    assert node_plan.create is not None and node_plan.open == ()
    assert json.loads(node_plan.create["metadata"]["annotations"][externalfaults.FAULTS_ANNOTATION]) == ["u1@t",
                                                                                                        "u2@t"]


def test_a_second_fault_waits_while_the_nodes_request_is_open() -> None:
    ours = _existing("claimwarden-node-a-1", "node-a", ["u1@t"])
    node_plan = plan_node("node-a", [_fault("r1", "u1@t"), _fault("r2", "u2@t")], [ours], T0)
    assert node_plan.create is None and node_plan.open == ("claimwarden-node-a-1",) and node_plan.waiting == ("u2@t",)
    # Another system's open request counts too: NVSentinel's webhook allows one active request per node.
    theirs = _existing("csp-maintenance", "node-a", None)
    node_plan = plan_node("node-a", [_fault("r1", "u1@t")], [theirs], T0)
    assert node_plan.create is None and node_plan.waiting == ("u1@t",)


def test_once_the_request_is_cleared_the_waiting_fault_gets_the_next() -> None:
    cleared = _existing("claimwarden-node-a-1", "node-a", ["u1@t"], cleared=True)
    node_plan = plan_node("node-a", [_fault("r1", "u1@t"), _fault("r2", "u2@t")], [cleared], T0)
    assert node_plan.create is not None
    assert json.loads(node_plan.create["metadata"]["annotations"][externalfaults.FAULTS_ANNOTATION]) == ["u2@t"]
    assert plan_node("node-a", [_fault("r1", "u1@t")], [cleared], T0).create is None, "a cleared fault is done"


def test_a_verified_recovery_waits_for_fault_cleared() -> None:
    assert "not handed to NVSentinel yet" in (recovery_hold("u1@t", "node-a", []) or "")
    open_request = _existing("claimwarden-node-a-1", "node-a", ["u1@t"])
    assert "claimwarden-node-a-1" in (recovery_hold("u1@t", "node-a", [open_request]) or "")
    cleared = _existing("claimwarden-node-a-1", "node-a", ["u1@t"], cleared=True)
    assert recovery_hold("u1@t", "node-a", [cleared]) is None
    completed_not_cleared = _existing("x", "node-a", ["u1@t"])
    completed_not_cleared["status"]["completionTime"] = "2026-12-02T12:30:00Z"  # deleted by an operator: not repaired
    assert not externalfaults.is_open(completed_not_cleared)
    assert recovery_hold("u1@t", "node-a", [completed_not_cleared]) is not None


def test_a_bad_annotation_covers_nothing() -> None:
    broken = _existing("x", "node-a", None)
    broken["metadata"]["annotations"] = {externalfaults.FAULTS_ANNOTATION: "{not json"}
    assert externalfaults.covered_keys(broken) == set()



def test_the_nvsentinel_hand_off_is_off_unless_asked_for() -> None:
    def settings(*flags: str) -> Any:
        return cli.run_settings(cli._parser(None).parse_args(["run", *flags])).handoff

    assert (settings().nvsentinel, settings().poll_seconds) == (False, 10.0)
    on = settings("--nvsentinel-handoff=true", "--nvsentinel-poll-period=3")
    assert (on.nvsentinel, on.poll_seconds) == (True, 3.0)
    with pytest.raises(SystemExit):
        settings("--nvsentinel-poll-period=0")


def test_the_gauge_counts_records_per_action_as_they_change() -> None:
    controller = HandoffController(cache=cast(Any, None), kube=cast(Any, None))

    def shown() -> dict[str, float]:
        return {a: metrics.REGISTRY.get_sample_value("claimwarden_repair_recommended", {"action": a}) or 0.0
                for a in actions.ACTIONS}

    controller._note_action("a", actions.NODE_REBOOT)
    controller._note_action("b", actions.NODE_REBOOT)
    controller._note_action("a", actions.NODE_REBOOT)  # unchanged: counted once
    assert shown() == {"None": 0, "GpuReset": 0, "NodeReboot": 2, "Drain": 0}
    controller._note_action("b", actions.DRAIN)
    controller._note_action("a", None)  # the record is gone
    assert shown() == {"None": 0, "GpuReset": 0, "NodeReboot": 0, "Drain": 1}
