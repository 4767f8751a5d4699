"""Hand-off to repair (issue 22, part 3) in the shared lab, against NVIDIA NVSentinel's ExternalFault CRD as
published (tests/integration/nvsentinel/externalfaults.yaml; applied for this module, removed after).

- a record's recommended action reaches its status, an Event and the gauge, and is written only on change;
- the flag off: no ExternalFault, whatever the record recommends; the flag on without the CRD: one log line and
  one Event, nothing else;
- the flag on: a node-scoped fault gets exactly one ExternalFault naming its GPU's UUID; a second fault on the same
  node gets no second open request; a verified clear waits for FaultCleared; then the waiting fault gets the next.
"""

from __future__ import annotations

import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from claimwarden.timestamps import format_rfc3339, now
from claimwarden_lab.audit_policy import CLAIMWARDEN_USER
from claimwarden_lab.cluster import LabState
from claimwarden_lab.driver import device_uuid

from .auditor import LabAudit
from .conftest import service_account_kubeconfig
from .health_helpers import GROUP, PLURAL, VERSION, create_record, events
from .helpers import wait_for
from .operator import Operator
from .signals_helpers import apply_policy, counter_sum, delete_policy, record_name, rule, signal_record

HERE = Path(__file__).resolve().parent
CRD = HERE / "nvsentinel" / "externalfaults.yaml"
RBAC = HERE.parents[1] / "manifests" / "nvsentinel" / "rbac.yaml"
EF_GROUP, EF_VERSION, EF_PLURAL = "nvsentinel.dgxc.nvidia.com", "v1", "externalfaults"
NODE = "kwok-node-1"
CONDITION = "ClaimwardenRepairTest"


def _kubectl(lab: LabState, *args: str) -> None:
    subprocess.run([f"{lab.bin_dir}/kubectl", f"--kubeconfig={lab.kubeconfig}", *args], check=True,
                   capture_output=True, timeout=120)


def _external_faults(api: client.ApiClient) -> list[dict[str, Any]]:
    listing = client.CustomObjectsApi(api).list_cluster_custom_object(EF_GROUP, EF_VERSION, EF_PLURAL)
    return list(listing["items"])


def _record(api: client.ApiClient, name: str) -> dict[str, Any] | None:
    try:
        found: dict[str, Any] = client.CustomObjectsApi(api).get_cluster_custom_object(GROUP, VERSION, PLURAL, name)
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise
    return found


def _delete_record(api: client.ApiClient, name: str) -> None:
    try:
        client.CustomObjectsApi(api).delete_cluster_custom_object(GROUP, VERSION, PLURAL, name)
    except ApiException as exc:
        if exc.status != 404:
            raise
    wait_for(f"record {name} gone", lambda: _record(api, name) is None, 60)


def _status(record: dict[str, Any] | None) -> dict[str, Any]:
    return dict((record or {}).get("status") or {})


def _writes_to(audit: LabAudit, name: str) -> list[str]:
    return [f"{e['verb']}/{e['objectRef'].get('subresource', '')}" for e in audit.new_events()
            if e.get("user", {}).get("username") == CLAIMWARDEN_USER and e.get("objectRef", {}).get("name") == name
            and e["verb"] in ("create", "update", "patch", "delete")]


def _set_condition(api: client.ApiClient, status: str | None) -> None:
    """The test's node condition True, or gone (None) - as Node Problem Detector reports one."""
    core = client.CoreV1Api(api)
    node = core.read_node_status(NODE)
    kept = [api.sanitize_for_serialization(c) for c in node.status.conditions or [] if c.type != CONDITION]
    if status is not None:
        kept.append({"type": CONDITION, "status": status, "reason": "Test", "message": "GPU fabric fault",
                     "lastTransitionTime": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})
    core.patch_node_status(NODE, [{"op": "replace", "path": "/status/conditions", "value": kept}])


@pytest.fixture
def handoff_operator(operator_process: Operator, lab: LabState, tmp_path: Path) -> Iterator[Operator]:
    """claimwarden with the NVSentinel hand-off on (the session's runs with it off), alone in the lab."""
    with operator_process.stopped():
        operator = Operator(service_account_kubeconfig(lab), tmp_path / "claimwarden.log",
                            ["--leader-elect=false", "--nvsentinel-handoff=true", "--nvsentinel-poll-period=1",
                             "--resync-period=2"])
        operator.start()
        try:
            yield operator
        finally:
            operator.stop()


