"""The health controller's breaker decisions follow claim and record events without walking the cache
(breaker_view.py): claims shared by many pods weigh one pod per device, a deleted claim leaves the
population, a record's evictions in the window count from the event that brings it."""

from __future__ import annotations

from typing import Any

from claimwarden.cache import Cache
from claimwarden.health.controller import HealthController
from claimwarden.timestamps import format_rfc3339, now

DRIVER = "gpu.example.com"


def _claim(name: str, device: str, pods: list[str]) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "ns", "uid": name},
            "status": {"allocation": {"devices": {"results": [
                {"request": "gpu", "driver": DRIVER, "pool": "node-0", "device": device}]}},
                "reservedFor": [{"resource": "pods", "name": p, "uid": p} for p in pods]}}


def _record(name: str, device: str, evicted: list[str]) -> dict[str, Any]:
    at = format_rfc3339(now())
    return {"metadata": {"name": name, "resourceVersion": "1"},
            "spec": {"driver": DRIVER, "pool": "node-0", "device": device, "effect": "NoExecute"},
            "status": {"recentEvictions": [{"pod": p, "at": at} for p in evicted]}}


def test_decisions_follow_claim_and_record_events() -> None:
    claims: dict[Any, list[Any]] = {("ns", f"c{i}"): [_claim(f"c{i}", f"gpu-{i}", [f"p{i}"])] for i in range(40)}
    records: dict[Any, list[Any]] = {}
    cache = Cache({"pods_by_name": {}, "pods_by_claim": {}, "pods_by_template": {}, "claims_by_name": claims,
                   "claims_by_owner": {}, "claims_by_device": {}, "claims_by_record": {}, "templates_by_name": {},
                   "records_by_name": records, "records_by_device": {}})
    health = HealthController(cache, kube=None, namespace="claimwarden-system")  # type: ignore[arg-type]
    first = health.breakers.decision(DRIVER)
    assert (first.population, first.limit, first.recent) == (40, 12, 0)

    shared = _claim("shared", "gpu-40", [f"tiny-{i:03}" for i in range(256)])
    claims[("ns", "shared")] = [shared]
    health.enqueue_for_claim("ns", "shared", shared)
    assert health.breakers.decision(DRIVER).population == 41  # 256 pods on one device weigh one

    del claims[("ns", "c0")]
    health.enqueue_for_claim("ns", "c0", _claim("c0", "gpu-0", ["p0"]), deleted=True)
    assert health.breakers.decision(DRIVER).population == 40

    records["r"] = [_record("r", "gpu-0", ["ns/p0", "ns/gone"])]
    health.enqueue_record("r")
    after = health.breakers.decision(DRIVER)
    assert (after.recent, after.population) == (2, 41)  # the record's evicted pods weigh one pod

    del records["r"]
    health.breakers.view.forget("r")  # what reconcile_record does for a record gone
    assert health.breakers.decision(DRIVER).recent == 0
