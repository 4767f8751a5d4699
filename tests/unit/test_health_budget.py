"""The eviction budget: a token bucket with an injected clock."""

from __future__ import annotations

import pytest

from claimwarden.health.budget import DEFAULT_BURST, DEFAULT_QPS, TokenBucket


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_defaults_let_one_broken_node_go_at_once() -> None:
    bucket = TokenBucket(qps=DEFAULT_QPS, burst=DEFAULT_BURST, clock=Clock())
    assert [bucket.take() for _ in range(8)] == [0.0] * 8


def test_an_empty_bucket_says_how_long_to_wait_and_refills_at_qps() -> None:
    clock = Clock()
    bucket = TokenBucket(qps=2, burst=3, clock=clock)
    assert [bucket.take() for _ in range(3)] == [0.0, 0.0, 0.0]
    assert bucket.take() == pytest.approx(0.5)
    assert bucket.take() == pytest.approx(0.5)  # a refusal takes nothing
    clock.now += 0.5
    assert bucket.take() == 0.0
    clock.now += 10
    assert [bucket.take() for _ in range(4)] == [0.0, 0.0, 0.0, pytest.approx(0.5)]  # never above burst


def test_zero_qps_means_no_budget() -> None:
    bucket = TokenBucket(qps=0, burst=1, clock=Clock())
    assert bucket.unlimited
    assert all(bucket.take() == 0.0 for _ in range(10_000))
