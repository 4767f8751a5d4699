"""Marking a device unhealthy evicts the pods on it, through the Eviction API."""

from __future__ import annotations

import datetime
import time
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from .auditor import QUARANTINE_NAMESPACE, RECORD_LABEL
from .health_helpers import (
    create_record,
    delete_record,
    device_of,
    events,
    holders,
    mark,
    record_for,
    unmark,
    wait_gone,
)
from .helpers import gpu_claim_spec, pod_with_claims, template, wait_for
from .operator import Operator

TEMPLATE_CLAIM = [{"name": "gpu", "resourceClaimTemplateName": "single-gpu"}]


def _running(core: client.CoreV1Api, namespace: str, name: str) -> client.V1Pod | None:
    pod = core.read_namespaced_pod(name, namespace)
    return pod if pod.status.phase == "Running" else None


def _start(api: client.ApiClient, namespace: str, *pods: str, claim: str | None = None,
           labels: dict[str, str] | None = None) -> None:
    """Pods from a template, or all sharing the standalone claim ``claim``; waits until they run."""
    core, resource = client.CoreV1Api(api), client.ResourceV1Api(api)
    if claim:
        resource.create_namespaced_resource_claim(namespace, body={"metadata": {"name": claim},
                                                                   "spec": gpu_claim_spec()})
        uses = [{"name": "gpu", "resourceClaimName": claim}]
    else:
        resource.create_namespaced_resource_claim_template(namespace, body=template("single-gpu"))
        uses = TEMPLATE_CLAIM
    for name in pods:
        body = pod_with_claims(name, uses)
        if labels:
            body["metadata"]["labels"] = labels
        core.create_namespaced_pod(namespace, body=body)
    for name in pods:
        wait_for(f"{name} Running", lambda name=name: _running(core, namespace, name))


def test_marked_device_evicts_its_pod_and_spares_the_others(api: client.ApiClient, namespace: str,
                                                            claimwarden: Operator) -> None:
    _start(api, namespace, "victim", "bystander")
    pool, device = device_of(api, namespace, "victim")
    assert device_of(api, namespace, "bystander") != (pool, device)
    gone_before = _counter(claimwarden.metrics(), 'claimwarden_evictions_total{result="gone"}')

    mark(api, pool, device, "ECC errors")
    wait_gone(api, namespace, "victim")
    [event] = wait_for("the eviction's Event", lambda: events(api, namespace, "victim", "EvictedUnhealthyDevice"))
    assert event.type == "Warning"
    assert f"gpu.example.com/{pool}/{device}" in event.message and "ECC errors" in event.message
    record = wait_for("the record counts the eviction", lambda: (
        r if (r := record_for(api, pool, device)) and (r.get("status") or {}).get("podsEvicted") == 1 else None))
    assert record["spec"]["effect"] == "NoExecute" and record["spec"]["source"] == "annotation"
    # One Event per eviction, on the pod; the record's status names the pod instead of a second Event.
    assert any(entry.get("pod") == f"{namespace}/victim" for entry in record["status"]["recentEvictions"]), record
    assert not events(api, "default", record["metadata"]["name"], "EvictedUnhealthyDevice")
    assert client.CoreV1Api(api).read_namespaced_pod("bystander", namespace).status.phase == "Running"
    exposition = claimwarden.metrics()
    assert _counter(exposition, 'claimwarden_evictions_total{result="evicted"}') >= 1
    assert _counter(exposition, "claimwarden_eviction_latency_seconds_count") >= 1
    # A key still queued for the evicted pod finds it gone: that is not an attempt of its own.
    assert _counter(exposition, 'claimwarden_evictions_total{result="gone"}') == gone_before
    assert _counter(exposition, 'claimwarden_devices{driver="gpu.example.com",state="tainted"}') >= 1
    assert _counter(exposition, 'claimwarden_unhealthy_devices{effect="NoExecute"}') >= 1
    # Once the victim's claim lets go the quarantine is re-asserted (a new claim, then its allocation):
    # for a moment the gauge sees none allocated.
    wait_for("an allocated quarantine claim in the gauge", lambda: _counter(
        claimwarden.metrics(), 'claimwarden_resource_claims{source="quarantine",state="allocated"}') >= 1, 30)
    unmark(api, pool, device)


