"""Bookkeeping waits for a wave of evictions, each key at most HOLD_MAX seconds (health/wave.py)."""

from __future__ import annotations

from claimwarden.health.wave import Wave

from .test_health_budget import Clock


def test_bookkeeping_waits_while_evictions_run_and_goes_once_they_stop() -> None:
    busy = [True]
    clock = Clock()
    wave = Wave(lambda: busy[0], hold_max=30.0, clock=clock)
    assert wave.holds(("status", "r"))
    clock.now += 10
    assert wave.holds(("status", "r"))
    busy[0] = False
    assert not wave.holds(("status", "r"))


def test_a_wave_that_never_ends_holds_each_key_at_most_hold_max() -> None:
    clock = Clock()
    wave = Wave(lambda: True, hold_max=30.0, clock=clock)
    assert wave.holds("a")
    clock.now += 20
    assert wave.holds("b"), "each key has its own bound"
    clock.now += 10
    assert not wave.holds("a"), "30 s after it first waited, it goes"
    assert wave.holds("b")
    clock.now += 20
    assert not wave.holds("b")
