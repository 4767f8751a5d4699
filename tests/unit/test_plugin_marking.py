"""mark --dry-run's preview and approve's patch: pure functions over a snapshot."""

from __future__ import annotations

from typing import Any

import pytest

from claimwarden.health.records import DeviceRef
from claimwarden.plugin.marking import MarkError, approval, preview
from claimwarden.plugin.snapshot import Snapshot

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
