"""Shared pod/claim helpers: names, doneness, resolution, ownership, reservations, source."""

from __future__ import annotations

from typing import Any

import pytest

from claimwarden.objects.claims import (
    DELETE_PROTECTION_FINALIZER,
    POD_CLAIM_NAME_ANNOTATION,
    RESERVED_FOR_MAX,
    claim_source,
    controlling_pod_uid,
    generate_name,
    is_allocated,
    is_reserved_for,
)
from claimwarden.objects.pods import ResolvedClaim, is_pod_done, resolve_claim_names


def test_constants_match_upstream() -> None:
    assert POD_CLAIM_NAME_ANNOTATION == "resource.kubernetes.io/pod-claim-name"
    assert DELETE_PROTECTION_FINALIZER == "resource.kubernetes.io/delete-protection"
    assert RESERVED_FOR_MAX == 256


# --- generate_name ------------------------------------------------------------------------------

def test_short_names_keep_the_trailing_hyphen() -> None:
    assert generate_name("pod1", "gpu") == "pod1-gpu-"


def test_two_63_character_names_are_truncated_to_28_and_28() -> None:
    pod, claim = "p" * 63, "c" * 63
    name = generate_name(pod, claim)
    assert name == "p" * 28 + "-" + "c" * 28
    assert len(name) == 57


def test_name_of_exactly_57_characters_is_not_truncated() -> None:
    pod, claim = "p" * 30, "c" * 25  # 30 + 1 + 25 + 1 = 57
    assert generate_name(pod, claim) == f"{pod}-{claim}-"