def test_two_pods_sharing_a_claim_on_the_device_are_both_evicted(api: client.ApiClient, namespace: str,
                                                                claimwarden: Operator) -> None:
    _start(api, namespace, "first", "second", claim="shared")
    pool, device = device_of(api, namespace, "first")
    mark(api, pool, device, "fell off the bus")
    wait_gone(api, namespace, "first")
    wait_gone(api, namespace, "second")
    wait_for("podsEvicted 2", lambda: ((record_for(api, pool, device) or {}).get("status") or {}).get(
        "podsEvicted") == 2)
    wait_for("the standalone claim deallocated", lambda: client.ResourceV1Api(api).read_namespaced_resource_claim(
        "shared", namespace).status.allocation is None)
    unmark(api, pool, device)


def test_pdb_blocks_eviction_until_it_allows_it(api: client.ApiClient, namespace: str,
                                               claimwarden: Operator) -> None:
    _start(api, namespace, "guarded", labels={"app": "guarded"})
    policy = client.PolicyV1Api(api)
    policy.create_namespaced_pod_disruption_budget(namespace, body={
        "metadata": {"name": "keep-one"},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "guarded"}}}})
    wait_for("the budget observed", lambda: (policy.read_namespaced_pod_disruption_budget(
        "keep-one", namespace).status.expected_pods or 0) == 1)
    blocked_before = _counter(claimwarden.metrics(), 'claimwarden_evictions_total{result="pdb_blocked"}')
    pool, device = device_of(api, namespace, "guarded")

    mark(api, pool, device, "overheating")
    wait_for("an EvictionBlocked event", lambda: events(api, namespace, "guarded", "EvictionBlocked"), 30)
    time.sleep(3)
    assert _running(client.CoreV1Api(api), namespace, "guarded")
    assert _counter(claimwarden.metrics(), 'claimwarden_evictions_total{result="pdb_blocked"}') >= blocked_before + 2
    record = record_for(api, pool, device)
    assert record is not None and record["status"]["podsPending"] == 1

    policy.patch_namespaced_pod_disruption_budget("keep-one", namespace, {"spec": {"minAvailable": 0}})
    wait_gone(api, namespace, "guarded", 90)
    wait_for("the eviction's Event", lambda: events(api, namespace, "guarded", "EvictedUnhealthyDevice"))
    time.sleep(2)
    assert len(events(api, namespace, "guarded", "EvictedUnhealthyDevice")) == 1
    unmark(api, pool, device)


def _counter(text: str, series: str) -> float:
    for line in text.splitlines():
        if line.startswith(series + " "):
            return float(line.split()[-1])
    return 0.0


def test_clearing_the_mark_stops_evictions_and_frees_the_device(api: client.ApiClient, namespace: str,
                                                               claimwarden: Operator) -> None:
    _start(api, namespace, "victim")
    pool, device = device_of(api, namespace, "victim")
    mark(api, pool, device, "flaky")
    wait_gone(api, namespace, "victim")
    wait_for("the device quarantined", lambda: holders(api, pool, device))

    unmark(api, pool, device)
    wait_for("the record gone", lambda: record_for(api, pool, device) is None)
    wait_for("the quarantine claims gone", lambda: holders(api, pool, device) == [])
    # The device is ordinary again: a pod pinned to its node may get it and is left alone.
    core = client.CoreV1Api(api)
    body = pod_with_claims("after", TEMPLATE_CLAIM)
    body["spec"]["nodeSelector"] = {"kubernetes.io/hostname": pool}
    core.create_namespaced_pod(namespace, body=body)
    wait_for("after Running", lambda: _running(core, namespace, "after"))
    time.sleep(3)
    assert _running(core, namespace, "after")
    assert not events(api, namespace, "after", "EvictedUnhealthyDevice")


