"""The blast-radius breaker, decided on plain data."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from claimwarden.health.breaker import (
    DriverView,
    Recent,
    Settings,
    claim_holders,
    decide,
    format_recent,
    holding_pods,
    parse_recent,
)

NOW = datetime(2026, 6, 1, 12, 0, 0, tzinfo=UTC)
DRIVER = "gpu.example.com"


def pods(count: int, prefix: str = "p") -> frozenset[str]:
    return frozenset(f"ns/{prefix}{i}" for i in range(count))


def test_forty_percent_marked_trips_at_thirty_percent_and_lets_exactly_the_budget_through() -> None:
    decision = decide(DRIVER, DriverView(holding=pods(40), pending=pods(16)), Settings(), NOW)
    assert decision.open and decision.limit == 12 and decision.room == 12
    assert "16 pod(s) would be or were evicted" in decision.reason and "limit of 12" in decision.reason


def test_evictions_in_the_window_use_up_the_room_and_keep_the_limit() -> None:
    evicted = [Recent(f"ns/p{i}", NOW - timedelta(seconds=30)) for i in range(12)]
    # The evicted pods no longer hold devices: they still count in the population.
    view = DriverView(holding=pods(40) - pods(12), pending=pods(16) - pods(12), recent=tuple(evicted))
    decision = decide(DRIVER, view, Settings(), NOW)
    assert decision.open and decision.limit == 12 and decision.room == 0 and decision.population == 40
    assert decision.frees_at == NOW - timedelta(seconds=30) + timedelta(minutes=10)


def test_a_pod_being_evicted_is_not_counted_twice() -> None:
    view = DriverView(holding=pods(40), pending=pods(12), recent=(Recent("ns/p0", NOW),))
    decision = decide(DRIVER, view, Settings(), NOW)
    assert not decision.open and decision.population == 40 and decision.counted == 12


def test_approved_evictions_are_not_counted_but_their_pods_stay_in_the_population() -> None:
    evicted = tuple(Recent(f"ns/p{i}", NOW) for i in range(12))
    approved = tuple(Recent(f"ns/p{i}", NOW) for i in range(12, 14))
    view = DriverView(holding=pods(40) - pods(14), recent=evicted, approved_recent=approved)
    decision = decide(DRIVER, view, Settings(), NOW)
    assert decision.population == 40 and decision.limit == 12 and not decision.open


def test_in_flight_evictions_take_room() -> None:
    decision = decide(DRIVER, DriverView(holding=pods(40), pending=pods(16), in_flight=11), Settings(), NOW)
    assert decision.room == 1


def test_clearing_marks_closes_it_and_old_evictions_leave_the_window() -> None:
    recent = tuple(Recent(f"ns/p{i}", NOW - timedelta(minutes=2)) for i in range(12))
    assert not decide(DRIVER, DriverView(holding=pods(40), recent=recent), Settings(), NOW).open
    old = tuple(Recent(f"ns/p{i}", NOW - timedelta(minutes=11)) for i in range(12))
    decision = decide(DRIVER, DriverView(holding=pods(40), pending=pods(16, "q"), recent=old), Settings(), NOW)
    assert decision.recent == 0 and decision.population == 40


def test_one_broken_node_in_a_small_cluster_is_emptied_at_once() -> None:
    decision = decide(DRIVER, DriverView(holding=pods(10), pending=pods(8)), Settings(), NOW)
    assert not decision.open and decision.limit == 8


def test_max_pods_is_a_hard_limit_and_fraction_one_turns_it_off() -> None:
    decision = decide(DRIVER, DriverView(holding=pods(100), pending=pods(8)), Settings(max_pods=5), NOW)
    assert decision.open and decision.limit == 5 and decision.room == 5
    off = decide(DRIVER, DriverView(holding=pods(10), pending=pods(10)), Settings(max_fraction=1), NOW)
    assert not off.open and off.room is None and off.allows()
    both = Settings(max_fraction=0.5, max_pods=30)
    assert both.limit(100) == 30 and both.limit(20) == 10


def test_holding_pods_counts_each_pod_once_per_driver_and_skips_quarantine_claims() -> None:
    def claim(namespace: str, name: str, driver: str, *holders: str) -> dict[str, object]:
        return {"metadata": {"namespace": namespace, "name": name},
                "status": {"allocation": {"devices": {"results": [
                    {"driver": driver, "pool": "n", "device": name, "request": "r"}]}},
                    "reservedFor": [{"resource": "pods", "name": h, "uid": h} for h in holders]}}

    claims = [claim("a", "c1", DRIVER, "y"), claim("a", "c2", DRIVER, "x"), claim("a", "c5", DRIVER, "x"),
              claim("b", "c3", "nic.example.com", "z"), claim("cw", "q", DRIVER), claim("a", "c4", DRIVER)]
    assert holding_pods(claims, "cw") == {DRIVER: {"a/x", "a/y"}, "nic.example.com": {"b/z"}}


def test_holding_pods_leaves_out_pods_holding_a_device_only_through_admin_access() -> None:
    """Admin-access pods are never evicted, so they neither raise the limit nor count against it."""
    def claim(name: str, *results: dict[str, object]) -> dict[str, object]:
        return {"metadata": {"namespace": "a", "name": name},
                "status": {"allocation": {"devices": {"results": list(results)}},
                           "reservedFor": [{"resource": "pods", "name": name, "uid": name}]}}

    plain = {"driver": DRIVER, "pool": "n", "device": "g0", "request": "r"}
    admin = {**plain, "adminAccess": True}
    nic_admin = {**admin, "driver": "nic.example.com"}
    claims = [claim("diag", admin), claim("worker", plain), claim("both", plain, nic_admin)]
    assert holding_pods(claims, "cw") == {DRIVER: {"a/worker", "a/both"}}


def test_recent_evictions_round_trip_through_the_status_and_are_trimmed() -> None:
    recent = [Recent("ns/a", NOW - timedelta(minutes=11)), Recent("ns/b", NOW - timedelta(minutes=1))]
    stored = format_recent(recent, NOW, timedelta(minutes=10))
    assert stored == [{"pod": "ns/b", "at": "2026-06-01T11:59:00Z"}]
    assert parse_recent({"recentEvictions": [*stored, {"pod": "x"}, "junk"]}) == [recent[1]]


def _shared_claim(name: str, devices: int, holders: int) -> dict[str, object]:
    return {"metadata": {"namespace": "t", "name": name},
            "status": {"allocation": {"devices": {"results": [
                {"driver": DRIVER, "pool": "n", "device": f"{name}-{i}", "request": "r"} for i in range(devices)]}},
                "reservedFor": [{"resource": "pods", "name": f"{name}-p{i:03}", "uid": f"u{i}"}
                                for i in range(holders)]}}


def test_a_claim_counts_at_most_one_pod_per_device_the_first_by_name() -> None:
    assert claim_holders(_shared_claim("one", 1, 256), "cw") == {DRIVER: frozenset({"t/one-p000"})}
    assert claim_holders(_shared_claim("two", 2, 3), "cw") == {DRIVER: frozenset({"t/two-p000", "t/two-p001"})}
    assert claim_holders(_shared_claim("big", 8, 1), "cw") == {DRIVER: frozenset({"t/big-p000"})}  # 1 pod, 8 GPUs


def test_pods_sharing_claims_do_not_raise_the_limit() -> None:
    """Finding 8: 4 claims x 256 pods used to add 1,024 pods to the population (and ~300 to the limit)."""
    claims = [_shared_claim(f"c{i}", 1, 256) for i in range(4)]
    tenant = holding_pods(claims, "cw")[DRIVER]
    assert len(tenant) == 4  # one pod per device
    holding = pods(40) | tenant
    decision = decide(DRIVER, DriverView(holding=holding, pending=pods(16)), Settings(), NOW)
    assert decision.population == 44 and decision.limit == 13 and decision.open
    every_pod = pods(40) | {f"t/{e['name']}" for c in claims for e in c["status"]["reservedFor"]}  # type: ignore[index]
    assert decide(DRIVER, DriverView(holding=every_pod, pending=pods(16)), Settings(), NOW).limit == 319


def test_a_records_evicted_pods_count_as_one_in_the_population() -> None:
    """256 pods evicted from one shared device do not raise the limit either (each device weighs one pod)."""
    evicted = tuple(Recent(f"t/p{i}", NOW) for i in range(256))
    view = DriverView(holding=pods(40), recent=evicted, departed=("t/p0",))
    decision = decide(DRIVER, view, Settings(), NOW)
    assert decision.population == 41 and decision.limit == 12 and decision.open and decision.room == 0
