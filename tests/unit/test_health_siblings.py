"""Siblings (health/siblings.py, domains.whole_devices): which device is whole, which mark extends to its fault
domain, and the derived records a pool should have, driven with plain slices and records."""

from __future__ import annotations

import dataclasses
from typing import Any

from claimwarden.health import siblings
from claimwarden.health.domains import whole_devices
from claimwarden.health.records import DeviceRef

from .test_health_domains import DRIVER, consumer, counter_set, example_driver_pool, ref, slice_

POOL = "node-a"


def names(refs: frozenset[DeviceRef]) -> set[str]:
    return {r.device for r in refs}


def record(name: str, device: str, *, effect: str = "NoExecute", scope: str | None = None, source: str = "manual",
           uid: str | None = None, owner: str | None = None, **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"metadata": {"name": name, "uid": uid or f"uid-{name}"},
                            "spec": {"driver": DRIVER, "pool": POOL, "device": device, "effect": effect,
                                     "reason": "XID 79", "source": source, **spec}}
    if scope is not None:
        body["spec"]["scope"] = scope
    if owner is not None:
        body["metadata"]["ownerReferences"] = [{"apiVersion": "claimwarden.io/v1alpha1", "kind": "UnhealthyDevice",
                                                "name": "x", "uid": owner, "controller": True}]
    return body


def derived(origin: dict[str, Any], device: str) -> dict[str, Any]:
    """A derived record as the API server would return it after its creation."""
    body = siblings.derived_body(origin, ref(origin["spec"]["device"]), ref(device))
    body["metadata"]["uid"] = f"uid-{body['metadata']['name']}"
    return body


# --- whole devices ------------------------------------------------------------------------------

def test_the_full_gpu_is_whole_and_its_partitions_are_not() -> None:
    assert names(whole_devices(example_driver_pool())) == {"gpu-0", "gpu-1"}


def test_counters_compare_as_quantities_and_every_counter_of_every_set_must_be_taken() -> None:
    full = {"memory": {"value": "80Gi"}, "compute": {"value": "100"}}
    sets = [{"name": "s", "counters": full}, {"name": "t", "counters": {"memory": {"value": "1Gi"}}}]
    devices = [
        {"name": "same-value-other-unit", "consumesCounters": [{"counterSet": "s", "counters": {
            "memory": {"value": str(80 * 2**30)}, "compute": {"value": "100"}}}]},
        {"name": "misses-compute",
         "consumesCounters": [{"counterSet": "s", "counters": {"memory": {"value": "80Gi"}}}]},
        {"name": "all-of-s-half-of-t", "consumesCounters": [
            {"counterSet": "s", "counters": full}, {"counterSet": "t", "counters": {"memory": {"value": "512Mi"}}}]},
        {"name": "unpublished-set", "consumesCounters": [{"counterSet": "u", "counters": full}]},
        {"name": "malformed-value", "consumesCounters": [{"counterSet": "s", "counters": {
            "memory": {"value": "lots"}, "compute": {"value": "100"}}}]},
        {"name": "no-counters"},
    ]
    assert names(whole_devices([slice_(devices, sets)])) == {"same-value-other-unit"}


def test_a_mig_parent_is_whole_through_its_childrens_parent_attribute() -> None:
    devices = [
        {"name": "gpu-0", "attributes": {"gpu.nvidia.com/uuid": {"string": "GPU-aaa"}}},
        {"name": "mig-0", "attributes": {"gpu.nvidia.com/uuid": {"string": "MIG-1"},
                                         "gpu.nvidia.com/parentUUID": {"string": "GPU-aaa"}}},
        {"name": "gpu-1", "attributes": {"gpu.nvidia.com/uuid": {"string": "GPU-bbb"}}},  # no partitions
    ]
    assert names(whole_devices([slice_(devices)])) == {"gpu-0"}


