"""Device health on paths the first tests never took: restarts while a device is marked, claims
that users label as quarantine, a pod bound after its claim was reserved on a marked device, and a
mark set again on a slice that its driver re-created under a new name."""

from __future__ import annotations

import time
from typing import Any

from kubernetes import client

from claimwarden.health.records import RECORD_LABEL

from .health_helpers import (
    PREFIX,
    annotate,
    delete_record,
    device_of,
    events,
    holders,
    mark,
    record_for,
    slice_of,
    unmark,
    wait_gone,
)
from .helpers import gpu_claim_spec, pod_with_claims, template, wait_for
from .operator import Operator

OWN_NAMESPACE = "claimwarden-system"
TEMPLATE_CLAIM = [{"name": "gpu", "resourceClaimTemplateName": "single-gpu"}]


def _running(core: client.CoreV1Api, namespace: str, name: str) -> bool:
    return bool(core.read_namespaced_pod(name, namespace).status.phase == "Running")


def _quarantine_claims(api: client.ApiClient, pool: str, device: str) -> list[str]:
    return [h for h in holders(api, pool, device) if h.startswith(f"{OWN_NAMESPACE}/")]


def test_restarts_with_a_marked_device_keep_one_quarantine_claim(
        api: client.ApiClient, namespace: str, operator_process: Operator) -> None:
    operator_process.start()
    core, resource = client.CoreV1Api(api), client.ResourceV1Api(api)
    resource.create_namespaced_resource_claim_template(namespace, body=template("single-gpu"))
    core.create_namespaced_pod(namespace, body=pod_with_claims("victim", TEMPLATE_CLAIM))
    wait_for("victim Running", lambda: _running(core, namespace, "victim"))
    pool, device = device_of(api, namespace, "victim")
    try:
        mark(api, pool, device, "restart test")
        wait_gone(api, namespace, "victim")
        wait_for("one quarantine claim", lambda: len(_quarantine_claims(api, pool, device)) == 1, 30)
        counts = []
        for _ in range(5):
            assert operator_process.stop() == 0
            operator_process.start()
            wait_for("the record reconciled after the restart", lambda: (
                (record_for(api, pool, device) or {}).get("status", {}).get("quarantineClaims")), 30)
            time.sleep(2)
            counts.append(len(_quarantine_claims(api, pool, device)))
        assert counts == [1] * 5, f"quarantine claims after each restart: {counts}"
    finally:
        unmark(api, pool, device)
        wait_for("the quarantine released", lambda: not _quarantine_claims(api, pool, device), 30)


def test_a_template_labelled_as_quarantine_does_not_make_its_pods_immune(
        api: client.ApiClient, namespace: str, claimwarden: Operator) -> None:
    core, resource = client.CoreV1Api(api), client.ResourceV1Api(api)
    resource.create_namespaced_resource_claim_template(
        namespace, body=template("single-gpu", labels={RECORD_LABEL: "looks-like-quarantine"}))
    core.create_namespaced_pod(namespace, body=pod_with_claims("sneaky", TEMPLATE_CLAIM))
    wait_for("sneaky Running", lambda: _running(core, namespace, "sneaky"))
    pool, device = device_of(api, namespace, "sneaky")
    try:
        mark(api, pool, device, "labels prove nothing")
        wait_gone(api, namespace, "sneaky", 30)
        wait_for("the eviction's Event", lambda: events(api, namespace, "sneaky", "EvictedUnhealthyDevice"))
    finally:
        unmark(api, pool, device)


def _free_device(api: client.ApiClient) -> tuple[str, str]:
    """A device that no claim holds, on kwok-node-1 (counted from the end, away from other tests)."""
    for index in range(7, -1, -1):
        if not holders(api, "kwok-node-1", f"gpu-{index}"):
            return "kwok-node-1", f"gpu-{index}"
    raise AssertionError("no free device on kwok-node-1")


