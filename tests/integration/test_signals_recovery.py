"""A HealthPolicy's threshold and workload fault, a flap that escalates, and a person's verified clear, in the
lab with driver taints (issue 21). Devices without pods: what is checked is the record, not evictions."""

from __future__ import annotations

import time

import pytest
from kubernetes import client

from claimwarden.plugin.cli import EXIT_INPUT, EXIT_OK
from claimwarden.plugin.cli import main as plugin
from claimwarden_lab.cluster import LabState

from .health_helpers import events
from .helpers import wait_for
from .operator import Operator
from .signals_helpers import (
    DRIVER,
    XID,
    apply_policy,
    counter_sum,
    decision,
    delete_policy,
    delete_signal_record,
    record_name,
    rule,
    set_taints,
    signal_record,
)

POOL = "kwok-node-0"
POLICY = "recovery"


def _taint(device: str, value: str) -> None:
    # timeAdded has second precision: a taint re-added within the same second would be the same observation.
    time.sleep(1.1)
    set_taints(_API[0], POOL, device, [{"key": XID, "value": value, "effect": "NoSchedule"}])


def _untaint(device: str) -> None:
    set_taints(_API[0], POOL, device, [])


_API: list[client.ApiClient] = []


@pytest.fixture(autouse=True)
def _api(signals_api: client.ApiClient) -> None:
    _API[:] = [signals_api]


def _effect(device: str, effect: str) -> dict:
    return wait_for(f"{device} effect {effect}", lambda: (
        r if (r := signal_record(_API[0], POOL, device)) and r["spec"]["effect"] == effect
        and (r.get("status") or {}).get("observations") else None), 60)


def test_threshold_counts_two_and_the_same_signal_on_three_devices_is_a_workload_fault(
        signals_api: client.ApiClient, signals_operator: Operator) -> None:
    devices = ["gpu-4", "gpu-5", "gpu-6", "gpu-7"]
    apply_policy(signals_api, POLICY, [
        rule("twice", "DriverTaint", XID, values=["13"], effect="NoSchedule", threshold={"count": 2, "window": "5m"}),
        rule("fleet", "DriverTaint", XID, values=["31"], effect="NoSchedule",
             workloadFault={"devices": 3, "window": "5m"})])
    try:
        _taint("gpu-4", "13")
        first = _effect("gpu-4", "None")
        assert len(first["status"]["observations"]) == 1 and "rule" not in decision(first), first["status"]
        _untaint("gpu-4")
        _taint("gpu-4", "13")
        _effect("gpu-4", "NoSchedule")

        faults_before = counter_sum(signals_operator.metrics(), "claimwarden_workload_faults_total")
        for device in ("gpu-5", "gpu-6"):
            _taint(device, "31")
            _effect(device, "NoSchedule")
        _taint("gpu-7", "31")
        third = wait_for("gpu-7 a workload fault", lambda: (
            r if (r := signal_record(signals_api, POOL, "gpu-7")) and decision(r).get("workloadFault") else None))
        assert third["spec"]["effect"] == "None" and decision(third)["rule"] == "fleet", third["status"]
        # The devices marked before the third saw it are decided again: the workload's fault, not theirs.
        for device in ("gpu-5", "gpu-6"):
            _effect(device, "None")
        wait_for("the WorkloadFault Event", lambda: events(signals_api, "default", record_name(POOL, "gpu-7"),
                                                           "WorkloadFault"))
        assert counter_sum(signals_operator.metrics(), "claimwarden_workload_faults_total") > faults_before
    finally:
        for device in devices:
            _untaint(device)
        delete_policy(signals_api, POLICY)
        for device in devices:
            delete_signal_record(signals_api, POOL, device)