def test_a_published_set_with_a_malformed_counter_makes_nobody_whole() -> None:
    sets: list[Any] = [{"name": "s", "counters": {"memory": {"value": "80Gi"}, "bad": {}}}]
    devices = [{"name": "gpu-0", "consumesCounters": [{"counterSet": "s", "counters": {
        "memory": {"value": "80Gi"}, "bad": {}}}]}]
    assert whole_devices([slice_(devices, sets)]) == frozenset()


# --- scope --------------------------------------------------------------------------------------

def test_the_scope_defaults_to_the_fault_domain_for_a_whole_device_and_to_the_device_for_a_partition() -> None:
    assert siblings.record_scope(record("r", "gpu-0"), whole=True) == "FaultDomain"
    assert siblings.record_scope(record("r", "gpu-0-partition-0"), whole=False) == "Device"
    assert siblings.record_scope(record("r", "gpu-0", scope="Device"), whole=True) == "Device"
    assert siblings.record_scope(record("r", "p", scope="FaultDomain"), whole=False) == "FaultDomain"


def test_a_bad_scope_marks_the_device_only_and_says_why() -> None:
    bad = record("r", "gpu-0", scope="Rack")
    assert siblings.record_scope(bad, whole=True) == "Device"
    assert siblings.scope_error(bad) == "spec.scope 'Rack' is not one of Device, FaultDomain; " \
                                        "the record marks its own device only"
    assert siblings.scope_error(record("r", "gpu-0")) is None


# --- the pool's derived records -----------------------------------------------------------------

def test_marking_the_full_gpu_derives_one_record_per_partition_owned_by_the_origin() -> None:
    origin = record("admin-gpu-0", "gpu-0", drain="EvictAfter=1m")
    sync = siblings.plan_pool(DRIVER, POOL, [origin], example_driver_pool())
    assert [b["spec"]["device"] for b in sync.create] == ["gpu-0-partition-0", "gpu-0-partition-1"]
    body = sync.create[0]
    assert body["spec"] == {"driver": DRIVER, "pool": POOL, "device": "gpu-0-partition-0", "source": "sibling",
                            "effect": "NoExecute", "drain": "EvictAfter=1m", "scope": "Device",
                            "reason": "in the fault domain of gpu-0 (record admin-gpu-0): XID 79"}
    assert body["metadata"]["ownerReferences"] == [{"apiVersion": "claimwarden.io/v1alpha1", "kind": "UnhealthyDevice",
                                                    "name": "admin-gpu-0", "uid": "uid-admin-gpu-0",
                                                    "controller": True}]
    assert body["metadata"]["labels"] == {siblings.ORIGIN_LABEL: "admin-gpu-0"}
    assert sync.patch == () and sync.delete == ()


def test_a_planned_pool_that_has_its_records_changes_nothing_also_after_a_restart() -> None:
    origin = record("o", "gpu-0", effect="NoSchedule")
    have = [origin, derived(origin, "gpu-0-partition-0"), derived(origin, "gpu-0-partition-1")]
    sync = siblings.plan_pool(DRIVER, POOL, have, example_driver_pool())
    assert (sync.create, sync.patch, sync.delete) == ((), (), ())


def test_marking_a_partition_leaves_its_siblings_alone_unless_its_scope_is_the_fault_domain() -> None:
    pool = example_driver_pool()
    assert siblings.plan_pool(DRIVER, POOL, [record("p", "gpu-0-partition-1")], pool).create == ()
    sync = siblings.plan_pool(DRIVER, POOL, [record("p", "gpu-0-partition-1", scope="FaultDomain")], pool)
    assert [b["spec"]["device"] for b in sync.create] == ["gpu-0", "gpu-0-partition-0"]


def test_a_whole_device_marked_device_scoped_a_dry_run_or_a_lone_device_derives_nothing() -> None:
    pool = [*example_driver_pool(), slice_([{"name": "nic-0"}], pool=POOL)]
    for origin in (record("a", "gpu-0", scope="Device"), record("b", "gpu-1", effect="None"), record("c", "nic-0")):
        assert siblings.plan_pool(DRIVER, POOL, [origin], pool).create == ()


