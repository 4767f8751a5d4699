"""Each rule of the integration auditor fires on a planted violation and stays quiet without one."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from claimwarden.health.plan import device_label
from claimwarden.health.records import DeviceRef, label_value
from claimwarden_lab.audit_policy import CLAIMWARDEN_USER
from tests.integration.auditor import (
    Objects,
    Rules,
    hot_objects,
    leftovers,
    log_problems,
    read_from,
    repeated_evictions,
    rules_from,
    shared_devices,
    stale_reservations,
)


def _event(verb: str, resource: str, name: str, namespace: str = "ns", *, user: str = CLAIMWARDEN_USER,
           subresource: str | None = None, code: int = 200, group: str = "resource.k8s.io",
           stage: str = "ResponseComplete") -> dict[str, Any]:
    ref = {"resource": resource, "namespace": namespace, "name": name, "apiGroup": group}
    if subresource:
        ref["subresource"] = subresource
    return {"verb": verb, "stage": stage, "user": {"username": user}, "objectRef": ref,
            "responseStatus": {"code": code}}


def _eviction(name: str, code: int = 201, user: str = CLAIMWARDEN_USER) -> dict[str, Any]:
    return _event("create", "pods", name, subresource="eviction", code=code, group="", user=user)


def test_an_object_written_more_than_the_bound_is_hot() -> None:
    events = [_event("patch", "resourceclaims", "c", subresource="status") for _ in range(15)]
    events += [_event("update", "resourceclaims", "c") for _ in range(6)]
    [problem] = hot_objects(events)
    assert "resourceclaims.resource.k8s.io ns/c 21 times (bound 20)" in problem
    assert "15 patch status" in problem and "6 update" in problem
    assert hot_objects(events[:20]) == []
    assert hot_objects(events, bound=21) == []


def test_only_claimwarden_writes_count_and_evictions_and_unnamed_creates_do_not() -> None:
    others = [_event("patch", "resourceclaims", "c", user="admin") for _ in range(30)]
    unnamed = [_event("create", "resourceclaims", "") for _ in range(30)]
    evictions = [_eviction("p", code=429) for _ in range(30)]
    reads = [_event("get", "resourceclaims", "c") for _ in range(30)]
    started = [_event("patch", "resourceclaims", "c", stage="ResponseStarted") for _ in range(30)]
    assert hot_objects(others + unnamed + evictions + reads + started) == []


def test_the_leader_lease_renewed_every_few_seconds_is_not_a_hot_object() -> None:
    renewals = [_event("update", "leases", "claimwarden", "claimwarden-system", group="coordination.k8s.io")
                for _ in range(100)]
    assert hot_objects(renewals) == []


def test_a_pod_evicted_twice_is_reported_and_blocked_evictions_do_not_count() -> None:
    assert repeated_evictions([_eviction("p"), _eviction("p", code=429), _eviction("q")]) == []
    [problem] = repeated_evictions([_eviction("p"), _eviction("p", user="admin")])
    assert "pod ns/p was evicted 2 times" in problem and "admin" in problem


def test_tracebacks_and_errors_in_the_log_are_reported_unless_expected() -> None:
    lines = ["[2026-12-01 12:00:00,000] kopf.objects         [INFO    ] fine",
             "[2026-12-01 12:00:01,000] kopf.objects         [ERROR   ] Handler 'x' failed: boom",
             "Traceback (most recent call last):",
             '  File "x.py", line 1, in <module>',
             "RuntimeError: boom",
             "[2026-12-01 12:00:02,000] claimwarden          [CRITICAL] gone"]
    problems = log_problems(lines)
    assert len(problems) == 3
    assert "Handler 'x' failed" in problems[0] and "gone" in problems[2]
    assert "traceback" in problems[1] and "RuntimeError: boom" in problems[1] and "gone" not in problems[1]
    assert log_problems(lines, expected=[r"Handler 'x' failed", "gone"]) == []
    assert log_problems([*lines[:1], '{"message": "x", "levelname": "ERROR"}']) != []


def test_a_chained_traceback_printed_without_a_log_record_is_one_problem() -> None:
    lines = ["Traceback (most recent call last):", "  x", "KeyError: 'a'", "",
             "During handling of the above exception, another exception occurred:", "",
             "Traceback (most recent call last):", "  y", "ValueError: b"]
    [problem] = log_problems(lines)
    assert "KeyError: 'a'" in problem and "ValueError: b" in problem


def test_the_marker_needs_a_reason_to_change_anything() -> None:
    assert rules_from({}) == Rules()
    assert rules_from({"max_writes": 50, "reason": "100 pods share one claim"}).max_writes == 50
    with pytest.raises(ValueError, match="reason"):
        rules_from({"max_writes": 50})
    with pytest.raises(ValueError, match="reason"):
        rules_from({"expect_log": ["x"]})
    with pytest.raises(ValueError, match="unknown"):
        rules_from({"max_write": 50, "reason": "typo"})


def _claim(name: str, namespace: str = "ns", *devices: str, labels: dict[str, str] | None = None,
           admin: bool = False, reserved: tuple[tuple[str, str], ...] = ()) -> dict[str, Any]:
    results = [{"driver": "gpu.example.com", "pool": "node-0", "device": d, "request": "gpu",
                **({"adminAccess": True} if admin else {})} for d in devices]
    status: dict[str, Any] = {"allocation": {"devices": {"results": results}}} if devices else {}
    if reserved:
        status["reservedFor"] = [{"resource": "pods", "name": n, "uid": u} for n, u in reserved]
    return {"kind": "ResourceClaim", "metadata": {"name": name, "namespace": namespace, "uid": f"uid-{name}",
                                                  "labels": labels or {}}, "status": status}


def _quarantine(name: str, record: str, *devices: str) -> dict[str, Any]:
    return _claim(name, "claimwarden-system", *devices, labels={"claimwarden.io/record": label_value(record)})


def test_two_claims_on_one_device_are_reported_but_quarantine_and_admin_claims_may_share() -> None:
    [problem] = shared_devices([_claim("a", "ns", "gpu-0"), _claim("b", "other", "gpu-0"), _claim("c", "ns", "gpu-1")])
    assert "gpu.example.com/node-0/gpu-0 is allocated to 2 claims: ns/a, other/b" in problem
    assert shared_devices([_claim("a", "ns", "gpu-0"), _quarantine("q1", "r", "gpu-0"),
                           _claim("m", "ns", "gpu-0", admin=True)]) == []


def test_two_quarantine_claims_on_one_device_are_reported() -> None:
    """One quarantine claim per device, whichever records mark it (health/__init__.py)."""
    [problem] = shared_devices([_quarantine("q1", "r", "gpu-0"), _quarantine("q2", "manual", "gpu-0"),
                                _quarantine("q3", "r3", "gpu-1")])
    assert "gpu.example.com/node-0/gpu-0 is held by 2 quarantine claims" in problem


def _pod(name: str, uid: str, namespace: str = "ns") -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": namespace, "uid": uid}}


def test_a_reservation_for_a_missing_or_replaced_pod_is_stale() -> None:
    claims = [_claim("a", "ns", "gpu-0", reserved=(("gone", "u1"), ("replaced", "u2"), ("here", "u3")))]
    stale = stale_reservations(claims, [_pod("replaced", "u9"), _pod("here", "u3"), _pod("gone", "u1", "elsewhere")])
    assert sorted(k[1] for k in stale) == ["gone", "replaced"]
    assert "does not exist" in stale[("uid-a", "gone", "u1")]
    assert "another pod (uid u9)" in stale[("uid-a", "replaced", "u2")]


def _record(name: str, device: str, source: str = "annotation", uid: str = "") -> dict[str, Any]:
    return {"kind": "UnhealthyDevice", "metadata": {"name": name, "uid": uid or f"uid-{name}"},
            "spec": {"driver": "gpu.example.com", "pool": "node-0", "device": device, "source": source}}


def _slice(*marked: str) -> dict[str, Any]:
    return {"kind": "ResourceSlice", "metadata": {"name": "node-0-gpu", "annotations": {
        f"unhealthy.claimwarden.io/{d}": "broken" for d in marked}},
        "spec": {"driver": "gpu.example.com", "pool": {"name": "node-0"}}}


def test_leftovers_without_their_reason_are_reported() -> None:
    objects = Objects(
        claims=[_quarantine("q-orphan", "gone-record", "gpu-0"), _quarantine("q-ok", "rec-1", "gpu-1")],
        records=[_record("rec-1", "gpu-1"), _record("rec-2", "gpu-2"), _record("manual", "gpu-3", "manual")],
        slices=[_slice("gpu-1")],
        taint_rules=[{"kind": "DeviceTaintRule", "metadata": {"name": "claimwarden-rec-1", "uid": "t1"}},
                     {"kind": "DeviceTaintRule", "metadata": {"name": "claimwarden-gone", "uid": "t2"}},
                     {"kind": "DeviceTaintRule", "metadata": {"name": "someone-elses", "uid": "t3"}}])
    problems = leftovers(objects)
    assert len(problems) == 3, problems
    assert "q-orphan" in problems[0] and "gone-record" in problems[0]
    assert "record rec-2" in problems[1] and "gpu-2" in problems[1]
    assert "claimwarden-gone" in problems[2]


def test_a_quarantine_claim_with_the_label_of_a_marked_device_is_no_leftover() -> None:
    """The device's quarantine claim stays while a manual record (any name) marks the device."""
    device_claim = _claim("q", "claimwarden-system", "gpu-0", labels={
        "claimwarden.io/record": device_label(DeviceRef("gpu.example.com", "node-0", "gpu-0"))})
    assert leftovers(Objects(claims=[device_claim], records=[_record("my-own-name", "gpu-0", "manual")])) == []
    assert "which is gone" in leftovers(Objects(claims=[device_claim], records=[]))[0]


