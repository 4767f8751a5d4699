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