def test_the_flag_on_without_nvsentinel_says_so_once_and_does_nothing_else(
        api: client.ApiClient, handoff_operator: Operator) -> None:
    name = f"handoff-absent-{uuid.uuid4().hex[:5]}"
    create_record(api, name, "kwok-node-0", "gpu-5", "NoSchedule", "NVSentinel absent",
                  recommendedAction="NodeReboot")
    try:
        wait_for("the record's recommended action", lambda: _status(_record(api, name)).get("recommendedAction")
                 == "NodeReboot")
        wait_for("the RepairSystemNotServed Event", lambda: events(api, "default", name, "RepairSystemNotServed"))
        assert "does not serve externalfaults.nvsentinel.dgxc.nvidia.com/v1" in handoff_operator.log_tail(200)
        assert "externalFault" not in _status(_record(api, name))
    finally:
        _delete_record(api, name)


@pytest.fixture(scope="module")
def nvsentinel(lab: LabState) -> Iterator[None]:
    """NVSentinel's ExternalFault CRD as published, and manifests/nvsentinel's grant; both removed afterwards."""
    _kubectl(lab, "apply", "-f", str(CRD), "-f", str(RBAC))
    _kubectl(lab, "wait", "--for=condition=Established", "--timeout=60s",
             "crd/externalfaults.nvsentinel.dgxc.nvidia.com")
    try:
        yield
    finally:
        _kubectl(lab, "delete", "--ignore-not-found", "--wait=true", "-f", str(CRD), "-f", str(RBAC))


def test_the_flag_off_recommends_an_action_and_requests_no_repair(
        api: client.ApiClient, lab: LabState, claimwarden: Operator, nvsentinel: None) -> None:
    name = f"handoff-off-{uuid.uuid4().hex[:5]}"
    create_record(api, name, "kwok-node-0", "gpu-6", "NoSchedule", "XID 79 seen by hand",
                  recommendedAction="NodeReboot")
    try:
        # The health controller's status (the quarantine claim) and ours, both written.
        marked = wait_for("status.recommendedAction and the quarantine", lambda: (
            r if (s := _status(r := _record(api, name))).get("recommendedAction") == "NodeReboot"
            and s.get("quarantineClaims") else None))
        assert _status(marked)["recommendedActionSource"] == "spec.recommendedAction"
        wait_for("the RepairRecommended Event", lambda: events(api, "default", name, "RepairRecommended"))
        assert counter_sum(claimwarden.metrics(), "claimwarden_repair_recommended", 'action="NodeReboot"') >= 1
        # Quiet while nothing changes: a resync (every 300 s here) or any other event writes nothing more.
        time.sleep(1)
        audit = LabAudit(lab)
        client.CustomObjectsApi(api).patch_cluster_custom_object(GROUP, VERSION, PLURAL, name, {
            "metadata": {"labels": {"touched": "yes"}}})
        time.sleep(3)
        writes = _writes_to(audit, name)
        assert writes == [], f"a label change made claimwarden write the record again: {writes}"
        # A change is written once, with a new Event.
        client.CustomObjectsApi(api).patch_cluster_custom_object(GROUP, VERSION, PLURAL, name, {
            "spec": {"recommendedAction": "Drain"}})
        wait_for("Drain", lambda: _status(_record(api, name)).get("recommendedAction") == "Drain")
        wait_for("a second RepairRecommended Event",
                 lambda: len(events(api, "default", name, "RepairRecommended")) == 2)
        time.sleep(2)
        # Ours, and the health controller's (the spec change is a new generation: its status.observedGeneration).
        writes = _writes_to(audit, name)
        assert writes.count("patch/status") <= 2 and writes.count("patch/") == 0, writes
        assert _external_faults(api) == [], "the hand-off is off: no ExternalFault"
    finally:
        _delete_record(api, name)


@pytest.mark.audit(max_writes=30, reason="the signal record is marked, handed off, held, cleared and recovered: "
                   "its status and spec are written at each step, and the health controller writes its own status")