def test_malformed_and_unknown_marks_are_reported_and_change_nothing(
        api: client.ApiClient, namespace: str, claimwarden: Operator) -> None:
    _start(api, namespace, "pod")
    pool, device = device_of(api, namespace, "pod")
    from .health_helpers import annotate, slice_of

    slice_name = slice_of(api, pool)
    bad = {"unhealthy.claimwarden.io/GPU_0": "bad key", "unhealthy.claimwarden.io/gpu-99": "no such device",
           f"unhealthy.claimwarden.io/{device}": " "}
    annotate(api, slice_name, bad)
    warnings = wait_for("three Warning events on the slice", lambda: (
        found if len(found := events(api, "default", slice_name, "InvalidUnhealthyMark")) >= 3 else None), 30)
    messages = " | ".join(e.message for e in warnings)
    assert "GPU_0" in messages and "gpu-99" in messages and all(e.type == "Warning" for e in warnings)
    time.sleep(3)
    assert record_for(api, pool, device) is None and record_for(api, pool, "gpu-99") is None
    assert _running(client.CoreV1Api(api), namespace, "pod")
    assert claimwarden.running
    annotate(api, slice_name, dict.fromkeys(bad))


def test_effect_none_reports_what_would_be_evicted_and_evicts_nothing(
        api: client.ApiClient, namespace: str, claimwarden: Operator) -> None:
    _start(api, namespace, "first", "second", claim="shared")
    pool, device = device_of(api, namespace, "first")
    create_record(api, f"dry-run-{namespace}", pool, device, "None", "checking")
    try:
        record = wait_for("podsWouldEvict 2", lambda: (
            r if ((r := record_for(api, pool, device)) or {}).get("status", {}).get("podsWouldEvict") == 2 else None))
        assert record["status"]["podsEvicted"] == 0 and record["status"]["quarantineClaims"] == []
        assert record["status"]["podsWouldEvictNames"] == [f"{namespace}/first", f"{namespace}/second"]
        time.sleep(3)
        core = client.CoreV1Api(api)
        assert _running(core, namespace, "first") and _running(core, namespace, "second")
        assert holders(api, pool, device) == [f"{namespace}/shared"]
    finally:
        delete_record(api, f"dry-run-{namespace}")


def test_effect_noschedule_quarantines_without_evicting(api: client.ApiClient, namespace: str,
                                                        claimwarden: Operator) -> None:
    _start(api, namespace, "pod")
    pool, device = device_of(api, namespace, "pod")
    create_record(api, f"no-schedule-{namespace}", pool, device, "NoSchedule", "draining")
    try:
        # While the pod's claim holds the device, that claim keeps new work away: no quarantine claim yet.
        wait_for("the record saying the device is held", lambda: _condition(
            record_for(api, pool, device), "Quarantined") == ("True", "HeldByClaims"))
        time.sleep(3)
        assert _running(client.CoreV1Api(api), namespace, "pod")
        [claim] = holders(api, pool, device)
        # The pod finishing lets go of the device; the quarantine claim takes it, and only that.
        client.CoreV1Api(api).delete_namespaced_pod("pod", namespace, grace_period_seconds=0)
        wait_for("the quarantine claim alone holding the device",
                 lambda: (found := holders(api, pool, device)) and claim not in found
                 and all(h.startswith("claimwarden-system/") for h in found))
        wait_for("the record saying the quarantine claim holds it", lambda: _condition(
            record_for(api, pool, device), "Quarantined") == ("True", "QuarantineClaimAllocated"))
    finally:
        delete_record(api, f"no-schedule-{namespace}")


