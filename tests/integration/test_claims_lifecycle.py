"""Claim lifecycle beyond the walkthrough: finished, restarting and pre-bound pods, lost claims,
late templates, long names, bad input."""

from __future__ import annotations

import time
from typing import Any

from kubernetes import client

from claimwarden_lab.cluster import LabState

from .helpers import claim_states, gpu_claim_spec, pod_with_claims, template, wait_for
from .operator import Operator

TEMPLATE_CLAIM = [{"name": "gpu", "resourceClaimTemplateName": "single-gpu"}]
# No lab device has this model, so pods using it stay Pending with an unallocated claim.
UNSATISFIABLE = {"devices": {"requests": [{"name": "gpu", "exactly": {
    "deviceClassName": "gpu.example.com",
    "selectors": [{"cel": {"expression": "device.attributes['gpu.example.com'].model == 'B200'"}}]}}]}}


def _claim_names(resource: client.ResourceV1Api, namespace: str) -> list[str]:
    return sorted(c.metadata.name for c in resource.list_namespaced_resource_claim(namespace).items)


def _pod_claim_name(core: client.CoreV1Api, namespace: str, pod: str) -> str | None:
    statuses = core.read_namespaced_pod(pod, namespace).status.resource_claim_statuses or []
    return next((s.resource_claim_name for s in statuses if s.resource_claim_name), None)


def _phase(core: client.CoreV1Api, namespace: str, pod: str, phase: str) -> client.V1Pod | None:
    found = core.read_namespaced_pod(pod, namespace)
    return found if found.status.phase == phase else None


def _events(core: client.CoreV1Api, namespace: str, name: str, reason: str) -> list[Any]:
    events = core.list_namespaced_event(namespace, field_selector=f"involvedObject.name={name}").items
    return [e for e in events if e.reason == reason]


def test_succeeded_pod_frees_its_device_and_its_generated_claim_is_deleted(
        api: client.ApiClient, namespace: str, claimwarden: Operator) -> None:
    core, resource, batch = client.CoreV1Api(api), client.ResourceV1Api(api), client.BatchV1Api(api)
    resource.create_namespaced_resource_claim_template(namespace, body=template("single-gpu"))
    pod_spec = pod_with_claims("unused", TEMPLATE_CLAIM)["spec"]
    pod_spec["restartPolicy"] = "Never"
    batch.create_namespaced_job(namespace, body={"metadata": {"name": "once"}, "spec": {
        "backoffLimit": 0, "template": {"spec": pod_spec}}})

    def finished_pod() -> client.V1Pod | None:
        pods = core.list_namespaced_pod(namespace, label_selector="job-name=once").items
        return pods[0] if pods and pods[0].status.phase == "Succeeded" else None

    pod = wait_for("the job's pod Succeeded", finished_pod, 60)
    generated = _pod_claim_name(core, namespace, pod.metadata.name)
    assert generated and generated.startswith(f"{pod.metadata.name}-gpu-")
    wait_for("the generated claim deleted", lambda: _claim_names(resource, namespace) == [], 60)
    assert core.read_namespaced_pod(pod.metadata.name, namespace).status.phase == "Succeeded"


def test_restarting_pod_keeps_its_claim(api: client.ApiClient, namespace: str, lab: LabState,
                                        claimwarden: Operator) -> None:
    core, resource = client.CoreV1Api(api), client.ResourceV1Api(api)
    resource.create_namespaced_resource_claim_template(namespace, body=template("single-gpu"))
    core.create_namespaced_pod(namespace, body=pod_with_claims("pod", TEMPLATE_CLAIM))
    pod = wait_for("pod Running", lambda: _phase(core, namespace, "pod", "Running"))
    [claim] = _claim_names(resource, namespace)

    # What a kubelet reports after a container restarted: still Running, restart count up.
    statuses = [{"name": c.name, "image": c.image, "imageID": "", "ready": True, "restartCount": 3,
                 "started": True, "state": {"running": {"startedAt": "2026-01-01T00:00:00Z"}},
                 "lastState": {"terminated": {"exitCode": 1, "reason": "Error"}}} for c in pod.spec.containers]
    core.patch_namespaced_pod_status("pod", namespace, {"status": {"containerStatuses": statuses}})
    time.sleep(5)
    assert _claim_names(resource, namespace) == [claim]
    assert claim_states(lab.bin_dir, str(lab.kubeconfig), namespace) == {claim: "allocated,reserved"}


