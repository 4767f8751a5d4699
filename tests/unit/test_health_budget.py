"""The eviction budget: a token bucket with an injected clock."""

from __future__ import annotations

from collections.abc import Hashable

import pytest

from claimwarden.health.budget import DEFAULT_BURST, DEFAULT_QPS, FairBudget
from claimwarden.tokenbucket import TokenBucket


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


def test_a_token_given_back_can_be_taken_again_but_never_above_burst() -> None:
    clock = Clock()
    bucket = TokenBucket(qps=1, burst=2, clock=clock)
    assert [bucket.take(), bucket.take()] == [0.0, 0.0]
    bucket.give_back()
    assert bucket.wait() == 0.0 and bucket.take() == 0.0
    bucket.give_back()
    bucket.give_back()
    bucket.give_back()
    assert [bucket.take(), bucket.take()] == [0.0, 0.0]
    assert bucket.take() == pytest.approx(1.0)


def _drain(budget: FairBudget, clock: Clock, steps: int, step: float = 1.0) -> list[Hashable]:
    """The keys granted, in order, as the clock moves on `steps` times; each comes back for its token at once."""
    order: list[Hashable] = []
    for _ in range(steps):
        clock.now += step
        for key in budget.grant():
            assert budget.ask(key, str(key[0]))  # type: ignore[index]
            order.append(key)
    return order


def test_one_namespace_with_many_evictions_does_not_starve_another_namespaces_one() -> None:
    clock = Clock()
    budget = FairBudget(TokenBucket(qps=1, burst=1, clock=clock))
    assert budget.ask(("a", 0), "a")  # the bucket's one token
    assert not any(budget.ask(("a", i), "a") for i in range(1, 300))
    assert not budget.ask(("b", 0), "b")  # after 299 of namespace a
    assert len(budget) == 300
    assert budget.next_grant_in() == pytest.approx(1.0)
    # One token a second, namespace by namespace: b's pod goes second, not 300th.
    assert _drain(budget, clock, 3) == [("a", 1), ("b", 0), ("a", 2)]


def test_tokens_go_round_robin_over_namespaces_oldest_first_within_one() -> None:
    clock = Clock()
    budget = FairBudget(TokenBucket(qps=1, burst=1, clock=clock))
    budget.ask("first", "x")
    for key, namespace in [("a1", "a"), ("a2", "a"), ("a3", "a"), ("b1", "b"), ("c1", "c"), ("c2", "c")]:
        assert not budget.ask(key, namespace)
        assert not budget.ask(key, namespace)  # asking again keeps its place, parks it once
    assert len(budget) == 6
    order = []
    for _ in range(6):
        clock.now += 1
        order += budget.grant()
    assert order == ["a1", "b1", "c1", "a2", "c2", "a3"]
    assert budget.next_grant_in() is None


def test_a_parked_eviction_asks_again_only_when_its_token_is_there_and_then_goes() -> None:
    clock = Clock()
    budget = FairBudget(TokenBucket(qps=2, burst=1, clock=clock))
    assert budget.ask("a", "n")
    assert not budget.ask("b", "n")
    assert budget.grant() == []  # no token yet
    clock.now += 0.5
    assert budget.grant() == ["b"]
    assert not budget.ask("c", "n")  # the token is b's: c waits though nobody else is parked
    assert budget.ask("b", "n")
    assert not budget.ask("b", "n")  # a second call needs a second token


def test_a_withdrawn_eviction_leaves_the_line_and_a_reserved_token_goes_back() -> None:
    clock = Clock()
    budget = FairBudget(TokenBucket(qps=1, burst=1, clock=clock))
    budget.ask("x", "n")
    for key in ("a", "b", "c"):
        budget.ask(key, "n")
    budget.withdraw("a")
    clock.now += 1
    assert budget.grant() == ["b"]
    budget.withdraw("b")  # its token goes back: c gets it at once
    assert budget.grant() == ["c"]


def test_a_token_reserved_and_never_claimed_goes_back_after_the_ttl() -> None:
    clock = Clock()
    budget = FairBudget(TokenBucket(qps=0.001, burst=1, clock=clock), grant_ttl=60)
    budget.ask("x", "n")
    budget.ask("a", "n")
    budget.ask("b", "n")
    clock.now += 1000
    assert budget.grant() == ["a"]
    clock.now += 59
    assert budget.grant() == []
    clock.now += 1
    assert budget.grant() == ["b"]  # a never came back for its token


def test_no_budget_parks_nothing() -> None:
    budget = FairBudget(TokenBucket(qps=0, burst=1, clock=Clock()))
    assert all(budget.ask(i, "n") for i in range(1000))
    assert len(budget) == 0 and budget.next_grant_in() is None