def _condition(record: dict[str, Any] | None, kind: str) -> tuple[str, str] | None:
    found = next((c for c in ((record or {}).get("status") or {}).get("conditions") or [] if c["type"] == kind), None)
    return (found["status"], found["reason"]) if found else None


def test_an_expired_record_clears_itself(api: client.ApiClient, claimwarden: Operator) -> None:
    soon = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=4)
    create_record(api, "expiring", "kwok-node-0", "gpu-7", "NoSchedule", "maintenance window",
                  expiresAt=soon.strftime("%Y-%m-%dT%H:%M:%SZ"))
    wait_for("the record quarantined", lambda: holders(api, "kwok-node-0", "gpu-7"))
    wait_for("the record gone after its expiry", lambda: record_for(api, "kwok-node-0", "gpu-7") is None, 30)
    wait_for("its quarantine claim gone", lambda: holders(api, "kwok-node-0", "gpu-7") == [], 30)


@pytest.mark.parametrize(("spec", "field"), [
    ({"effect": "Sometimes"}, "effect"),
    ({"device": "GPU_0"}, "device"),
    ({"reason": ""}, "reason"),
])
def test_the_schema_rejects_bad_records(api: client.ApiClient, spec: dict[str, str], field: str) -> None:
    body = {"driver": "gpu.example.com", "pool": "kwok-node-0", "device": "gpu-0", "effect": "NoExecute",
            "reason": "x", **spec}
    with pytest.raises(ApiException) as caught:
        create_record(api, "bad-record", **{k: body[k] for k in ("pool", "device", "effect", "reason")})
    assert caught.value.status == 422
    assert field in str(caught.value.body)


def test_restart_between_marking_and_evicting_evicts_each_pod_exactly_once(
        api: client.ApiClient, namespace: str, operator_process: Operator) -> None:
    """The pods keep a finalizer, so an evicted pod stays visible (Terminating) across restarts."""
    operator_process.start()
    core, resource = client.CoreV1Api(api), client.ResourceV1Api(api)
    resource.create_namespaced_resource_claim(namespace, body={"metadata": {"name": "shared"},
                                                               "spec": gpu_claim_spec()})
    for name in ("first", "second"):
        body = pod_with_claims(name, [{"name": "gpu", "resourceClaimName": "shared"}])
        body["metadata"]["finalizers"] = ["example.com/keep"]
        core.create_namespaced_pod(namespace, body=body)
    for name in ("first", "second"):
        wait_for(f"{name} Running", lambda name=name: _running(core, namespace, name))
    pool, device = device_of(api, namespace, "first")
    try:
        with operator_process.stopped():
            mark(api, pool, device, "marked while claimwarden was down")
            time.sleep(2)
            assert all(p.metadata.deletion_timestamp is None for p in core.list_namespaced_pod(namespace).items)

        def both_evicted() -> bool:
            return all(p.metadata.deletion_timestamp for p in core.list_namespaced_pod(namespace).items)

        wait_for("both pods evicted after the restart", both_evicted, 60)
        assert operator_process.stop() == 0, "a clean exit on SIGTERM, the evictions in hand finished"
        operator_process.start()
        time.sleep(5)
        for name in ("first", "second"):  # posted beside the evictions, and let finish at shutdown
            wait_for(f"one eviction Event on {name}",
                     lambda name=name: len(events(api, namespace, name, "EvictedUnhealthyDevice")) == 1, 10)
        record = record_for(api, pool, device)
        assert record is not None and record["status"]["podsEvicted"] == 2
    finally:
        for name in ("first", "second"):
            core.patch_namespaced_pod(name, namespace, {"metadata": {"finalizers": None}})
        unmark(api, pool, device)


ADMIN_ACCESS_LABEL = "resource.kubernetes.io/admin-access"


