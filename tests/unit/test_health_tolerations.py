"""Device tolerations and eviction times, with upstream's rules for NoExecute taints."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from claimwarden.health.records import TAINT_KEY, DeviceRef
from claimwarden.health.tolerations import claim_eviction_time, eviction_time, tolerates

ADDED = datetime(2025, 6, 1, 12, 0, 0, tzinfo=UTC)
TAINT = {"key": TAINT_KEY, "value": "unhealthy", "effect": "NoExecute"}
REF = DeviceRef("gpu.example.com", "node-1", "gpu-0")


def tol(key: str | None = TAINT_KEY, operator: str | None = None, value: str | None = None,
        effect: str | None = "NoExecute", seconds: int | None = None) -> dict[str, Any]:
    fields = {"key": key, "operator": operator, "value": value, "effect": effect, "tolerationSeconds": seconds}
    return {name: field for name, field in fields.items() if field is not None}


# --- tolerates ----------------------------------------------------------------------------------

@pytest.mark.parametrize(("toleration", "expected"), [
    (tol(operator="Exists"), True),
    (tol(operator="Exists", value="anything"), True),
    (tol(operator="Equal", value="unhealthy"), True),
    (tol(operator=None, value="unhealthy"), True),
    (tol(operator="Equal", value="other"), False),
    (tol(operator="Equal"), False),
    (tol(key="other", operator="Exists"), False),
    (tol(key=None, operator="Exists"), True),
    (tol(key="", operator="Exists", effect=None), True),
    (tol(key=None, operator="Equal", value="unhealthy"), False),
    (tol(operator="Exists", effect=None), True),
    (tol(operator="Exists", effect="NoSchedule"), False),
    (tol(operator="Bogus", value="unhealthy"), False),
])
def test_tolerates(toleration: dict[str, Any], expected: bool) -> None:
    assert tolerates(toleration, TAINT) is expected


def test_tolerates_empty_taint_value() -> None:
    taint = {"key": TAINT_KEY, "value": "", "effect": "NoSchedule"}
    assert tolerates(tol(effect=None), taint)
    assert tolerates({"key": TAINT_KEY, "effect": "NoSchedule"}, {"key": TAINT_KEY, "effect": "NoSchedule"})
    assert not tolerates(tol(effect="NoExecute"), taint)


# --- eviction_time ------------------------------------------------------------------------------

def test_no_toleration_evicts_at_time_added() -> None:
    assert eviction_time(TAINT, [], ADDED) == ADDED


def test_non_matching_toleration_evicts_at_time_added() -> None:
    assert eviction_time(TAINT, [tol(key="other", operator="Exists")], ADDED) == ADDED


def test_matching_toleration_without_seconds_tolerates_forever() -> None:
    assert eviction_time(TAINT, [tol(operator="Exists")], ADDED) is None


def test_empty_effect_toleration_does_not_protect_from_eviction() -> None:
    assert eviction_time(TAINT, [tol(operator="Exists", effect=None)], ADDED) == ADDED
    assert eviction_time(TAINT, [tol(key=None, operator="Exists", effect=None)], ADDED) == ADDED


def test_no_schedule_toleration_does_not_protect_from_eviction() -> None:
    assert eviction_time(TAINT, [tol(operator="Exists", effect="NoSchedule")], ADDED) == ADDED


def test_toleration_seconds_delay_eviction() -> None:
    assert eviction_time(TAINT, [tol(operator="Exists", seconds=300)], ADDED) == ADDED + timedelta(seconds=300)


def test_smallest_toleration_seconds_wins() -> None:
    tolerations = [tol(operator="Exists", seconds=300), tol(operator="Equal", value="unhealthy", seconds=60),
                   tol(key="other", operator="Exists", seconds=5)]
    assert eviction_time(TAINT, tolerations, ADDED) == ADDED + timedelta(seconds=60)


def test_negative_toleration_seconds_count_as_zero() -> None:
    tolerations = [tol(operator="Exists", seconds=-30), tol(operator="Exists", seconds=100)]
    assert eviction_time(TAINT, tolerations, ADDED) == ADDED


def test_zero_toleration_seconds() -> None:
    assert eviction_time(TAINT, [tol(operator="Exists", seconds=0)], ADDED) == ADDED


def test_forever_wins_over_seconds() -> None:
    tolerations = [tol(operator="Exists", seconds=10), tol(operator="Exists")]
    assert eviction_time(TAINT, tolerations, ADDED) is None


def test_empty_key_exists_no_execute_tolerates_forever() -> None:
    assert eviction_time(TAINT, [tol(key=None, operator="Exists")], ADDED) is None


@pytest.mark.parametrize("effect", ["NoSchedule", "None"])
def test_other_effects_never_evict(effect: str) -> None:
    assert eviction_time({**TAINT, "effect": effect}, [], ADDED) is None


# --- claim_eviction_time ------------------------------------------------------------------------

def result(device: str = "gpu-0", tolerations: list[dict[str, Any]] | None = None, *,
           driver: str = "gpu.example.com", pool: str = "node-1") -> dict[str, Any]:
    entry: dict[str, Any] = {"request": "gpu", "driver": driver, "pool": pool, "device": device}
    if tolerations is not None:
        entry["tolerations"] = tolerations
    return entry


def claim_with(*results: dict[str, Any]) -> dict[str, Any]:
    return {"metadata": {"name": "c", "namespace": "ns"},
            "status": {"allocation": {"devices": {"results": list(results)}}}}


def test_claim_eviction_time_for_allocated_device() -> None:
    assert claim_eviction_time(claim_with(result()), REF, TAINT, ADDED) == ADDED


def test_claim_eviction_time_uses_each_results_own_tolerations() -> None:
    claim = claim_with(result(tolerations=[tol(operator="Exists")]),
                       result(tolerations=[tol(operator="Exists", seconds=120)]))
    assert claim_eviction_time(claim, REF, TAINT, ADDED) == ADDED + timedelta(seconds=120)


def test_claim_eviction_time_ignores_other_devices_tolerations_and_results() -> None:
    claim = claim_with(result("gpu-1"), result(tolerations=[tol(operator="Exists", seconds=60)]))
    assert claim_eviction_time(claim, REF, TAINT, ADDED) == ADDED + timedelta(seconds=60)


def test_claim_eviction_time_none_when_device_not_allocated() -> None:
    assert claim_eviction_time(claim_with(result("gpu-1")), REF, TAINT, ADDED) is None
    assert claim_eviction_time(claim_with(result(driver="other.example.com")), REF, TAINT, ADDED) is None
    assert claim_eviction_time(claim_with(result(pool="node-2")), REF, TAINT, ADDED) is None
    assert claim_eviction_time({"metadata": {"name": "c"}}, REF, TAINT, ADDED) is None


def test_claim_eviction_time_none_when_tolerated_forever() -> None:
    claim = claim_with(result(tolerations=[tol(operator="Exists")]))
    assert claim_eviction_time(claim, REF, TAINT, ADDED) is None


def _claim_whose_request_tolerates(copied: dict[str, Any]) -> dict[str, Any]:
    claim = claim_with(copied)
    claim["spec"] = {"devices": {"requests": [{"name": "gpu", "exactly": {
        "deviceClassName": "gpu", "tolerations": [tol(operator="Exists")]}}]}}
    return claim


def test_on_a_server_that_copies_only_the_results_tolerations_count() -> None:
    """As upstream's eviction controller: a result without a copy tolerates nothing (another allocator
    allocated it, or it dates from before an upgrade), whatever the request says."""
    claim = _claim_whose_request_tolerates(result())
    assert claim_eviction_time(claim, REF, TAINT, ADDED, server_copies=True) == ADDED
    copied = _claim_whose_request_tolerates(result(tolerations=[tol(operator="Exists", seconds=30)]))
    assert claim_eviction_time(copied, REF, TAINT, ADDED, server_copies=True) == ADDED + timedelta(seconds=30)


def test_on_a_server_not_known_to_copy_the_request_stands_in_for_a_missing_copy() -> None:
    """Kubernetes 1.34's allocator honours request tolerations but never copies them."""
    assert claim_eviction_time(_claim_whose_request_tolerates(result()), REF, TAINT, ADDED) is None
    # A copy, where there is one, still wins over the request.
    copied = _claim_whose_request_tolerates(result(tolerations=[tol(operator="Exists", seconds=30)]))
    assert claim_eviction_time(copied, REF, TAINT, ADDED) == ADDED + timedelta(seconds=30)


