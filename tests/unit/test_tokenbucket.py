"""The one token bucket: its three ways to spend (reserve, take/give_back, take_batch) on a driven clock."""

from __future__ import annotations

import pytest

from claimwarden.tokenbucket import TokenBucket

from .test_health_budget import Clock


def test_the_bucket_starts_full_and_refills_at_qps_up_to_burst() -> None:
    clock = Clock()
    bucket = TokenBucket(qps=2, burst=3, clock=clock)
    assert [bucket.take() for _ in range(3)] == [0.0, 0.0, 0.0]
    assert bucket.take() == pytest.approx(0.5)
    clock.now += 100.0  # long idle: no more than burst
    assert [bucket.take() for _ in range(4)] == [0.0, 0.0, 0.0, pytest.approx(0.5)]


def test_take_takes_nothing_when_it_reports_a_wait_and_give_back_returns_a_token() -> None:
    clock = Clock()
    bucket = TokenBucket(qps=1, burst=1, clock=clock)
    assert bucket.take() == 0.0
    assert bucket.take() == pytest.approx(1.0)
    clock.now += 0.5
    assert bucket.wait() == pytest.approx(0.5)  # the refused take above cost nothing
    bucket.give_back()
    assert bucket.take() == 0.0
    bucket.give_back()
    bucket.give_back()
    assert bucket.take() == 0.0
    assert bucket.take() > 0.0  # give_back never fills above burst


def test_reserve_goes_into_debt_so_waiting_callers_keep_their_order() -> None:
    bucket = TokenBucket(qps=4, burst=1, now=10.0)
    assert [bucket.reserve(10.0) for _ in range(4)] == [0.0, 0.25, 0.5, pytest.approx(0.75)]
    assert bucket.reserve(11.0) == pytest.approx(0.0)  # the debt is paid after a second
    assert bucket.reserve(10.5) == pytest.approx(0.25)  # a moment before the last one adds nothing


def test_take_batch_takes_all_or_nothing_and_a_batch_over_burst_takes_the_whole_bucket() -> None:
    clock = Clock()
    bucket = TokenBucket(qps=1, burst=5, clock=clock)
    assert bucket.take_batch(3)
    assert not bucket.take_batch(3)  # two left: nothing taken
    assert bucket.take_batch(2)
    clock.now += 5.0
    assert bucket.take_batch(50)  # more than burst: the whole (full) bucket
    assert not bucket.take_batch(1)


def test_no_qps_means_no_limit_for_every_way_to_spend() -> None:
    bucket = TokenBucket(qps=0, burst=1, clock=Clock())
    assert bucket.unlimited
    assert {bucket.take() for _ in range(100)} == {0.0}
    assert {bucket.reserve() for _ in range(100)} == {0.0}
    assert all(bucket.take_batch(1000) for _ in range(10))


def test_burst_below_one_still_lets_one_request_through() -> None:
    bucket = TokenBucket(qps=1, burst=0, clock=Clock())
    assert bucket.burst == 1
    assert bucket.take() == 0.0