def test_a_flap_escalates_and_only_a_verified_clear_recovers_it(
        signals_api: client.ApiClient, signals_operator: Operator, signals_lab: LabState,
        capsys: pytest.CaptureFixture[str]) -> None:
    device = "gpu-7"
    apply_policy(signals_api, POLICY, [rule("xid", "DriverTaint", XID, effect="NoSchedule")],
                 recovery={"healthyHold": "5s", "refaultWindow": "1h", "escalateTo": "NoExecute"})
    try:
        escalations_before = counter_sum(signals_operator.metrics(), "claimwarden_signal_escalations_total")
        _taint(device, "79")
        _effect(device, "NoSchedule")
        _untaint(device)
        _effect(device, "None")  # un-quarantined once, automatically
        _taint(device, "79")
        escalated = _effect(device, "NoExecute")  # within refaultWindow: escalated
        assert decision(escalated)["escalated"] is True and escalated["status"]["recovery"]["escalated"] is True
        _untaint(device)
        time.sleep(3)
        assert signal_record(signals_api, POOL, device)["spec"]["effect"] == "NoExecute", "only a person clears it"
        assert counter_sum(signals_operator.metrics(), "claimwarden_signal_escalations_total") > escalations_before

        # A verified-at in the future is reported and ignored.
        client.CustomObjectsApi(signals_api).patch_cluster_custom_object(
            "claimwarden.io", "v1alpha1", "unhealthydevices", record_name(POOL, device),
            {"metadata": {"annotations": {"claimwarden.io/verified-at": "2099-01-01T00:00:00Z"}}})
        wait_for("the InvalidVerifiedClear Event", lambda: events(signals_api, "default", record_name(POOL, device),
                                                                  "InvalidVerifiedClear"))
        assert signal_record(signals_api, POOL, device)["spec"]["effect"] == "NoExecute"

        ref = f"{DRIVER}/{POOL}/{device}"
        kubeconfig = str(signals_lab.kubeconfig)
        assert plugin(["clear", ref, "--kubeconfig", kubeconfig]) == EXIT_INPUT
        assert "--verified" in capsys.readouterr().err
        assert plugin(["clear", ref, "--verified", "--kubeconfig", kubeconfig]) == EXIT_OK
        cleared = _effect(device, "None")
        history = cleared["status"]["recovery"]
        assert history.get("boundary") and not history.get("escalated") and "markedSince" not in history, history
        # Older observations never mark it again: the record stays at None.
        time.sleep(3)
        assert signal_record(signals_api, POOL, device)["spec"]["effect"] == "None"
    finally:
        _untaint(device)
        delete_policy(signals_api, POLICY)
        delete_signal_record(signals_api, POOL, device)


def test_a_recovered_record_is_deleted_after_the_refault_window(signals_api: client.ApiClient,
                                                                signals_operator: Operator) -> None:
    device = "gpu-3"
    apply_policy(signals_api, POLICY, [rule("xid", "DriverTaint", XID, effect="NoSchedule")],
                 recovery={"healthyHold": "5s", "refaultWindow": "8s", "escalateTo": "NoExecute"})
    try:
        _taint(device, "79")
        _effect(device, "NoSchedule")
        _untaint(device)
        recovered = _effect(device, "None")
        assert recovered["status"]["recovery"]["clears"]
        wait_for("the recovered record deleted after refaultWindow",
                 lambda: signal_record(signals_api, POOL, device) is None, 60)
    finally:
        _untaint(device)
        delete_policy(signals_api, POLICY)
        delete_signal_record(signals_api, POOL, device)


def test_a_node_condition_marks_every_device_of_its_node_and_never_recovers_by_itself(
        signals_api: client.ApiClient, signals_operator: Operator) -> None:
    core = client.CoreV1Api(signals_api)
    condition = {"type": "GPUProblem", "status": "True", "reason": "NPD", "message": "ECC storm",
                 "lastTransitionTime": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    apply_policy(signals_api, POLICY, [rule("npd", "NodeCondition", "GPUProblem", values=["True"],
                                            effect="NoSchedule")])
    devices = [f"gpu-{i}" for i in range(8)]
    try:
        core.patch_node_status(POOL, {"status": {"conditions": [condition]}})
        for device in devices:
            marked = _effect(device, "NoSchedule")
            [observed] = marked["status"]["observations"]
            assert (observed["source"], observed["signal"], observed["value"]) == ("NodeCondition", "GPUProblem",
                                                                                   "True")
        # The condition going away is not recovery (Node Problem Detector restarting drops it too).
        _drop_condition(core, "GPUProblem")
        time.sleep(3)
        assert all(signal_record(signals_api, POOL, d)["spec"]["effect"] == "NoSchedule" for d in devices)
    finally:
        _drop_condition(core, "GPUProblem")
        delete_policy(signals_api, POLICY)
        for device in devices:
            delete_signal_record(signals_api, POOL, device)


def _drop_condition(core: client.CoreV1Api, kind: str) -> None:
    node = core.read_node_status(POOL)
    kept = [c for c in node.status.conditions or [] if c.type != kind]
    if len(kept) != len(node.status.conditions or []):
        core.patch_node_status(POOL, [{"op": "replace", "path": "/status/conditions",
                                       "value": [core.api_client.sanitize_for_serialization(c) for c in kept]}])