def _uuid_of(api: client.ApiClient, pool: str, device: str) -> str:
    for slice_ in client.ResourceV1Api(api).list_resource_slice().items:
        if slice_.spec.pool.name == pool:
            for listed in slice_.spec.devices or []:
                if listed.name == device:
                    return str(listed.attributes["uuid"].string)
    raise AssertionError(f"device {pool}/{device} is not published")


def test_a_diagnostics_pod_with_admin_access_to_the_marked_device_is_not_evicted(
        api: client.ApiClient, namespace: str, claimwarden: Operator) -> None:
    """A pod that holds the device only through an admin-access allocation (`adminAccess: true`, in a namespace
    labelled for it) is the one that looks at a broken device: the mark evicts the device's user, not it, and
    the record lists it in status.adminAccessPods (code review finding 10: it was evicted too)."""
    core, resource = client.CoreV1Api(api), client.ResourceV1Api(api)
    core.patch_namespace(namespace, {"metadata": {"labels": {ADMIN_ACCESS_LABEL: "true"}}})
    _start(api, namespace, "worker", claim="worker-gpu")
    pool, device = device_of(api, namespace, "worker")
    spec = gpu_claim_spec()
    spec["devices"]["requests"][0]["exactly"].update({"adminAccess": True, "selectors": [{"cel": {
        "expression": f'device.attributes["gpu.example.com"].uuid == "{_uuid_of(api, pool, device)}"'}}]})
    resource.create_namespaced_resource_claim(namespace, body={"metadata": {"name": "diag-gpu"}, "spec": spec})
    core.create_namespaced_pod(namespace, body=pod_with_claims("diag", [{"name": "gpu",
                                                                         "resourceClaimName": "diag-gpu"}]))
    wait_for("diag Running", lambda: _running(core, namespace, "diag"))
    result = resource.read_namespaced_resource_claim("diag-gpu", namespace).status.allocation.devices.results[0]
    assert (result.pool, result.device, result.admin_access) == (pool, device, True)
    try:
        mark(api, pool, device, "diagnose me")
        wait_gone(api, namespace, "worker", 60)
        wait_for("nothing left to evict", lambda: (
            (record_for(api, pool, device) or {}).get("status", {}).get("podsPending") == 0), 30)
        time.sleep(3)  # let a wrong eviction of diag happen if it would
        left = {p.metadata.name: p for p in core.list_namespaced_pod(namespace).items}
        assert "diag" in left and left["diag"].metadata.deletion_timestamp is None, "the diagnostics pod was evicted"
        assert not events(api, namespace, "diag", "EvictedUnhealthyDevice")
        record = wait_for("the record lists the diagnostics pod", lambda: (
            r if (r := record_for(api, pool, device) or {}).get("status", {}).get("adminAccessPods") else None), 30)
        assert record["status"]["adminAccessPods"] == [f"{namespace}/diag"]
        assert record["status"]["podsWouldEvict"] == 0

        # The diagnostics pod finishes: kube-scheduler never counted its claim as allocating the device,
        # so the quarantine claim stays as it is (asserting it again would free the device for a moment).
        def quarantine_uids() -> set[str]:
            return {c.metadata.uid for c in resource.list_namespaced_resource_claim(
                QUARANTINE_NAMESPACE, label_selector=RECORD_LABEL).items
                if c.status and c.status.allocation and any(
                    (r.pool, r.device) == (pool, device) for r in c.status.allocation.devices.results)}
        before = wait_for("the device quarantined", lambda: quarantine_uids() or None, 30)
        core.delete_namespaced_pod("diag", namespace, grace_period_seconds=0)
        wait_for("diag's claim released", lambda: not (
            resource.read_namespaced_resource_claim("diag-gpu", namespace).status.reserved_for), 30)
        time.sleep(3)  # let a needless re-assert of the quarantine claim happen if it would
        assert quarantine_uids() == before, "the quarantine claim was replaced when the diagnostics pod went"
    finally:
        unmark(api, pool, device)
        wait_for("the record cleared", lambda: record_for(api, pool, device) is None, 30)