def test_a_node_scoped_fault_is_handed_to_nvsentinel_once_and_recovers_only_after_fault_cleared(
        api: client.ApiClient, lab: LabState, handoff_operator: Operator, nvsentinel: None) -> None:
    objects = client.CustomObjectsApi(api)
    policy, second = f"handoff-{uuid.uuid4().hex[:5]}", f"handoff-second-{uuid.uuid4().hex[:5]}"
    signal = record_name(NODE, "gpu-7")
    apply_policy(api, policy, [rule("fabric", "NodeCondition", CONDITION, values=["True"], effect="NoSchedule",
                                    recommendedAction="NodeReboot")],
                 pools=[NODE], selector="device.attributes['gpu.example.com'].index == 7")
    try:
        _set_condition(api, "True")
        handed = wait_for("the signal record handed off", lambda: (
            r if _status(r := signal_record(api, NODE, "gpu-7")).get("externalFault") else None), 60)
        assert handed["spec"]["effect"] == "NoSchedule"
        assert (_status(handed)["recommendedAction"], _status(handed)["recommendedActionSource"]) == (
            "NodeReboot", f"HealthPolicy {policy}, rule fabric")
        [fault] = _external_faults(api)
        event = fault["spec"]["healthEvent"]
        assert fault["metadata"]["name"] == _status(handed)["externalFault"]
        assert event["nodeName"] == NODE and event["isHealthy"] is False
        assert {"entityType": "GPU_UUID", "entityValue": device_uuid(NODE, 7)} in event["entitiesImpacted"]
        wait_for("the RepairRequested Event", lambda: events(api, "default", signal, "RepairRequested"))

        # A second node-scoped fault on the same node: no second open request while the first is open.
        create_record(api, second, NODE, "gpu-6", "NoSchedule", "NVLink down", recommendedAction="Drain")
        wait_for("the second record's action and quarantine", lambda: (
            (s := _status(_record(api, second))).get("recommendedAction") == "Drain" and s.get("quarantineClaims")))
        quiet = LabAudit(lab)
        time.sleep(5)  # five poll periods, two resyncs
        assert [f["metadata"]["name"] for f in _external_faults(api)] == [fault["metadata"]["name"]]
        writes = _writes_to(quiet, second)
        assert writes == [], f"the waiting record was written again while nothing changed: {writes}"

        # A person verifies the device; the repair is not done: the mark holds.
        _set_condition(api, None)
        objects.patch_cluster_custom_object(GROUP, VERSION, PLURAL, signal, {"metadata": {"annotations": {
            "claimwarden.io/verified-at": format_rfc3339(now())}}})
        wait_for("the RecoveryAwaitsRepair Event", lambda: events(api, "default", signal, "RecoveryAwaitsRepair"))
        time.sleep(2)
        assert signal_record(api, NODE, "gpu-7")["spec"]["effect"] == "NoSchedule", "recovered before FaultCleared"

        # NVSentinel's repair completes: FaultCleared. The verified clear applies now.
        stamp = format_rfc3339(now())
        objects.patch_cluster_custom_object_status(EF_GROUP, EF_VERSION, EF_PLURAL, fault["metadata"]["name"], {
            "status": {"completionTime": stamp, "conditions": [
                {"type": "FaultReported", "status": "True", "reason": "HealthEventEmitted", "message": "emitted",
                 "lastTransitionTime": stamp},
                {"type": "FaultCleared", "status": "True", "reason": "FaultCleared", "message": "repaired",
                 "lastTransitionTime": stamp}]}})
        wait_for("the record recovered", lambda: signal_record(api, NODE, "gpu-7")["spec"]["effect"] == "None", 30)
        assert events(api, "default", signal, "RepairCleared")

        # The waiting fault gets the node's next request, with its own GPU.
        nxt = wait_for("the second request", lambda: next((
            f for f in _external_faults(api) if f["metadata"]["name"] != fault["metadata"]["name"]), None), 30)
        assert {"entityType": "GPU_UUID", "entityValue": device_uuid(NODE, 6)} in nxt["spec"]["healthEvent"][
            "entitiesImpacted"]
        assert len(_external_faults(api)) == 2
        wait_for("the second record names its request", lambda: _status(_record(api, second)).get("externalFault")
                 == nxt["metadata"]["name"])
        # Each request was created once and never written again by claimwarden.
        audit = LabAudit(lab, from_start=True)
        writes = [e["verb"] for e in audit.new_events() if e.get("user", {}).get("username") == CLAIMWARDEN_USER
                  and e.get("objectRef", {}).get("resource") == EF_PLURAL
                  and e["verb"] in ("create", "update", "patch", "delete")
                  and e.get("responseStatus", {}).get("code") != 409]  # a create the listing had not shown yet
        assert writes == ["create", "create"], writes
    finally:
        _set_condition(api, None)
        delete_policy(api, policy)
        _delete_record(api, second)
        _delete_record(api, signal)
        for found in _external_faults(api):
            objects.delete_cluster_custom_object(EF_GROUP, EF_VERSION, EF_PLURAL, found["metadata"]["name"])
