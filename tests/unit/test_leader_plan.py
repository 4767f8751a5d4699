"""Leader election decisions on a Lease, by client-go's rules, with plain data."""

from __future__ import annotations

from typing import Any

from claimwarden.leader.elector import ElectionSettings
from claimwarden.leader.plan import CREATE, RENEW, TAKE_OVER, WAIT, Observed, decide, record_of, released

ME, OTHER = "me", "other"
WALL = "2026-12-01T12:00:00.000000Z"


def lease(holder: str, renew: str = "2026-12-01T11:59:59.000000Z", transitions: int = 3,
          duration: int = 15) -> dict[str, Any]:
    return {"metadata": {"name": "claimwarden", "resourceVersion": "7"},
            "spec": {"holderIdentity": holder, "leaseDurationSeconds": duration,
                     "acquireTime": "2026-12-01T11:00:00.000000Z", "renewTime": renew, "leaseTransitions": transitions}}


def test_no_lease_is_created_held_by_this_candidate() -> None:
    decision = decide(None, identity=ME, observed=None, now=100.0, wall_now=WALL, lease_seconds=15)
    assert decision.action == CREATE
    assert decision.spec == {"holderIdentity": ME, "leaseDurationSeconds": 15, "acquireTime": WALL,
                             "renewTime": WALL, "leaseTransitions": 0}


def test_the_holder_renews_and_keeps_its_acquire_time_and_transitions() -> None:
    decision = decide(lease(ME), identity=ME, observed=None, now=100.0, wall_now=WALL, lease_seconds=15)
    assert decision.action == RENEW
    assert decision.spec is not None
    assert decision.spec["renewTime"] == WALL
    assert decision.spec["acquireTime"] == "2026-12-01T11:00:00.000000Z"
    assert decision.spec["leaseTransitions"] == 3


def test_a_live_holder_is_waited_for_by_the_local_clock_not_by_its_renew_time() -> None:
    # The renewTime is an hour old by the wall clock, but this candidate saw it change just now.
    old = lease(OTHER, renew="2026-12-01T11:00:00.000000Z")
    decision = decide(old, identity=ME, observed=None, now=100.0, wall_now=WALL, lease_seconds=15)
    assert decision.action == WAIT
    assert decision.observed == Observed(record_of(old), 100.0)
    later = decide(old, identity=ME, observed=decision.observed, now=114.9, wall_now=WALL, lease_seconds=15)
    assert later.action == WAIT


def test_a_holder_silent_for_a_whole_lease_duration_is_taken_over_with_one_more_transition() -> None:
    old = lease(OTHER)
    observed = Observed(record_of(old), 100.0)
    decision = decide(old, identity=ME, observed=observed, now=115.0, wall_now=WALL, lease_seconds=15)
    assert decision.action == TAKE_OVER
    assert decision.spec == {"holderIdentity": ME, "leaseDurationSeconds": 15, "acquireTime": WALL,
                             "renewTime": WALL, "leaseTransitions": 4}


def test_a_renewal_restarts_the_wait() -> None:
    observed = Observed(record_of(lease(OTHER)), 100.0)
    renewed = lease(OTHER, renew="2026-12-01T11:59:59.500000Z")
    decision = decide(renewed, identity=ME, observed=observed, now=116.0, wall_now=WALL, lease_seconds=15)
    assert decision.action == WAIT and decision.observed == Observed(record_of(renewed), 116.0)


def test_the_holders_own_duration_counts_not_the_candidates() -> None:
    old = lease(OTHER, duration=60)
    observed = Observed(record_of(old), 100.0)
    assert decide(old, identity=ME, observed=observed, now=130.0, wall_now=WALL, lease_seconds=15).action == WAIT


def test_a_released_lease_is_taken_at_once() -> None:
    free = {**lease(OTHER), "spec": released(lease(OTHER)["spec"], WALL)}
    assert free["spec"]["holderIdentity"] == "" and free["spec"]["leaseDurationSeconds"] == 1
    decision = decide(free, identity=ME, observed=None, now=100.0, wall_now=WALL, lease_seconds=15)
    assert decision.action == TAKE_OVER


def test_durations_are_checked_like_client_go() -> None:
    assert ElectionSettings(namespace="ns", identity=ME).problems() == []
    assert ElectionSettings(namespace="ns", identity=ME, lease_seconds=10, renew_deadline_seconds=10).problems()
    assert ElectionSettings(namespace="ns", identity=ME, renew_deadline_seconds=2, retry_seconds=2).problems()