def test_generated_claim_deleted_by_hand_while_pod_pending_is_recreated(
        api: client.ApiClient, namespace: str, claimwarden: Operator) -> None:
    core, resource = client.CoreV1Api(api), client.ResourceV1Api(api)
    resource.create_namespaced_resource_claim_template(namespace, body=template("single-gpu", UNSATISFIABLE))
    core.create_namespaced_pod(namespace, body=pod_with_claims("pod", TEMPLATE_CLAIM))
    first = wait_for("a claim recorded for the pod", lambda: _pod_claim_name(core, namespace, "pod"))
    assert _phase(core, namespace, "pod", "Pending")

    resource.delete_namespaced_resource_claim(first, namespace)

    def replaced() -> str | None:
        name = _pod_claim_name(core, namespace, "pod")
        return name if name and name != first and _claim_names(resource, namespace) == [name] else None

    second = wait_for("a new claim for the pending pod", replaced, 30)
    assert second.startswith("pod-gpu-")
    owner = resource.read_namespaced_resource_claim(second, namespace).metadata.owner_references[0]
    assert (owner.kind, owner.name, owner.controller) == ("Pod", "pod", True)


def test_template_created_after_its_pod_is_picked_up_within_seconds(
        api: client.ApiClient, namespace: str, claimwarden: Operator) -> None:
    core, resource = client.CoreV1Api(api), client.ResourceV1Api(api)
    core.create_namespaced_pod(namespace, body=pod_with_claims("pod", TEMPLATE_CLAIM))
    warning = wait_for("a FailedResourceClaimCreation event", lambda: _events(
        core, namespace, "pod", "FailedResourceClaimCreation"), 30)
    assert warning[0].type == "Warning"
    assert warning[0].message.startswith('PodResourceClaim gpu: resource claim template "single-gpu"')
    # Let the pod's retry back-off grow, so only the template watch can explain a quick claim.
    time.sleep(8)

    resource.create_namespaced_resource_claim_template(namespace, body=template("single-gpu"))
    created = time.monotonic()
    wait_for("the claim", lambda: _pod_claim_name(core, namespace, "pod"), 30)
    assert time.monotonic() - created < 5
    wait_for("pod Running", lambda: _phase(core, namespace, "pod", "Running"), 30)


def test_63_character_pod_and_pod_claim_names(api: client.ApiClient, namespace: str,
                                              claimwarden: Operator) -> None:
    core, resource = client.CoreV1Api(api), client.ResourceV1Api(api)
    pod_name, claim_name = "p" * 63, "c" * 63
    resource.create_namespaced_resource_claim_template(namespace, body=template("single-gpu"))
    core.create_namespaced_pod(namespace, body=pod_with_claims(
        pod_name, [{"name": claim_name, "resourceClaimTemplateName": "single-gpu"}]))
    wait_for("pod Running", lambda: _phase(core, namespace, pod_name, "Running"))
    [generated] = _claim_names(resource, namespace)
    assert generated[:57] == "p" * 28 + "-" + "c" * 28
    assert len(generated) == 62


def test_template_labels_and_annotations_are_copied(api: client.ApiClient, namespace: str,
                                                    claimwarden: Operator) -> None:
    core, resource = client.CoreV1Api(api), client.ResourceV1Api(api)
    resource.create_namespaced_resource_claim_template(namespace, body=template(
        "single-gpu", labels={"team": "ml"}, annotations={"example.com/note": "from-template"}))
    core.create_namespaced_pod(namespace, body=pod_with_claims("pod", TEMPLATE_CLAIM))
    name = wait_for("the claim", lambda: _pod_claim_name(core, namespace, "pod"))
    claim = resource.read_namespaced_resource_claim(name, namespace)
    assert claim.metadata.labels == {"team": "ml"}
    assert claim.metadata.annotations == {"example.com/note": "from-template",
                                          "resource.kubernetes.io/pod-claim-name": "gpu"}
    assert claim.spec.devices.requests[0].exactly.device_class_name == "gpu.example.com"


