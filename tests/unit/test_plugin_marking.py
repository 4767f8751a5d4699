"""mark --dry-run's preview and approve's patch: pure functions over a snapshot."""

from __future__ import annotations

from typing import Any

import pytest

from claimwarden.health.records import DeviceRef
from claimwarden.plugin import marking
from claimwarden.plugin.marking import MarkError, approval, preview
from claimwarden.plugin.snapshot import Snapshot

from .plugin_fixtures import cluster

REF = DeviceRef("gpu.example.com", "node-1", "gpu-0")


def _claim(name: str, pods: list[str], device: str = "gpu-0", tolerate: bool = False) -> dict[str, Any]:
    result: dict[str, Any] = {"request": "gpu", "driver": REF.driver, "pool": REF.pool, "device": device}
    if tolerate:
        result["tolerations"] = [{"key": "claimwarden.io/unhealthy", "operator": "Exists", "effect": "NoExecute"}]
    return {"metadata": {"name": name, "namespace": "ns", "uid": f"{name}-uid"},
            "status": {"allocation": {"devices": {"results": [result]}},
                       "reservedFor": [{"resource": "pods", "name": p, "uid": f"{p}-uid"} for p in pods]}}


def _pod(name: str, claim: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "ns", "uid": f"{name}-uid"},
            "spec": {"nodeName": "node-1", "resourceClaims": [{"name": "gpu", "resourceClaimName": claim}]},
            "status": {"phase": "Running"}}


def test_preview_names_the_pods_a_noexecute_mark_would_evict_and_those_that_tolerate_it() -> None:
    snapshot = Snapshot(claims=[_claim("shared", ["b", "a"]), _claim("other", ["c"], device="gpu-1"),
                                _claim("patient", ["d"], tolerate=True)],
                        pods=[_pod("a", "shared"), _pod("b", "shared"), _pod("c", "other"), _pod("d", "patient")])
    found = preview(snapshot, REF)
    assert found.evict == ("ns/a", "ns/b")
    assert found.tolerating == 1


def test_preview_counts_the_pods_of_a_podgroup_the_claim_is_reserved_for() -> None:
    claim = _claim("group-claim", [])
    claim["status"]["reservedFor"] = [{"apiGroup": "scheduling.k8s.io", "resource": "podgroups", "name": "team",
                                       "uid": "team-uid"}]
    pods = [_pod("m1", "group-claim"), _pod("m2", "group-claim"), _pod("stranger", "group-claim")]
    for pod in pods[:2]:
        pod["spec"]["schedulingGroup"] = {"podGroupName": "team"}
    found = preview(Snapshot(claims=[claim], pods=pods), REF)
    assert found.evict == ("ns/m1", "ns/m2") and found.tolerating == 0


def test_approval_carries_the_users_name_and_the_generation_read_and_refuses_an_unknown_user() -> None:
    record = {"metadata": {"name": "rec", "generation": 3}}
    assert approval(record, "alice") == {"metadata": {"annotations": {
        "claimwarden.io/approved-by": "alice", "claimwarden.io/approved-generation": "3"}}}
    with pytest.raises(MarkError):
        approval(record, "")
    with pytest.raises(MarkError, match="generation"):
        approval({"metadata": {"name": "rec"}}, "alice")


def test_mark_drain_writes_spec_drain_and_refuses_what_the_crd_would() -> None:
    snapshot = cluster(nodes=1, devices=2)
    ref = marking.resolve(snapshot, "node-0/gpu-1")
    for given, written in [("EvictAfter=90m", "EvictAfter=1h30m"), ("AllowCompletion", "AllowCompletion"),
                           ("Node", "Node"), ("Immediate", "Immediate")]:
        plan = marking.plan_mark(snapshot, ref, reason="xid 79", effect="NoExecute", expires_at=None, drain=given)
        assert plan.create is not None and plan.create["spec"]["drain"] == written, given
    unset = marking.plan_mark(snapshot, ref, reason="xid 79", effect="NoExecute", expires_at=None)
    assert unset.create is not None and "drain" not in unset.create["spec"]
    for bad in ("EvictAfter=", "EvictAfter=2d", "immediate", ""):
        with pytest.raises(marking.MarkError, match=r"--drain .*EvictAfter=<duration>"):
            marking.plan_mark(snapshot, ref, reason="x", effect="NoExecute", expires_at=None, drain=bad)
    with pytest.raises(marking.MarkError, match="--effect NoSchedule evicts nobody"):
        marking.plan_mark(snapshot, ref, reason="x", effect="NoSchedule", expires_at=None, drain="Node")
    snapshot = cluster(nodes=1, devices=2)
    snapshot.records = [unset.create]
    again = marking.plan_mark(snapshot, ref, reason="x", effect="NoExecute", expires_at=None, drain="Node")
    assert again.patch is not None and again.patch["spec"]["drain"] == "Node"
    replaced = marking.plan_mark(snapshot, ref, reason="x", effect="NoExecute", expires_at=None)
    assert replaced.patch is not None and replaced.patch["spec"]["drain"] is None  # back to the default