def test_a_record_whose_pool_has_no_slice_now_is_kept() -> None:
    assert leftovers(Objects(records=[_record("rec", "gpu-0")], slices=[])) == []


def test_what_appeared_during_the_test_and_stayed_is_a_leftover() -> None:
    objects = Objects(claims=[_quarantine("q", "rec", "gpu-0")], records=[_record("rec", "gpu-0")],
                      slices=[_slice("gpu-0")])
    problems = leftovers(objects, existed_before={"uid-q"})
    assert len(problems) == 1 and "UnhealthyDevice rec appeared during the test" in problems[0]
    assert "left its mark" in problems[0]
    assert leftovers(objects, existed_before={"uid-q", "uid-rec"}) == []


def test_read_from_returns_only_complete_new_lines(tmp_path: Path) -> None:
    path = tmp_path / "log"
    path.write_text("old\n")
    lines, offset = read_from(path, 0)
    assert lines == ["old"] and offset == 4
    with path.open("a") as f:
        f.write("new\npartial")
    lines, offset = read_from(path, offset)
    assert lines == ["new"] and offset == 8
    path.write_text("new\n")  # shorter than the offset, as after a rotation: read from the start
    assert read_from(path, offset)[0] == ["new"]


def test_a_record_derived_for_a_sibling_without_its_origin_is_a_leftover() -> None:
    origin = _record("origin", "gpu-0", "manual")
    origin["metadata"]["uid"] = "origin-uid"
    derived = _record("derived", "gpu-0-partition-0", "sibling")
    derived["metadata"]["ownerReferences"] = [{"kind": "UnhealthyDevice", "name": "origin", "uid": "origin-uid"}]
    assert leftovers(Objects(records=[origin, derived])) == []
    assert leftovers(Objects(records=[derived])) == [
        "leftover: record derived (derived for a sibling) outlived the record it was derived from"]
