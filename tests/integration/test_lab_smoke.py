"""The lab is a real cluster: the real scheduler allocates DRA claims and kwok runs the pods."""

from __future__ import annotations

import time

from kubernetes import client

from .helpers import gpu_claim_spec, pod_with_claims, wait_for
from .operator import Operator


def test_standalone_claim_is_allocated_and_pod_runs(api: client.ApiClient, namespace: str) -> None:
    core, resource = client.CoreV1Api(api), client.ResourceV1Api(api)
    resource.create_namespaced_resource_claim(namespace, body={
        "metadata": {"name": "single-gpu"}, "spec": gpu_claim_spec()})
    core.create_namespaced_pod(namespace, body=pod_with_claims(
        "pod0", [{"name": "gpu", "resourceClaimName": "single-gpu"}]))

    pod = wait_for("pod0 Running", lambda: (
        p if (p := core.read_namespaced_pod("pod0", namespace)).status.phase == "Running" else None))
    assert pod.spec.node_name and pod.spec.node_name.startswith("kwok-node-")

    claim = resource.read_namespaced_resource_claim("single-gpu", namespace)
    results = claim.status.allocation.devices.results
    assert len(results) == 1
    assert results[0].driver == "gpu.example.com"
    assert results[0].pool == pod.spec.node_name
    assert results[0].device.startswith("gpu-")
    assert [(r.resource, r.name, r.uid) for r in claim.status.reserved_for] == [
        ("pods", "pod0", pod.metadata.uid)]
    assert "resource.kubernetes.io/delete-protection" in (claim.metadata.finalizers or [])


def test_template_pod_stays_pending_without_claimwarden(api: client.ApiClient, namespace: str,
                                                       operator_process: Operator) -> None:
    """kube-controller-manager's claim controller is off in the default lab: that job is ours."""
    with operator_process.stopped():
        _assert_template_pod_stays_pending(api, namespace)


def _assert_template_pod_stays_pending(api: client.ApiClient, namespace: str) -> None:
    core, resource = client.CoreV1Api(api), client.ResourceV1Api(api)
    resource.create_namespaced_resource_claim_template(namespace, body={
        "metadata": {"name": "gpu-template"}, "spec": {"spec": gpu_claim_spec()}})
    core.create_namespaced_pod(namespace, body=pod_with_claims(
        "pod0", [{"name": "gpu", "resourceClaimTemplateName": "gpu-template"}]))

    # Give the controller-manager and scheduler ample time to act if they were going to.
    time.sleep(10)
    pod = core.read_namespaced_pod("pod0", namespace)
    assert pod.status.phase == "Pending"
    assert not pod.spec.node_name
    assert not pod.status.resource_claim_statuses
    assert resource.list_namespaced_resource_claim(namespace).items == []
