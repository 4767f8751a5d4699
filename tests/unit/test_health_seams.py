"""The small parts the health controller and the eviction worker compose: each keeps its own map right
(refusals.py, holder_index.py, breaker_room.py)."""

from __future__ import annotations

from typing import Any

from claimwarden.health import breaker
from claimwarden.health.breaker_room import BreakerRoom
from claimwarden.health.holder_index import HolderIndex
from claimwarden.health.refusals import Refusals, backoff


def _key(record: str, namespace: str, pod: str) -> tuple[str, str, str, str, str]:
    return (record, namespace, pod, f"uid-{pod}", "claim")


def test_refusals_block_a_record_until_each_of_its_keys_is_done() -> None:
    refusals = Refusals()
    a, b = _key("r", "ns", "a"), _key("r", "ns", "b")
    assert (refusals.refused(a), refusals.refused(a), refusals.refused(b)) == (1, 2, 1)
    assert refusals.blocked("r") and a in refusals and refusals.takes_retry_budget(a)
    refusals.done(a)
    assert refusals.blocked("r") and a not in refusals
    refusals.done(b)
    refusals.done(b)  # twice: nothing left to undo
    assert not refusals.blocked("r") and refusals.attempts == {}


def test_refusals_promote_the_namespaces_oldest_refused_key_once() -> None:
    refusals = Refusals()
    first, second, elsewhere = _key("r", "ns", "a"), _key("s", "ns", "b"), _key("r", "other", "c")
    for key in (first, second, elsewhere):
        refusals.refused(key)
    assert refusals.promote_next("ns") == first
    assert not refusals.takes_retry_budget(first)
    assert refusals.promote_next("ns") == second
    assert refusals.promote_next("ns") is None
    refusals.refused(first)  # refused again after its promotion: back on the retry budget
    assert refusals.takes_retry_budget(first)
    assert sorted(refusals.keys_of("r")) == sorted([first, elsewhere])


def test_refusals_back_off_doubles_to_thirty_seconds() -> None:
    assert [backoff(n) for n in (1, 2, 3, 5, 6, 10)] == [1.0, 2.0, 4.0, 16.0, 30.0, 30.0]


def _record(name: str, holders: list[str] | None = None) -> dict[str, Any]:
    return {"metadata": {"name": name}, "status": {"deviceHolders": holders or []}}


def test_holder_index_wakes_the_records_a_claim_held_until_it_lets_go() -> None:
    index = HolderIndex()
    rec = _record("rec", ["ns/old"])
    before = index.seen(rec)
    assert before == {"ns/old"}  # after a restart: from the status
    index.link("rec", {"ns/a", "ns/b"}, before)
    index.remember("rec", {"ns/a", "ns/b"})
    assert index.records_of(("ns", "a")) == {"rec"} and index.records_of(("ns", "old")) == set()
    index.link("other", {"ns/a"}, set())
    index.link("rec", {"ns/b"}, index.seen(rec))
    assert index.records_of(("ns", "a")) == {"other"} and index.records_of(("ns", "b")) == {"rec"}
    index.forget("rec")
    assert index.records_of(("ns", "b")) == set() and index.seen(_record("rec")) == set()


def test_breaker_room_counts_evictions_in_flight_and_defers_without_room() -> None:
    decisions = {"full": breaker.Decision(driver="full", open=True, room=0, reason="full"),
                 "free": breaker.Decision(driver="free", room=None)}
    paused: list[str] = []
    room = BreakerRoom(settings=breaker.Settings(max_pods=3), decide=decisions.__getitem__,
                       approved=lambda record: record["metadata"].get("approver"),
                       on_paused=lambda name, decision: paused.append(name))
    record = {"metadata": {"name": "r"}}
    assert room.take(record, "free") and room.take(record, "free") and room.in_flight("free") == 2
    assert not room.take(record, "full") and paused == ["r"] and room.in_flight("full") == 0
    assert room.take({"metadata": {"name": "ok", "approver": "alice"}}, "full")  # approved: past the breaker
    room.release("free")
    room.release("free")
    room.release("free")  # never below none
    assert room.in_flight("free") == 0 and room.in_flight("full") == 1


def test_breaker_room_without_a_breaker_takes_nothing() -> None:
    room = BreakerRoom(settings=breaker.Settings(max_fraction=1.0), decide=lambda d: breaker.Decision(driver=d),
                       approved=lambda record: None, on_paused=None)
    assert room.take({"metadata": {"name": "r"}}, "gpu") and room.in_flight("gpu") == 0