def test_request_tolerations_stand_in_when_the_result_has_no_copy() -> None:
    from claimwarden.health.tolerations import result_tolerations

    toleration = {"key": "claimwarden.io/unhealthy", "operator": "Exists", "effect": "NoExecute"}
    claim = {"spec": {"devices": {"requests": [
        {"name": "gpu", "exactly": {"tolerations": [toleration]}},
        {"name": "any", "firstAvailable": [{"name": "big"}, {"name": "small", "tolerations": [toleration]}]}]}}}
    assert result_tolerations(claim, {"request": "gpu"}, server_copies=False) == [toleration]
    assert result_tolerations(claim, {"request": "any/small"}, server_copies=False) == [toleration]
    assert result_tolerations(claim, {"request": "any/big"}, server_copies=False) == []
    assert result_tolerations(claim, {"request": "other"}, server_copies=False) == []
    # The API server omits an empty list: an empty one is no copy either.
    assert result_tolerations(claim, {"request": "gpu", "tolerations": []}, server_copies=False) == [toleration]
    for request in ("gpu", "any/small"):
        assert result_tolerations(claim, {"request": request}, server_copies=True) == []


def test_copies_tolerations_needs_one_result_carrying_them() -> None:
    from claimwarden.health.tolerations import copies_tolerations

    assert not copies_tolerations([])
    assert not copies_tolerations([claim_with(result()), {"metadata": {"name": "pending"}}])
    assert not copies_tolerations([claim_with(result(tolerations=[]))])
    assert copies_tolerations([claim_with(result()), claim_with(result("gpu-1", [tol(operator="Exists")]))])