def test_derived_records_are_never_extended_further() -> None:
    # A derived record of the full GPU with scope FaultDomain (forged or edited) derives nothing itself.
    fake = record("d", "gpu-0", source="sibling", scope="FaultDomain")
    sync = siblings.plan_pool(DRIVER, POOL, [fake], example_driver_pool())
    assert sync.create == () and sync.delete == (("d", "uid-d"),)


def test_a_cleared_origin_takes_its_derived_records_and_a_changed_one_patches_them() -> None:
    origin = record("o", "gpu-0")
    have = [derived(origin, "gpu-0-partition-0"), derived(origin, "gpu-0-partition-1")]
    gone = siblings.plan_pool(DRIVER, POOL, have, example_driver_pool())
    assert sorted(name for name, _ in gone.delete) == sorted(b["metadata"]["name"] for b in have)
    softer = record("o", "gpu-0", effect="NoSchedule", drain="AllowCompletion")
    changed = siblings.plan_pool(DRIVER, POOL, [softer, *have], example_driver_pool())
    assert [fields for _, fields in changed.patch] == [{"effect": "NoSchedule", "drain": "AllowCompletion"}] * 2
    dry = siblings.plan_pool(DRIVER, POOL, [record("o", "gpu-0", effect="None"), *have], example_driver_pool())
    assert len(dry.delete) == 2 and dry.create == ()


def test_an_origin_being_deleted_extends_no_more() -> None:
    origin = record("o", "gpu-0")
    leaving = {**origin, "metadata": {**origin["metadata"], "deletionTimestamp": "2026-01-01T00:00:00Z"}}
    sync = siblings.plan_pool(DRIVER, POOL, [leaving, derived(origin, "gpu-0-partition-0")], example_driver_pool())
    assert len(sync.delete) == 1 and sync.create == ()


def test_two_origins_covering_one_sibling_give_one_derived_record_each() -> None:
    gpu = record("gpu", "gpu-0")
    part = record("part", "gpu-0-partition-0", scope="FaultDomain")
    sync = siblings.plan_pool(DRIVER, POOL, [gpu, part], example_driver_pool())
    covered = sorted((b["metadata"]["ownerReferences"][0]["name"], b["spec"]["device"]) for b in sync.create)
    assert covered == [("gpu", "gpu-0-partition-0"), ("gpu", "gpu-0-partition-1"),
                       ("part", "gpu-0"), ("part", "gpu-0-partition-1")]
    assert len({b["metadata"]["name"] for b in sync.create}) == 4


def test_a_sibling_marked_by_its_own_record_gets_a_derived_one_too() -> None:
    # Clearing the sibling's own record must not free it while the full GPU is marked.
    own = record("own", "gpu-0-partition-0", effect="NoSchedule")
    sync = siblings.plan_pool(DRIVER, POOL, [record("o", "gpu-0"), own], example_driver_pool())
    assert [b["spec"]["device"] for b in sync.create] == ["gpu-0-partition-0", "gpu-0-partition-1"]


def test_a_forged_or_stale_record_under_a_derived_name_is_replaced_and_a_stray_one_deleted() -> None:
    origin = record("o", "gpu-0")
    stale = derived(origin, "gpu-0-partition-0")
    stale["metadata"]["ownerReferences"][0]["uid"] = "uid-of-an-older-o"  # "o" was deleted and made again
    stray = record("fake", "gpu-1", source="sibling", owner="uid-o")  # o does not cover gpu-1
    sync = siblings.plan_pool(DRIVER, POOL, [origin, stale, stray], example_driver_pool())
    assert sorted(sync.delete) == sorted([(stale["metadata"]["name"], stale["metadata"]["uid"]), ("fake", "uid-fake")])
    assert [b["spec"]["device"] for b in sync.create] == ["gpu-0-partition-1"]  # partition-0's comes once it is gone