def test_name_of_58_characters_is_truncated_without_trailing_hyphen() -> None:
    pod, claim = "p" * 31, "c" * 25  # 58 with the trailing hyphen
    name = generate_name(pod, claim)
    assert name == "p" * (31 * 57 // 58) + "-" + "c" * (25 * 57 // 58)
    assert name == "p" * 30 + "-" + "c" * 24
    assert not name.endswith("-")


def test_truncation_is_proportional_to_each_part() -> None:
    pod, claim = "a" * 80, "b" * 10  # full length 92
    assert generate_name(pod, claim) == "a" * (80 * 57 // 92) + "-" + "b" * (10 * 57 // 92)


# --- is_pod_done --------------------------------------------------------------------------------

def _pod(phase: str | None = None, node: str | None = None, deleting: bool = False) -> dict[str, Any]:
    pod: dict[str, Any] = {"metadata": {"name": "p", "uid": "u1"}, "spec": {}}
    if phase:
        pod["status"] = {"phase": phase}
    if node:
        pod["spec"]["nodeName"] = node
    if deleting:
        pod["metadata"]["deletionTimestamp"] = "2025-01-01T00:00:00Z"
    return pod


@pytest.mark.parametrize("phase", ["Succeeded", "Failed"])
def test_terminal_pods_are_done(phase: str) -> None:
    assert is_pod_done(_pod(phase=phase, node="n1"))


@pytest.mark.parametrize("phase", [None, "Pending", "Running", "Unknown"])
def test_live_pods_are_not_done(phase: str | None) -> None:
    assert not is_pod_done(_pod(phase=phase, node="n1"))


def test_deleting_unscheduled_pod_is_done() -> None:
    assert is_pod_done(_pod(phase="Pending", deleting=True))


def test_deleting_scheduled_pod_is_not_done() -> None:
    assert not is_pod_done(_pod(phase="Running", node="n1", deleting=True))


def test_pod_without_status_or_spec_is_not_done() -> None:
    assert not is_pod_done({"metadata": {"name": "p"}})


# --- controlling_pod_uid ------------------------------------------------------------------------

def _owned(*refs: dict[str, Any]) -> dict[str, Any]:
    return {"metadata": {"name": "c", "ownerReferences": list(refs)}}


def test_controlling_pod_uid_is_found() -> None:
    claim = _owned(
        {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs", "uid": "rs1"},
        {"apiVersion": "v1", "kind": "Pod", "name": "p", "uid": "u1", "controller": True},
    )
    assert controlling_pod_uid(claim) == "u1"


def test_non_controller_pod_owner_does_not_count() -> None:
    assert controlling_pod_uid(_owned({"apiVersion": "v1", "kind": "Pod", "name": "p", "uid": "u1"})) is None


def test_controller_that_is_not_a_core_pod_does_not_count() -> None:
    claim = _owned({"apiVersion": "scheduling.k8s.io/v1alpha2", "kind": "PodGroup", "name": "g", "uid": "g1",
                    "controller": True})
    assert controlling_pod_uid(claim) is None


def test_claim_without_metadata_has_no_controlling_pod() -> None:
    assert controlling_pod_uid({}) is None


# --- resolve_claim_names ------------------------------------------------------------------------

def test_resolution_covers_every_kind_of_entry_in_order() -> None:
    pod = {
        "metadata": {"name": "p", "uid": "u1"},
        "spec": {"resourceClaims": [
            {"name": "shared", "resourceClaimName": "big-claim"},
            {"name": "gpu", "resourceClaimTemplateName": "gpu-tmpl"},
            {"name": "nic", "resourceClaimTemplateName": "nic-tmpl"},
            {"name": "skip", "resourceClaimTemplateName": "skip-tmpl"},
            {"name": "empty", "resourceClaimTemplateName": "empty-tmpl"},
        ]},
        "status": {"resourceClaimStatuses": [
            {"name": "gpu", "resourceClaimName": "p-gpu-abcde"},
            {"name": "skip"},
            {"name": "empty", "resourceClaimName": ""},
        ]},
    }
    assert resolve_claim_names(pod) == [
        ResolvedClaim("shared", "big-claim", from_template=False, needed=True),
        ResolvedClaim("gpu", "p-gpu-abcde", from_template=True, needed=True),
        ResolvedClaim("nic", None, from_template=True, needed=True),
        ResolvedClaim("skip", None, from_template=True, needed=False),
        ResolvedClaim("empty", None, from_template=True, needed=False),
    ]


def test_pod_without_claims_or_status_resolves_to_nothing() -> None:
    assert resolve_claim_names({"metadata": {"name": "p"}}) == []


def test_template_entry_of_pod_without_status_is_not_generated_yet() -> None:
    pod = {"spec": {"resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "t"}]}}
    assert resolve_claim_names(pod) == [ResolvedClaim("gpu", None, from_template=True, needed=True)]


def test_entry_with_no_known_source_is_not_needed() -> None:
    pod = {"spec": {"resourceClaims": [{"name": "future"}]}}
    assert resolve_claim_names(pod) == [ResolvedClaim("future", None, from_template=False, needed=False)]


# --- reservations, allocation, source -----------------------------------------------------------

def test_is_reserved_for_matches_the_uid() -> None:
    claim = {"status": {"reservedFor": [{"resource": "pods", "name": "p", "uid": "u1"}]}}
    assert is_reserved_for(claim, "u1")
    assert not is_reserved_for(claim, "u2")
    assert not is_reserved_for({}, "u1")


def test_is_allocated_needs_an_allocation() -> None:
    assert is_allocated({"status": {"allocation": {"devices": {"results": []}}}})
    assert not is_allocated({"status": {}})
    assert not is_allocated({})


@pytest.mark.parametrize(("annotations", "source"), [
    ({}, "user"),
    ({POD_CLAIM_NAME_ANNOTATION: ""}, "user"),
    ({POD_CLAIM_NAME_ANNOTATION: "gpu"}, "resource_claim_template"),
    ({"resource.kubernetes.io/extended-resource-claim": "true"}, "extended_resource"),
    ({"resource.kubernetes.io/extended-resource-claim": "false"}, "user"),
    ({"resource.kubernetes.io/extended-resource-claim": "true", POD_CLAIM_NAME_ANNOTATION: "gpu"},
     "extended_resource"),
])
def test_claim_source_follows_the_annotations(annotations: dict[str, str], source: str) -> None:
    assert claim_source({"metadata": {"annotations": annotations}}) == source


def test_claim_source_of_bare_claim_is_user() -> None:
    assert claim_source({}) == "user"
