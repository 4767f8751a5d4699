"""Extended-resource claims (KEP-5004, 1.36+): the scheduler's special claim, named only in the pod's
status.extendedResourceClaimStatus, is released, deleted and evicted like a generated claim."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from claimwarden.health.plan import plan_record, pod_uses_claim
from claimwarden.health.records import DeviceRef
from claimwarden.objects import trimmed
from claimwarden.objects.claims import (
    DELETE_PROTECTION_FINALIZER,
    EXTENDED_RESOURCE_CLAIM_ANNOTATION,
    is_generated_claim,
)
from claimwarden.objects.pods import extended_resource_claim_name, has_claims, pod_claim_names
from claimwarden.reservations.plan import plan_claim, pod_view

from .claim_fixtures import pod_owner_reference

MARKED = datetime(2026, 12, 1, 12, 0, 0, tzinfo=UTC)
REF = DeviceRef("gpu.example.com", "node-1", "gpu-0")
RESULT = {"request": "container-0-request-0", "driver": REF.driver, "pool": REF.pool, "device": REF.device}


def extended_pod(*, uid: str = "pod-uid", phase: str = "Running", claim: str | None = "worker-extended-resources-x",
                 templates: bool = False) -> dict[str, Any]:
    pod: dict[str, Any] = {"metadata": {"name": "worker", "namespace": "ns", "uid": uid},
                           "spec": {"nodeName": "node-1"}, "status": {"phase": phase}}
    if claim:
        pod["status"]["extendedResourceClaimStatus"] = {
            "resourceClaimName": claim,
            "requestMappings": [{"containerName": "c", "resourceName": "example.com/gpu",
                                 "requestName": "container-0-request-0"}]}
    if templates:
        pod["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": "tmpl"}]
        pod["status"]["resourceClaimStatuses"] = [{"name": "gpu", "resourceClaimName": "worker-gpu-y"}]
    return pod


def extended_claim(*, owner_uid: str = "pod-uid", reserved: bool = True, annotated: bool = True) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "worker-extended-resources-x", "namespace": "ns", "uid": "claim-uid",
                            "ownerReferences": [pod_owner_reference(owner_uid, "worker")],
                            "finalizers": [DELETE_PROTECTION_FINALIZER]}
    if annotated:
        meta["annotations"] = {EXTENDED_RESOURCE_CLAIM_ANNOTATION: "true"}
    status: dict[str, Any] = {"allocation": {"devices": {"results": [dict(RESULT)]}}}
    if reserved:
        status["reservedFor"] = [{"resource": "pods", "name": "worker", "uid": "pod-uid"}]
    return {"metadata": meta, "spec": {"devices": {"requests": []}}, "status": status}


# --- the pod and its claims --------------------------------------------------------------------

def test_a_pod_with_only_an_extended_resource_claim_has_claims() -> None:
    pod = extended_pod()
    assert extended_resource_claim_name(pod) == "worker-extended-resources-x"
    assert has_claims(pod)
    assert pod_claim_names(pod) == ["worker-extended-resources-x"]


def test_a_pod_before_prebind_has_no_claims() -> None:
    pod = extended_pod(claim=None)
    assert extended_resource_claim_name(pod) is None
    assert not has_claims(pod) and pod_claim_names(pod) == []
    pod["status"]["extendedResourceClaimStatus"] = {"resourceClaimName": ""}
    assert not has_claims(pod)


def test_template_claims_come_first_then_the_extended_claim() -> None:
    assert pod_claim_names(extended_pod(templates=True)) == ["worker-gpu-y", "worker-extended-resources-x"]


def test_the_pod_projection_keeps_the_claim_name_and_drops_the_mappings() -> None:
    projected = trimmed.pod(extended_pod())
    assert projected["status"]["extendedResourceClaimStatus"] == {"resourceClaimName": "worker-extended-resources-x"}
    assert "extendedResourceClaimStatus" not in trimmed.pod(extended_pod(claim=None))["status"]


def test_the_scheduler_claim_counts_as_generated_by_its_annotation() -> None:
    assert is_generated_claim(extended_claim())
    assert not is_generated_claim(extended_claim(annotated=False))


# --- reservations -------------------------------------------------------------------------------

def test_released_and_deleted_when_its_pod_succeeded() -> None:
    pod = pod_view(extended_pod(phase="Succeeded"))
    decided = plan_claim(extended_claim(), {"worker": pod}, pod)
    assert [e["name"] for e in decided.drop] == ["worker"]
    assert decided.deallocate and decided.remove_finalizer and decided.delete_claim


def test_released_but_left_to_the_garbage_collector_when_its_pod_is_gone() -> None:
    decided = plan_claim(extended_claim(), {"worker": None}, None)
    assert decided.drop and decided.deallocate and decided.remove_finalizer
    assert not decided.delete_claim


def test_kept_while_its_pod_runs() -> None:
    pod = pod_view(extended_pod())
    decided = plan_claim(extended_claim(), {"worker": pod}, pod)
    assert not (decided.drop or decided.deallocate or decided.remove_finalizer or decided.delete_claim)


def test_a_pod_owned_claim_without_either_annotation_is_never_deleted() -> None:
    pod = pod_view(extended_pod(phase="Failed"))
    decided = plan_claim(extended_claim(annotated=False), {"worker": pod}, pod)
    assert decided.drop and not decided.delete_claim


# --- health -------------------------------------------------------------------------------------

def record() -> dict[str, Any]:
    return {"metadata": {"name": "node-1.gpu-0.x", "uid": "r"},
            "spec": {"driver": REF.driver, "pool": REF.pool, "device": REF.device, "effect": "NoExecute"}}


def test_its_pod_is_evicted_when_the_device_is_marked() -> None:
    pod = extended_pod()
    decided = plan_record(record(), [extended_claim()], {("ns", "worker"): pod}, MARKED, "claimwarden")
    assert [(e.pod, e.claim, e.due) for e in decided.evict] == [("worker", "worker-extended-resources-x", MARKED)]
    assert decided.holders == ("ns/worker-extended-resources-x",)


def test_not_evicted_through_a_claim_it_does_not_control() -> None:
    """Like a template claim, the pod must control it (a same-name pod with another UID does not)."""
    claim = extended_claim(owner_uid="someone-else")
    assert not pod_uses_claim(extended_pod(), claim)
    decided = plan_record(record(), [claim], {("ns", "worker"): extended_pod()}, MARKED, "claimwarden")
    assert decided.evict == ()


def test_a_pod_with_both_kinds_is_evicted_once() -> None:
    pod = extended_pod(templates=True)
    template_claim = extended_claim()
    template_claim["metadata"] = {**template_claim["metadata"], "name": "worker-gpu-y", "annotations": {}}
    decided = plan_record(record(), [extended_claim(), template_claim], {("ns", "worker"): pod}, MARKED,
                          "claimwarden")
    assert [e.pod for e in decided.evict] == ["worker"]
    assert decided.would_evict == 1 and len(decided.holders) == 2