def test_a_repartitioned_gpu_drops_the_partition_that_left_and_adds_the_new_one() -> None:
    origin = record("o", "gpu-0")
    old_part = derived(origin, "gpu-0-partition-0")
    devices = [consumer("gpu-0", "s", memory="80Gi"), consumer("gpu-0-other", "s"), consumer("gpu-0-partition-0", "t")]
    new = [slice_(devices, [counter_set("s"), counter_set("t")], generation=2)]
    sync = siblings.plan_pool(DRIVER, POOL, [origin, old_part], new)
    assert sync.delete == ((old_part["metadata"]["name"], old_part["metadata"]["uid"]),)
    assert [b["spec"]["device"] for b in sync.create] == ["gpu-0-other"]


def test_devices_missing_from_the_slices_keep_their_marks() -> None:
    # The driver re-creates its slices: for a moment the pool lists only some devices, or none.
    origin = record("o", "gpu-0")
    have = [origin, derived(origin, "gpu-0-partition-0"), derived(origin, "gpu-0-partition-1")]
    assert siblings.plan_pool(DRIVER, POOL, have, []).delete == ()
    partial = [slice_([consumer("gpu-0", "gpu-0-counter-set", memory="80Gi"),
                       consumer("gpu-0-partition-0", "gpu-0-counter-set")],
                      [counter_set("gpu-0-counter-set")], generation=2)]
    assert siblings.plan_pool(DRIVER, POOL, have, partial).delete == ()


def test_records_of_other_pools_and_records_without_a_device_are_ignored() -> None:
    elsewhere = record("o", "gpu-0")
    elsewhere["spec"]["pool"] = "node-b"
    broken: dict[str, Any] = {"metadata": {"name": "x"}, "spec": {"driver": DRIVER}}
    sync = siblings.plan_pool(DRIVER, POOL, [elsewhere, broken], example_driver_pool())
    assert (sync.create, sync.patch, sync.delete) == ((), (), ())


def test_nothing_is_deleted_while_the_pool_is_incomplete() -> None:
    # Generation 2's device slice is out, its counter slice not yet: gpu-0 does not look whole for now.
    origin = record("o", "gpu-0")
    have = [origin, derived(origin, "gpu-0-partition-0"), derived(origin, "gpu-0-partition-1")]
    half_published = [{**example_driver_pool()[1]}]
    half_published[0]["spec"] = {**half_published[0]["spec"], "pool": {"name": POOL, "generation": 2,
                                                                       "resourceSliceCount": 2}}
    assert siblings.pool_complete(half_published) is False and siblings.pool_complete(example_driver_pool())
    assert siblings.plan_pool(DRIVER, POOL, have, half_published).delete == ()
    assert siblings.pool_complete([]) is False


def test_the_domain_shown_in_a_records_status() -> None:
    assert siblings.domain_devices(ref("gpu-0-partition-1"), example_driver_pool()) == [
        "gpu-0", "gpu-0-partition-0", "gpu-0-partition-1"]
    assert siblings.domain_devices(ref("gpu-7"), example_driver_pool()) is None


def test_the_status_shows_the_domain_and_keeps_the_last_one_while_the_device_is_not_listed() -> None:
    gpu = ref("gpu-0")
    assert siblings.domain_status(["gpu-0", "p-0"], {}, gpu) == {"faultDomain": ["gpu-0", "p-0"], "faultDomainSize": 2}
    shown = {"faultDomain": ["gpu-0", "p-0"], "faultDomainSize": 2}
    assert siblings.domain_status(None, shown, gpu) == shown
    assert siblings.domain_status(None, {}, gpu) == {"faultDomain": ["gpu-0"], "faultDomainSize": 1}
    big = [f"p-{i:03}" for i in range(200)]
    assert siblings.domain_status(big, {}, gpu) == {"faultDomain": big[:128], "faultDomainSize": 200}


