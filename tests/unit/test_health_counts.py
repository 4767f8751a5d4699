"""When a record's eviction counts are written: at most once per interval, and nothing is lost."""

from __future__ import annotations

import pytest

from claimwarden.health.counts import COUNT_INTERVAL, CountWrites


def test_the_first_change_of_a_record_is_written_at_once() -> None:
    counts = CountWrites()
    assert counts.changed("a", 100.0) == 0.0
    assert counts.unsaved() == ["a"]


def test_a_burst_after_a_write_waits_for_the_interval_and_is_written_once() -> None:
    counts = CountWrites(interval=0.3)
    counts.changed("a", 100.0)
    counts.written("a", 100.0, counts.version("a"))
    delays = [counts.changed("a", 100.0 + step / 100) for step in range(1, 11)]  # ten pods in 0.1 s
    assert delays == pytest.approx([0.3 - step / 100 for step in range(1, 11)])
    # Every delay ends at the same moment: the caller's queue coalesces them into one reconcile.
    assert {round(100.0 + step / 100 + delay, 9) for step, delay in zip(range(1, 11), delays, strict=True)} == {100.3}
    assert counts.unsaved() == ["a"]
    counts.written("a", 100.3, counts.version("a"))
    assert counts.unsaved() == []
    assert counts.changed("a", 100.3 + COUNT_INTERVAL) == 0.0, "a quiet spell: written at once again"


def test_records_are_paced_apart() -> None:
    counts = CountWrites(interval=0.3)
    counts.changed("a", 10.0)
    counts.written("a", 10.0, counts.version("a"))
    assert counts.changed("b", 10.1) == 0.0
    assert counts.changed("a", 10.1) == pytest.approx(0.2)
    assert counts.unsaved() == ["a", "b"]


def test_a_count_changed_while_its_write_was_in_flight_stays_unsaved() -> None:
    """The write carried the count as it was when the status was built; a later change needs its own."""
    counts = CountWrites(interval=0.3)
    counts.changed("a", 1.0)
    built = counts.version("a")
    assert counts.changed("a", 1.01) == 0.0  # a second pod, while the first write is on its way
    counts.written("a", 1.02, built)
    assert counts.is_unsaved("a")
    assert counts.changed("a", 1.03) == pytest.approx(0.29), "paced from the write that went out"
    counts.written("a", 1.4, counts.version("a"))
    assert not counts.is_unsaved("a")


def test_forgetting_a_record_drops_its_unsaved_counts_and_pacing() -> None:
    counts = CountWrites()
    counts.changed("a", 1.0)
    counts.written("a", 1.0, counts.version("a"))
    counts.changed("a", 1.1)
    counts.forget("a")
    assert counts.unsaved() == []
    assert counts.changed("a", 1.2) == 0.0


def test_any_status_write_paces_the_next_one() -> None:
    counts = CountWrites(interval=0.3)
    assert counts.wait("a", 5.0) == 0.0
    counts.written("a", 5.0, counts.version("a"))  # a write of other fields (podsPending, conditions)
    assert counts.wait("a", 5.1) == pytest.approx(0.2)
    assert counts.wait("a", 5.3) == 0.0
    assert counts.unsaved() == []


def test_a_settling_first_write_waits_from_when_it_was_first_asked_for() -> None:
    writes = CountWrites()
    assert writes.wait("r", 10.0, settle=1.0) == pytest.approx(1.0)
    # Asked again meanwhile (a reconcile per eviction): the wait runs from the first ask, not from each.
    assert writes.wait("r", 10.6, settle=1.0) == pytest.approx(0.4)
    assert writes.wait("r", 11.2, settle=1.0) == 0.0
    writes.written("r", 11.2, writes.version("r"))
    assert writes.wait("r", 11.3, settle=1.0) == pytest.approx(COUNT_INTERVAL - 0.1)
