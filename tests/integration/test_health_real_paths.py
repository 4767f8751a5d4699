"""Device health on paths the first tests never took: restarts while a device is marked, claims
that users label as quarantine, and a pod bound after its claim was reserved on a marked device."""

from __future__ import annotations

import time
from typing import Any

from kubernetes import client

from claimwarden.health.records import RECORD_LABEL

from .health_helpers import device_of, events, holders, mark, record_for, unmark, wait_gone
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