def test_a_policy_rule_sets_the_scope_of_its_signal_records() -> None:
    from claimwarden.signals import records as signal_records
    from claimwarden.signals.policy import parse_policy

    policy, errors = parse_policy({"metadata": {"name": "p"}, "spec": {"rules": [
        {"name": "reset", "source": "DriverTaint", "signal": "gpu.nvidia.com/xid", "effect": "NoExecute",
         "scope": "FaultDomain"}]}})
    assert errors == [] and policy is not None and policy.rules[0].scope == "FaultDomain"
    decided = signal_records.decide.Decision(
        effect="NoExecute", would="NoExecute", policy="p", rule="reset", mode="Enforce", why="x", escalated=False,
        recovered=False, workload_fault=False, drain=None, history=signal_records.decide.History(), scope="FaultDomain")
    spec = signal_records.desired_spec(decided)
    assert spec["scope"] == "FaultDomain"
    unscoped = signal_records.desired_spec(dataclasses.replace(decided, scope=None))
    assert unscoped["scope"] is None  # a merge patch removes it
    assert "scope" not in signal_records.record_body(ref("gpu-0"), unscoped)["spec"]  # a new record leaves it out


def test_an_annotation_on_a_device_with_a_derived_record_gets_a_record_of_its_own() -> None:
    from claimwarden.health.records import record_name
    from claimwarden.health.slice_marks import plan_slice

    origin = record("o", "gpu-0")
    derived_record = derived(origin, "gpu-0-partition-0")
    annotated = {"metadata": {"name": "slice-a", "annotations": {
                     "unhealthy.claimwarden.io/gpu-0-partition-0": "its own fault"}},
                 "spec": {"driver": DRIVER, "pool": {"name": POOL, "generation": 1, "resourceSliceCount": 1},
                          "devices": [{"name": "gpu-0-partition-0"}]}}
    sync = plan_slice(annotated, {derived_record["metadata"]["name"]: derived_record})
    assert [b["metadata"]["name"] for b in sync.create] == [record_name(ref("gpu-0-partition-0"))]
    assert sync.delete == () and sync.update_reason == ()


def test_the_caches_projections_keep_what_the_plan_reads() -> None:
    # The operator plans from projected slices and records (trimmed.py): counter sets, consumed counters
    # and the derived records' owner must survive the projection.
    from claimwarden.objects import trimmed

    slices = [trimmed.resource_slice(s) for s in example_driver_pool()]
    assert whole_devices(slices) == whole_devices(example_driver_pool())
    origin = record("o", "gpu-0")
    have = [trimmed.record(r) for r in (origin, derived(origin, "gpu-0-partition-0"),
                                            derived(origin, "gpu-0-partition-1"))]
    sync = siblings.plan_pool(DRIVER, POOL, have, slices)
    assert (sync.create, sync.patch, sync.delete) == ((), (), ())


def test_an_origin_whose_device_is_not_listed_is_found_through_its_derived_records() -> None:
    # The whole GPU fell off the bus: the driver lists its partitions only. The records found through the listed
    # devices are the derived ones; without their origin the plan deletes them (and the live LIST then undoes it
    # on every event of the pool).
    origin = record("o", "gpu-0")
    kept = [derived(origin, "gpu-0-partition-0"), derived(origin, "gpu-0-partition-1")]
    slices = [slice_([consumer("gpu-0-partition-0", "gpu-0-counter-set"),
                      consumer("gpu-0-partition-1", "gpu-0-counter-set")], [counter_set("gpu-0-counter-set")])]
    assert siblings.plan_pool(DRIVER, POOL, kept, slices).delete != ()
    found = siblings.with_origins(kept, {"o": origin}.get)
    assert [r["metadata"]["name"] for r in found] == [r["metadata"]["name"] for r in kept] + ["o"]
    assert siblings.plan_pool(DRIVER, POOL, found, slices).delete == ()
    assert siblings.with_origins(kept, {}.get) == kept  # an origin that is gone stays gone
