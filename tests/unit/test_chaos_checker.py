"""The chaos checker's invariants over the audit log: each fires on a planted violation, and not without one."""

from __future__ import annotations

from typing import Any

from claimwarden import __version__
from claimwarden_lab.audit_policy import CLAIMWARDEN_USER
from tests.chaos.checker import (
    OWN_NAMESPACE,
    Breaker,
    Cluster,
    breaker_room_exceeded,
    check,
    quarantine_released_under_a_record,
    writes_after_a_successor,
)

Event = dict[str, Any]


def _at(second: float) -> str:
    return f"2026-12-02T12:00:{second:09.6f}Z"


def _write(who: str, received: float, completed: float | None = None, *, verb: str = "patch",
           resource: str = "resourceclaims", name: str = "c", namespace: str = "ns", subresource: str | None = None,
           body: Any = None, code: int = 200) -> Event:
    ref = {"resource": resource, "namespace": namespace, "name": name}
    if subresource:
        ref["subresource"] = subresource
    event: Event = {"stage": "ResponseComplete", "verb": verb, "user": {"username": CLAIMWARDEN_USER},
                    "userAgent": f"claimwarden/{__version__} ({who})", "objectRef": ref,
                    "responseStatus": {"code": code},
                    "requestReceivedTimestamp": _at(received), "stageTimestamp": _at(
                        received if completed is None else completed)}
    if body is not None:
        event["requestObject"] = body
    return event


def _lease(who: str, holder: str, second: float) -> Event:
    return _write(who, second, verb="update", resource="leases", name="claimwarden",
                  body={"spec": {"holderIdentity": holder}})


def test_a_write_of_the_old_leader_landing_after_the_new_leaders_first_write_is_a_violation() -> None:
    events = [_lease("a", "a", 0), _write("a", 1), _lease("b", "b", 20),
              _write("b", 21, name="by-b"),
              _write("a", 9, 21.5, name="late")]  # sent in a's term, held on the wire, completed after b's first
    found = writes_after_a_successor(events)
    assert len(found) == 1 and "late" in found[0] and "a:" in found[0]


def test_writes_in_order_across_terms_and_a_leader_coming_back_are_not() -> None:
    events = [_lease("a", "a", 0), _write("a", 1), _write("a", 9, 20.5),  # completed before b's first write
              _lease("b", "b", 20), _write("b", 21), _lease("a", "a", 40), _write("a", 41), _write("b", 30)]
    assert writes_after_a_successor(events) == []


def test_failed_writes_and_lease_renewals_of_the_old_leader_do_not_count() -> None:
    events = [_lease("a", "a", 0), _lease("b", "b", 20), _write("b", 21),
              _write("a", 22, code=409), _write("a", 23, verb="update", resource="leases", code=409,
                                                  body={"spec": {"holderIdentity": "a"}})]
    assert writes_after_a_successor(events) == []


def _eviction(pod: str, second: float, code: int = 201) -> Event:
    return _write("a", second, verb="create", resource="pods", name=pod, subresource="eviction", code=code)


def test_more_evictions_than_the_breaker_allows_within_its_window_are_a_violation() -> None:
    events = [_eviction("p1", 1), _eviction("p2", 2), _eviction("p3", 25), _eviction("p4", 26, code=429)]
    breaker = Breaker(limit=2, window=600, drivers={("ns", p): "gpu.example.com" for p in ("p1", "p2", "p3")})
    found = breaker_room_exceeded(events, breaker)
    assert len(found) == 1 and "3 evictions" in found[0] and "gpu.example.com" in found[0]
    assert breaker_room_exceeded(events[:2] + events[3:], breaker) == []
    # Evictions further apart than the window do not add up; without a breaker nothing is checked.
    assert breaker_room_exceeded(events, Breaker(limit=2, window=10)) == []
    assert breaker_room_exceeded(events, None) == []


def test_evictions_of_two_drivers_are_counted_apart() -> None:
    events = [_eviction("p1", 1), _eviction("p2", 2), _eviction("p3", 3)]
    breaker = Breaker(limit=2, window=600, drivers={("ns", "p1"): "x", ("ns", "p2"): "y", ("ns", "p3"): "y"})
    assert breaker_room_exceeded(events, breaker) == []


DEVICE = {"driver": "gpu.example.com", "pool": "kwok-node-0", "device": "gpu-1"}


def _allocate(claim: str, second: float) -> Event:
    return _write("a", second, name=claim, namespace=OWN_NAMESPACE, subresource="status", body=[
        {"op": "test", "path": "/metadata/resourceVersion", "value": "1"},
        {"op": "add", "path": "/status", "value": {"allocation": {"devices": {"results": [
            {"request": "quarantine", **DEVICE}]}}}}])


def _deallocate(claim: str, second: float) -> Event:
    return _write("a", second, name=claim, namespace=OWN_NAMESPACE, subresource="status",
                  body=[{"op": "remove", "path": "/status/allocation"}])


def _delete(claim: str, second: float) -> Event:
    return _write("a", second, verb="delete", name=claim, namespace=OWN_NAMESPACE, body={"kind": "DeleteOptions"})


def _record(name: str, effect: str = "NoExecute", created: float = 0) -> dict[str, Any]:
    return {"metadata": {"name": name, "creationTimestamp": _at(created).replace(".000000", "")},
            "spec": {**DEVICE, "effect": effect}}


def test_a_quarantine_claim_released_while_another_record_of_the_device_remains_is_a_violation() -> None:
    # Two records of one device, each with its claim; clearing one releases its claim and the other record's
    # quarantine is never asserted again: the scheduler has forgotten the device (issue 20, finding 4).
    events = [_allocate("q-annotation", 1), _allocate("q-manual", 2), _deallocate("q-annotation", 10),
              _delete("q-annotation", 10.1)]
    found = quarantine_released_under_a_record(events, [_record("manual")])
    assert found and "q-annotation" in found[0] and "manual" in found[0]


def test_a_release_followed_by_a_new_quarantine_claim_is_not() -> None:
    events = [_allocate("q-annotation", 1), _allocate("q-manual", 2), _deallocate("q-annotation", 10),
              _delete("q-annotation", 10.1), _delete("q-manual", 10.5), _allocate("q-manual-2", 11)]
    assert quarantine_released_under_a_record(events, [_record("manual")]) == []


def test_releases_without_a_remaining_record_or_of_a_dry_run_record_are_not() -> None:
    events = [_allocate("q", 1), _deallocate("q", 10), _delete("q", 10.1)]
    assert quarantine_released_under_a_record(events, []) == []
    assert quarantine_released_under_a_record(events, [_record("dry", effect="None")]) == []
    # A record made after the release was quarantined anew or is a later story: not this release's.
    assert quarantine_released_under_a_record(events, [_record("later", created=30)]) == []


def test_check_reports_every_invariant_and_the_new_ones_by_name() -> None:
    events = [_lease("a", "a", 0), _lease("b", "b", 20), _write("b", 21), _write("a", 9, 22)]
    result = check(Cluster(pods=[], claims=[], records=[], events=events))
    assert len(result) == 12
    assert result["writes by a replica after another replica's first write as leader"]
    assert not result["evictions beyond the breaker's room within its window"]
