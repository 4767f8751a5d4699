"""The DRA walkthrough's four experiments, with claimwarden generating and releasing the claims."""

from __future__ import annotations

import re

from kubernetes import client

from claimwarden_lab.cluster import LabState

from .helpers import claim_states, gpu_claim_spec, pod_with_claims, template, wait_for
from .operator import Operator

TEMPLATE_CLAIM = [{"name": "gpu", "resourceClaimTemplateName": "single-gpu"}]


def _allocated_device(resource: client.ResourceV1Api, namespace: str, name: str) -> tuple[str, str]:
    claim = resource.read_namespaced_resource_claim(name, namespace)
    [result] = claim.status.allocation.devices.results
    return result.pool, result.device


def _running(core: client.CoreV1Api, namespace: str, name: str) -> client.V1Pod | None:
    pod = core.read_namespaced_pod(name, namespace)
    return pod if pod.status.phase == "Running" else None


def test_experiment_1_two_pods_one_template_get_two_claims_on_different_devices(
        api: client.ApiClient, namespace: str, lab: LabState, claimwarden: Operator) -> None:
    core, resource = client.CoreV1Api(api), client.ResourceV1Api(api)
    resource.create_namespaced_resource_claim_template(namespace, body=template("single-gpu"))
    for pod in ("pod1", "pod2"):
        core.create_namespaced_pod(namespace, body=pod_with_claims(pod, TEMPLATE_CLAIM))
    for pod in ("pod1", "pod2"):
        wait_for(f"{pod} Running", lambda pod=pod: _running(core, namespace, pod))

    states = claim_states(lab.bin_dir, str(lab.kubeconfig), namespace)
    assert len(states) == 2, states
    assert sorted(re.sub(r"[a-z0-9]{5}$", "xxxxx", n) for n in states) == ["pod1-gpu-xxxxx", "pod2-gpu-xxxxx"]
    assert set(states.values()) == {"allocated,reserved"}
    devices = {_allocated_device(resource, namespace, name) for name in states}
    assert len(devices) == 2
    for pod in ("pod1", "pod2"):
        status = core.read_namespaced_pod(pod, namespace).status.resource_claim_statuses
        assert [(s.name, s.resource_claim_name.startswith(f"{pod}-gpu-")) for s in status] == [("gpu", True)]


def test_experiment_2_two_containers_share_one_pod_claim(
        api: client.ApiClient, namespace: str, lab: LabState, claimwarden: Operator) -> None:
    core, resource = client.CoreV1Api(api), client.ResourceV1Api(api)
    resource.create_namespaced_resource_claim_template(namespace, body=template("single-gpu"))
    core.create_namespaced_pod(namespace, body=pod_with_claims("pod", TEMPLATE_CLAIM, containers=[["gpu"], ["gpu"]]))
    pod = wait_for("pod Running", lambda: _running(core, namespace, "pod"))

    states = claim_states(lab.bin_dir, str(lab.kubeconfig), namespace)
    assert list(states.values()) == ["allocated,reserved"]
    [name] = states
    claim = resource.read_namespaced_resource_claim(name, namespace)
    assert len(claim.status.allocation.devices.results) == 1
    assert [r.uid for r in claim.status.reserved_for] == [pod.metadata.uid]
    assert [c.resources.claims[0].name for c in pod.spec.containers] == ["gpu", "gpu"]


def test_experiment_3_two_pods_share_one_standalone_claim(
        api: client.ApiClient, namespace: str, lab: LabState, claimwarden: Operator) -> None:
    core, resource = client.CoreV1Api(api), client.ResourceV1Api(api)
    resource.create_namespaced_resource_claim(namespace, body={"metadata": {"name": "shared-gpu"},
                                                               "spec": gpu_claim_spec()})
    for pod in ("pod1", "pod2"):
        core.create_namespaced_pod(namespace, body=pod_with_claims(
            pod, [{"name": "gpu", "resourceClaimName": "shared-gpu"}]))
    uids = {wait_for(f"{pod} Running", lambda pod=pod: _running(core, namespace, pod)).metadata.uid
            for pod in ("pod1", "pod2")}

    claim = resource.read_namespaced_resource_claim("shared-gpu", namespace)
    assert len(claim.status.allocation.devices.results) == 1
    assert {r.uid for r in claim.status.reserved_for} == uids
    assert claim_states(lab.bin_dir, str(lab.kubeconfig), namespace) == {"shared-gpu": "allocated,reserved"}


def test_experiment_4_deleting_pods_frees_standalone_and_deletes_generated_claims(
        api: client.ApiClient, namespace: str, lab: LabState, claimwarden: Operator) -> None:
    core, resource = client.CoreV1Api(api), client.ResourceV1Api(api)
    resource.create_namespaced_resource_claim_template(namespace, body=template("single-gpu"))
    resource.create_namespaced_resource_claim(namespace, body={"metadata": {"name": "shared-gpu"},
                                                               "spec": gpu_claim_spec()})
    core.create_namespaced_pod(namespace, body=pod_with_claims("generated", TEMPLATE_CLAIM))
    for pod in ("shared1", "shared2"):
        core.create_namespaced_pod(namespace, body=pod_with_claims(
            pod, [{"name": "gpu", "resourceClaimName": "shared-gpu"}]))
    for pod in ("generated", "shared1", "shared2"):
        wait_for(f"{pod} Running", lambda pod=pod: _running(core, namespace, pod))
    assert set(claim_states(lab.bin_dir, str(lab.kubeconfig), namespace).values()) == {"allocated,reserved"}

    for pod in ("generated", "shared1", "shared2"):
        core.delete_namespaced_pod(pod, namespace)

    def settled() -> dict[str, str] | None:
        states = claim_states(lab.bin_dir, str(lab.kubeconfig), namespace)
        return states if states == {"shared-gpu": "pending"} else None

    wait_for("generated claim deleted and standalone claim pending", settled, 60)
    claim = resource.read_namespaced_resource_claim("shared-gpu", namespace)
    assert claim.status.allocation is None and not claim.status.reserved_for
    # The finalizer goes in a second write after the status one (as upstream's controller does it).
    wait_for("the delete-protection finalizer removed", lambda: "resource.kubernetes.io/delete-protection" not in (
        resource.read_namespaced_resource_claim("shared-gpu", namespace).metadata.finalizers or []), 10)
    assert [t.metadata.name for t in resource.list_namespaced_resource_claim_template(namespace).items] == [
        "single-gpu"]