def test_a_template_too_big_to_keep_in_memory_still_gives_its_claims_every_label_and_annotation(
        api: client.ApiClient, namespace: str, claimwarden: Operator) -> None:
    """Over trimmed.TEMPLATE_SPEC_KEPT (16 KiB) the index keeps the template without its spec; the
    claim is then made from the template read by name, with all it inherits."""
    core, resource = client.CoreV1Api(api), client.ResourceV1Api(api)
    annotations = {f"example.com/note-{i}": "x" * 1000 for i in range(200)}  # about 200 KiB
    labels = {f"example.com/l-{i}": "v" * 63 for i in range(50)}
    resource.create_namespaced_resource_claim_template(namespace, body=template(
        "single-gpu", labels=labels, annotations=annotations))
    core.create_namespaced_pod(namespace, body=pod_with_claims("pod", TEMPLATE_CLAIM))
    name = wait_for("the claim", lambda: _pod_claim_name(core, namespace, "pod"))
    claim = resource.read_namespaced_resource_claim(name, namespace)
    assert claim.metadata.labels == labels
    assert claim.metadata.annotations == {**annotations, "resource.kubernetes.io/pod-claim-name": "gpu"}
    assert claim.spec.devices.requests[0].exactly.device_class_name == "gpu.example.com"
    wait_for("the pod running", lambda: _phase(core, namespace, "pod", "Running"))


def test_pod_bound_without_the_scheduler_gets_reserved(api: client.ApiClient, namespace: str,
                                                      claimwarden: Operator) -> None:
    core, resource = client.CoreV1Api(api), client.ResourceV1Api(api)
    resource.create_namespaced_resource_claim(namespace, body={"metadata": {"name": "shared"},
                                                               "spec": gpu_claim_spec()})
    core.create_namespaced_pod(namespace, body=pod_with_claims("first", [{"name": "gpu",
                                                                          "resourceClaimName": "shared"}]))
    node = wait_for("first Running", lambda: _phase(core, namespace, "first", "Running")).spec.node_name
    second = pod_with_claims("second", [{"name": "gpu", "resourceClaimName": "shared"}])
    second["spec"]["nodeName"] = node
    uid = core.create_namespaced_pod(namespace, body=second).metadata.uid

    def reserved() -> bool:
        claim = resource.read_namespaced_resource_claim("shared", namespace)
        return uid in {r.uid for r in claim.status.reserved_for or []}

    wait_for("the pre-bound pod in reservedFor", reserved, 30)


def test_failed_claim_creation_is_reported_on_the_pod(api: client.ApiClient, namespace: str,
                                                     claimwarden: Operator) -> None:
    """Admin access needs a namespace label; the apiserver refuses the claim and the pod says why."""
    core, resource = client.CoreV1Api(api), client.ResourceV1Api(api)
    spec = gpu_claim_spec()
    spec["devices"]["requests"][0]["exactly"]["adminAccess"] = True
    # The template itself is refused the same way, so put it in a labelled namespace's twin:
    # create it while labelled, then drop the label before the pod arrives.
    core.patch_namespace(namespace, {"metadata": {"labels": {"resource.kubernetes.io/admin-access": "true"}}})
    resource.create_namespaced_resource_claim_template(namespace, body=template("single-gpu", spec))
    core.patch_namespace(namespace, {"metadata": {"labels": {"resource.kubernetes.io/admin-access": None}}})
    core.create_namespaced_pod(namespace, body=pod_with_claims("pod", TEMPLATE_CLAIM))

    events = wait_for("a FailedResourceClaimCreation event", lambda: _events(
        core, namespace, "pod", "FailedResourceClaimCreation"), 30)
    assert events[0].message.startswith("PodResourceClaim gpu: create ResourceClaim: ")
    assert "admin-access" in events[0].message
    assert _claim_names(resource, namespace) == []
    assert "claimwarden_claim_creations_total{result=\"failure\"}" in claimwarden.metrics()
