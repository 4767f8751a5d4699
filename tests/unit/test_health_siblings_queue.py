"""The pools whose derived records are planned (health/sibling_records.py) are queued also when every key is
queued again without an event: a standby that starts to lead (events it saw while standing by reached no queue)
and each resync (Runtime.enqueue_all, runtime/operator.py). Before, only a slice's or a record's own event queued
its pool, so a whole device marked just before the leader changed never had its siblings marked."""

from __future__ import annotations

from claimwarden.cache import Cache
from claimwarden.health.controller import HealthController
from claimwarden.objects import trimmed
from tests.unit.test_health_quarantine_device import NS, FakeKube

from .test_health_domains import DRIVER, example_driver_pool


def test_queueing_a_slice_or_a_record_without_its_event_queues_its_pool_from_the_cache() -> None:
    slices = example_driver_pool(pool="node-a")
    for number, item in enumerate(slices):
        item["metadata"] = {"name": f"node-a-{number}"}
    record = {"apiVersion": "claimwarden.io/v1alpha1", "kind": "UnhealthyDevice",
              "metadata": {"name": "broken-gpu-0", "uid": "uid-o"},
              "spec": {"driver": DRIVER, "pool": "node-b", "device": "gpu-0", "effect": "NoExecute"}}
    empty = {name: {} for name in ("pods_by_name", "pods_by_claim", "pods_by_template", "claims_by_name",
                                   "claims_by_owner", "claims_by_device", "claims_by_record", "templates_by_name")}
    cache = Cache({**empty, "slices_by_name": {s["metadata"]["name"]: [trimmed.resource_slice(s)] for s in slices},
                   "records_by_name": {"broken-gpu-0": [trimmed.record(record)]}})
    health = HealthController(cache, FakeKube(records=[]), NS)  # type: ignore[arg-type]
    health.enqueue_slice("node-a-0")
    health.enqueue_record("broken-gpu-0")
    health.enqueue_slice("gone")  # neither in the cache: nothing to plan
    health.enqueue_record("gone")
    assert sorted(health.siblings.queue._dirty) == [(DRIVER, "node-a"), (DRIVER, "node-b")]
