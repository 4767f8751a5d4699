"""Telling a PodDisruptionBudget refusal from API Priority and Fairness throttling (both HTTP 429)."""

from __future__ import annotations

import json

from claimwarden.kube.errors import ApiError

# What kube-apiserver's eviction subresource answers when the budget allows no disruption
# (pkg/registry/core/pod/storage/eviction.go, checkAndDecrement; StatusCause.Type is sent as "reason").
PDB_REFUSAL = json.dumps({
    "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
    "message": "Cannot evict pod as it would violate the pod's disruption budget.",
    "reason": "TooManyRequests",
    "details": {"causes": [{"reason": "DisruptionBudget",
                            "message": "The disruption budget web needs 1 healthy pods and has 1 currently"}]},
    "code": 429})
# ... and while the budget controller has not caught up (createTooManyRequestsError, Retry-After 10).
PDB_NOT_PROCESSED = json.dumps({
    "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
    "message": "Cannot evict pod as it would violate the pod's disruption budget.",
    "reason": "TooManyRequests",
    "details": {"causes": [{"reason": "DisruptionBudget",
                            "message": "The disruption budget web is still being processed by the server."}],
                "retryAfterSeconds": 10},
    "code": 429})
# API Priority and Fairness (and max-in-flight) reject with plain text and a Retry-After header.
APF_REJECTION = "Too many requests, please try again later.\n"
# A Status 429 without a budget cause (e.g. the storage layer's NewTooManyRequests).
STATUS_THROTTLED = json.dumps({
    "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
    "message": "Too many requests, please try again later.", "reason": "TooManyRequests",
    "details": {"retryAfterSeconds": 1}, "code": 429})


def test_a_disruption_budget_refusal_is_not_throttling() -> None:
    error = ApiError.from_response(429, PDB_REFUSAL)
    assert error.disruption_budget and not error.throttled
    assert error.reason == "TooManyRequests"
    assert error.causes == ("DisruptionBudget",)
    assert error.retry_after is None
    assert error.message == "Cannot evict pod as it would violate the pod's disruption budget."


def test_a_budget_still_being_processed_keeps_its_retry_after() -> None:
    error = ApiError.from_response(429, PDB_NOT_PROCESSED, {"Retry-After": "10"})
    assert error.disruption_budget
    assert error.retry_after == 10
    assert ApiError.from_response(429, PDB_NOT_PROCESSED).retry_after == 10, "from details.retryAfterSeconds"


def test_priority_and_fairness_rejection_is_throttling_with_retry_after() -> None:
    error = ApiError.from_response(429, APF_REJECTION, {"Retry-After": "3", "Content-Type": "text/plain"})
    assert error.throttled and not error.disruption_budget
    assert error.too_many_requests
    assert error.retry_after == 3
    assert error.message == "Too many requests, please try again later."


def test_a_status_429_without_a_budget_cause_is_throttling() -> None:
    error = ApiError.from_response(429, STATUS_THROTTLED)
    assert error.throttled and not error.disruption_budget
    assert error.retry_after == 1


def test_other_errors_are_neither() -> None:
    error = ApiError.from_response(409, json.dumps({"kind": "Status", "reason": "Conflict", "message": "x",
                                                    "code": 409}), {"Retry-After": "soon"})
    assert error.conflict and not error.throttled and not error.disruption_budget
    assert error.retry_after is None


# --- HTTP 404: the object is missing, or the resource is not served ----------------------------------
# Recorded from kube-apiserver v1.37.2 in the lab (podgroups preset, scheduling.k8s.io v1beta1 and v1alpha3
# served, the UnhealthyDevice CRD not installed), with curl; the same for GET and DELETE.

# GET /apis/scheduling.k8s.io/v1beta1/namespaces/default/podgroups/x: served, no such PodGroup.
PODGROUP_MISSING = json.dumps({
    "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
    "message": 'podgroups.scheduling.k8s.io "x" not found', "reason": "NotFound",
    "details": {"name": "x", "group": "scheduling.k8s.io", "kind": "podgroups"}, "code": 404})
# GET /api/v1/namespaces/nosuchns/pods/x: a core object (no group) in a namespace that does not exist.
POD_MISSING = json.dumps({
    "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": 'pods "x" not found',
    "reason": "NotFound", "details": {"name": "x", "kind": "pods"}, "code": 404})
# POST /apis/coordination.k8s.io/v1/namespaces/nosuchns/leases (and resourceclaims), v1.34.4: the namespace
# is missing. The elector and the quarantine create the namespace on this answer.
NAMESPACE_MISSING = json.dumps({
    "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
    "message": 'namespaces "nosuchns" not found', "reason": "NotFound",
    "details": {"name": "nosuchns", "kind": "namespaces"}, "code": 404})
# GET /apis/scheduling.k8s.io/v1alpha2/namespaces/default/podgroups/x: a version this server does not serve
# (also /apis/resource.k8s.io/v1alpha3/devicetaintrules/x, and discovery of /apis/scheduling.k8s.io/v1alpha2).
NOT_SERVED = json.dumps({
    "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
    "message": "the server could not find the requested resource", "reason": "NotFound", "details": {},
    "code": 404})
# GET /apis/claimwarden.io/v1alpha1/unhealthydevices/x with the CRD not installed (text/plain).
NO_SUCH_GROUP = "404 page not found\n"


def test_a_404_naming_the_object_is_a_missing_object() -> None:
    from claimwarden.kube.errors import NotServed

    for body in (PODGROUP_MISSING, POD_MISSING, NAMESPACE_MISSING):
        error = ApiError.from_response(404, body)
        assert error.not_found and not isinstance(error, NotServed), body
        assert error.reason == "NotFound"


def test_a_404_for_a_resource_the_server_does_not_serve_is_not_a_missing_object() -> None:
    from claimwarden.kube.errors import NotServed

    for body in (NOT_SERVED, NO_SUCH_GROUP, "", "{}"):
        error = ApiError.from_response(404, body)
        assert isinstance(error, NotServed) and not error.not_found, body
        assert error.status == 404
    assert ApiError.from_response(404, NOT_SERVED).message == "the server could not find the requested resource"
    assert ApiError.from_response(404, NO_SUCH_GROUP).message == "404 page not found"