def _allocation(pool: str, device: str) -> dict[str, Any]:
    return {"devices": {"results": [{"request": "gpu", "driver": "gpu.example.com", "pool": pool,
                                     "device": device}]},
            "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                {"key": "metadata.name", "operator": "In", "values": [pool]}]}]}}


def test_a_pod_bound_after_its_claim_was_reserved_on_a_marked_device_is_evicted_at_once(
        api: client.ApiClient, namespace: str, claimwarden: Operator) -> None:
    """The claim is reserved before the pod is bound (as the scheduler does); the binding is the pod's own
    update. Without a wake-up on it, the pod would wait for the next full resync (300 s)."""
    core, resource = client.CoreV1Api(api), client.ResourceV1Api(api)
    pool, device = _free_device(api)
    resource.create_namespaced_resource_claim(namespace, body={"metadata": {"name": "held"},
                                                               "spec": gpu_claim_spec()})
    body = pod_with_claims("late", [{"name": "gpu", "resourceClaimName": "held"}])
    body["spec"]["schedulerName"] = "nobody"  # bound by this test, like a scheduler would
    pod = core.create_namespaced_pod(namespace, body=body)
    try:
        mark(api, pool, device, "bound late")
        wait_for("the device quarantined", lambda: _quarantine_claims(api, pool, device), 30)
        claim = resource.read_namespaced_resource_claim("held", namespace)
        resource.patch_namespaced_resource_claim_status("held", namespace, {"status": {
            "allocation": _allocation(pool, device),
            "reservedFor": [{"resource": "pods", "name": "late", "uid": pod.metadata.uid}]}})
        assert claim is not None
        time.sleep(2)  # the claim's own event has been handled: the pod is not bound, so not evicted yet
        assert core.read_namespaced_pod("late", namespace).metadata.deletion_timestamp is None
        core.create_namespaced_binding(namespace, body={
            "metadata": {"name": "late"}, "target": {"apiVersion": "v1", "kind": "Node", "name": pool}},
            _preload_content=False)
        wait_gone(api, namespace, "late", 20)
    finally:
        unmark(api, pool, device)
        wait_for("the quarantine released", lambda: not _quarantine_claims(api, pool, device), 30)


def _recreate_slice(api: client.ApiClient, name: str) -> str:
    """Delete the slice and publish the same devices again under a new name, as a driver does; the new name."""
    resource = client.ResourceV1Api(api)
    old = api.sanitize_for_serialization(resource.read_resource_slice(name))
    resource.delete_resource_slice(name)
    wait_for(f"slice {name} gone", lambda: name not in {s.metadata.name for s in resource.list_resource_slice().items})
    body = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"generateName": f"{old['spec']['nodeName']}-recreated-",
                         "ownerReferences": old["metadata"].get("ownerReferences") or []},
            "spec": old["spec"]}
    return str(resource.create_resource_slice(body=body).metadata.name)


def test_a_mark_set_again_on_a_recreated_slice_is_cleared_by_removing_it(
        api: client.ApiClient, namespace: str, claimwarden: Operator) -> None:
    """The record outlives the slice; marked again on the new slice, it follows that slice, so removing the
    annotation there clears it and frees the device (code review finding 5: it stayed for good)."""
    pool, device = _free_device(api)
    try:
        mark(api, pool, device, "XID 79")
        wait_for("the device quarantined", lambda: _quarantine_claims(api, pool, device), 30)
        new = _recreate_slice(api, slice_of(api, pool))
        time.sleep(2)  # the deletion and the unmarked new slice are handled: the record stays
        assert (record_for(api, pool, device) or {}).get("spec", {}).get("reason") == "XID 79"
        annotate(api, new, {PREFIX + device: "XID 79 again"})
        wait_for("the record adopted by the new slice's mark", lambda: (
            (record_for(api, pool, device) or {}).get("spec", {}).get("reason") == "XID 79 again"), 30)
        annotate(api, new, {PREFIX + device: None})
        wait_for("the record cleared", lambda: record_for(api, pool, device) is None, 20)
        wait_for("the quarantine released", lambda: not _quarantine_claims(api, pool, device), 30)
    finally:
        unmark(api, pool, device)
        found = record_for(api, pool, device)
        if found is not None:  # without the fix it stays: leave the lab clean for the next tests
            delete_record(api, found["metadata"]["name"])
        wait_for("the quarantine released", lambda: not _quarantine_claims(api, pool, device), 30)
