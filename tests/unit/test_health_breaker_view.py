"""The breaker's totals kept up to date (breaker_view.py) agree with the same totals gathered from scratch."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

from claimwarden.health.breaker import Recent, claim_holders, holding_pods
from claimwarden.health.breaker_view import BreakerView, Population

NOW = datetime(2026, 6, 1, 12, 0, 0, tzinfo=UTC)
WINDOW = timedelta(minutes=10)
DRIVERS = ("gpu.example.com", "nic.example.com")


def _claim(namespace: str, name: str, driver: str, devices: int, holders: list[str]) -> dict[str, object]:
    return {"metadata": {"namespace": namespace, "name": name},
            "status": {"allocation": {"devices": {"results": [
                {"driver": driver, "pool": "n", "device": f"{name}-{i}", "request": "r"} for i in range(devices)]}},
                "reservedFor": [{"resource": "pods", "name": h, "uid": h} for h in holders]}}


def test_population_follows_claim_changes_as_a_rebuild_would() -> None:
    rng = random.Random(7)
    population = Population()
    claims: dict[tuple[str, str], dict[str, object]] = {}
    for step in range(2_000):
        key = (rng.choice("ab"), f"c{rng.randrange(30)}")
        if rng.random() < 0.2:
            claims.pop(key, None)
            population.set_claim(key, {})
        else:
            claim = _claim(*key, rng.choice(DRIVERS), rng.randint(1, 3),
                           [f"p{rng.randrange(20)}" for _ in range(rng.randint(0, 5))])
            claims[key] = claim
            population.set_claim(key, claim_holders(claim, "cw"))
        if step % 100 == 0:
            expected = holding_pods(claims.values(), "cw")
            assert {d: set(population.pods(d)) for d in DRIVERS if population.pods(d)} == expected


def test_the_view_counts_pending_once_and_only_the_window_of_known_records() -> None:
    view = BreakerView()
    driver = DRIVERS[0]
    view.register("r1", driver, approved=False, recent=lambda: [Recent("a/old", NOW - timedelta(minutes=11)),
                                                                 Recent("a/x", NOW - timedelta(minutes=1))])
    view.register("r2", driver, approved=True, recent=list)
    view.register("r3", DRIVERS[1], approved=False, recent=list)
    view.set_pending("r1", driver, frozenset({"a/y", "a/z"}))
    view.set_pending("r3", DRIVERS[1], frozenset({"a/y"}))
    view.add_recent("r2", Recent("b/q", NOW))
    view.add_recent("r1", Recent("a/w", NOW))
    view.add_recent("unknown", Recent("c/c", NOW))  # not registered: brings its evictions when it is
    seen = view.driver_view(driver, now=NOW, window=WINDOW, in_flight=2)
    assert set(seen.pending) == {"a/y", "a/z"} and seen.in_flight == 2
    assert sorted(r.pod for r in seen.recent) == ["a/w", "a/x"]
    assert [r.pod for r in seen.approved_recent] == ["b/q"]
    assert sorted(seen.departed or ()) == ["a/x", "b/q"]  # one per record
    view.register("r2", driver, approved=False, recent=list)  # the approval was removed
    assert sorted(r.pod for r in view.driver_view(driver, now=NOW, window=WINDOW, in_flight=0).recent) == \
        ["a/w", "a/x", "b/q"]
    view.forget("r1")
    after = view.driver_view(driver, now=NOW, window=WINDOW, in_flight=0)
    assert not after.pending and [r.pod for r in after.recent] == ["b/q"]
    assert view.records_of(driver) == ["r2"]
    view.set_pending("r3", None, frozenset())
    assert not view.driver_view(DRIVERS[1], now=NOW, window=WINDOW, in_flight=0).pending


def test_a_record_registered_again_under_the_same_name_does_not_inherit_forgotten_evictions() -> None:
    view = BreakerView()
    view.register("r", DRIVERS[0], approved=False, recent=list)
    view.add_recent("r", Recent("a/x", NOW))
    view.forget("r")
    view.register("r", DRIVERS[0], approved=False, recent=list)
    assert view.driver_view(DRIVERS[0], now=NOW, window=WINDOW, in_flight=0).recent == ()
