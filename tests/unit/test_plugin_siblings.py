"""The plugin and fault domains: `devices -o wide` shows siblings, explain shows an allocated device's siblings
and reads counter sets from every slice of the pool (1.35+), `clear` of a sibling's derived mark says what to
clear instead."""

from __future__ import annotations

from typing import Any

import pytest

from claimwarden.health import siblings
from claimwarden.health.records import DeviceRef
from claimwarden.plugin import devices, marking
from claimwarden.plugin.constraints import counters_fit
from claimwarden.plugin.explain import explain_claim
from claimwarden.plugin.snapshot import Snapshot

from .plugin_fixtures import claim, device_class, node, request
from .test_health_domains import DRIVER, example_driver_pool

POOL = "node-a"


def partitionable(*allocated: str) -> Snapshot:
    slices = example_driver_pool(pool=POOL)
    for number, item in enumerate(slices):
        item["metadata"] = {"name": f"{POOL}-slice-{number}"}
        item["spec"]["nodeName"] = POOL
    claims = [claim(f"holds-{d}", [request()], allocated=[(POOL, d)], reserved=[f"pod-{d}"]) for d in allocated]
    return Snapshot(nodes=[node(POOL)], slices=slices, classes=[device_class()], claims=claims)


def test_counters_come_from_the_counter_slice_of_the_pool_and_what_is_allocated_there() -> None:
    free = partitionable()
    part = free.device_index[(DRIVER, POOL, "gpu-0-partition-0")]
    assert counters_fit(free, part, [])  # before: only the device's own slice was read, and nothing ever fit
    busy = partitionable("gpu-0")
    assert not counters_fit(busy, busy.device_index[(DRIVER, POOL, "gpu-0-partition-0")], [])
    assert counters_fit(busy, busy.device_index[(DRIVER, POOL, "gpu-1-partition-0")], [])
    half = partitionable("gpu-0-partition-0")
    other = half.device_index[(DRIVER, POOL, "gpu-0-partition-1")]
    assert counters_fit(half, other, [])
    assert not counters_fit(half, other, [half.device_index[(DRIVER, POOL, "gpu-0-partition-1")]])


def test_devices_wide_shows_each_devices_siblings() -> None:
    rows = {r.device: r.siblings for r in devices.rows(partitionable())}
    assert rows["gpu-0"] == "gpu-0-partition-0,gpu-0-partition-1"
    assert rows["gpu-1-partition-1"] == "gpu-1,gpu-1-partition-0"


def test_explain_shows_the_siblings_of_an_allocated_device() -> None:
    snapshot = partitionable("gpu-0-partition-1")
    report = explain_claim(snapshot, snapshot.claims[0]).claims[0]
    assert report.siblings == {f"{DRIVER}/{POOL}/gpu-0-partition-1": ["gpu-0", "gpu-0-partition-0"]}


def test_clearing_a_device_marked_only_as_a_sibling_names_the_origin() -> None:
    snapshot = partitionable()
    origin: dict[str, Any] = {"metadata": {"name": "broken-gpu-0", "uid": "u"},
                              "spec": {"driver": DRIVER, "pool": POOL, "device": "gpu-0", "effect": "NoExecute",
                                       "reason": "XID 79", "source": "manual"}}
    snapshot.records = [origin, siblings.derived_body(origin, DeviceRef(DRIVER, POOL, "gpu-0"),
                                                      DeviceRef(DRIVER, POOL, "gpu-0-partition-0"))]
    with pytest.raises(marking.MarkError, match=r"sibling of a marked whole device \(record broken-gpu-0\)"):
        marking.plan_clear(snapshot, DeviceRef(DRIVER, POOL, "gpu-0-partition-0"))
    assert marking.plan_clear(snapshot, DeviceRef(DRIVER, POOL, "gpu-0")).delete_record == "broken-gpu-0"


def test_mark_takes_a_scope_and_never_takes_over_a_derived_record() -> None:
    snapshot = partitionable()
    origin: dict[str, Any] = {"metadata": {"name": "broken-gpu-0", "uid": "u"},
                              "spec": {"driver": DRIVER, "pool": POOL, "device": "gpu-0", "effect": "NoExecute",
                                       "reason": "XID 79", "source": "manual"}}
    part = DeviceRef(DRIVER, POOL, "gpu-0-partition-0")
    snapshot.records = [origin, siblings.derived_body(origin, DeviceRef(DRIVER, POOL, "gpu-0"), part)]
    plan = marking.plan_mark(snapshot, part, reason="its own fault", effect="NoSchedule", expires_at=None,
                             scope="Device")
    assert plan.create is not None and plan.create["spec"]["scope"] == "Device"
    assert plan.create["spec"]["source"] == "manual"
    again = marking.plan_mark(snapshot, DeviceRef(DRIVER, POOL, "gpu-0"), reason="x", effect="NoExecute",
                              expires_at=None, scope="Device")
    assert again.patch_name == "broken-gpu-0" and again.patch is not None and again.patch["spec"]["scope"] == "Device"
    with pytest.raises(marking.MarkError, match="--scope 'Rack'"):
        marking.plan_mark(snapshot, part, reason="x", effect="NoExecute", expires_at=None, scope="Rack")


def test_approving_a_whole_devices_mark_approves_the_records_derived_for_its_siblings() -> None:
    # Past an open breaker the pods held back are the partitions' (the full GPU has none): approving the origin
    # alone let nothing go, and the GPU stayed half drained until someone approved each partition's record.
    origin = {"metadata": {"name": "broken-gpu-0", "uid": "uid-o", "generation": 1},
              "spec": {"driver": DRIVER, "pool": POOL, "device": "gpu-0", "effect": "NoExecute", "source": "manual"}}
    mine = [siblings.derived_body(origin, DeviceRef(DRIVER, POOL, "gpu-0"), DeviceRef(DRIVER, POOL, d))
            for d in ("gpu-0-partition-1", "gpu-0-partition-0")]
    other = {"metadata": {"name": "another", "uid": "uid-x"}, "spec": {**origin["spec"], "device": "gpu-1"}}
    theirs = siblings.derived_body(other, DeviceRef(DRIVER, POOL, "gpu-1"),
                                   DeviceRef(DRIVER, POOL, "gpu-1-partition-0"))
    snapshot = Snapshot(records=[origin, *mine, other, theirs])
    found = marking.derived_records(snapshot, origin)
    assert {r["metadata"]["name"] for r in found} == {d["metadata"]["name"] for d in mine}
    assert marking.derived_records(snapshot, theirs) == []
