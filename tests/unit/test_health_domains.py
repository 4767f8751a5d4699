"""Fault domains (health/domains.py): counter sets shared by a GPU and its partitions, parent attributes as
NVIDIA's MIG devices publish them, and what malformed or half-published pools give."""

from __future__ import annotations

from typing import Any

from claimwarden.health.domains import DomainRules, fault_domain, fault_domains, problems
from claimwarden.health.records import DeviceRef

DRIVER = "gpu.example.com"


def ref(device: str, pool: str = "node-a", driver: str = DRIVER) -> DeviceRef:
    return DeviceRef(driver, pool, device)


def slice_(devices: list[dict[str, Any]] | None = None, counter_sets: list[dict[str, Any]] | None = None, *,
           pool: str = "node-a", driver: str = DRIVER, generation: int = 1, count: int = 1) -> dict[str, Any]:
    spec: dict[str, Any] = {"driver": driver, "nodeName": pool,
                            "pool": {"name": pool, "generation": generation, "resourceSliceCount": count}}
    if devices is not None:
        spec["devices"] = devices
    if counter_sets is not None:
        spec["sharedCounters"] = counter_sets
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "spec": spec}


def counter_set(name: str, memory: str = "80Gi") -> dict[str, Any]:
    return {"name": name, "counters": {"memory": {"value": memory}}}


def consumer(name: str, *sets: str, memory: str = "40Gi", **attributes: Any) -> dict[str, Any]:
    return {"name": name, "attributes": {k: {"string": v} for k, v in attributes.items()},
            "consumesCounters": [{"counterSet": s, "counters": {"memory": {"value": memory}}} for s in sets]}


def example_driver_pool(gpus: int = 2, partitions: int = 2, *, pool: str = "node-a") -> list[dict[str, Any]]:
    """dra-example-driver's partitionable shape from 1.35: the counter sets in one slice, the devices in
    another; each GPU and its partitions draw from the GPU's one set."""
    devices = []
    for g in range(gpus):
        devices.append(consumer(f"gpu-{g}", f"gpu-{g}-counter-set", memory="80Gi"))
        devices += [consumer(f"gpu-{g}-partition-{p}", f"gpu-{g}-counter-set") for p in range(partitions)]
    sets = [counter_set(f"gpu-{g}-counter-set") for g in range(gpus)]
    return [slice_(counter_sets=sets, pool=pool, count=2), slice_(devices, pool=pool, count=2)]


def names(domain: frozenset[DeviceRef]) -> set[str]:
    return {r.device for r in domain}


def test_a_gpu_and_its_partitions_form_one_domain_and_other_gpus_stay_out() -> None:
    domains = fault_domains(example_driver_pool())
    expected = {"gpu-0", "gpu-0-partition-0", "gpu-0-partition-1"}
    for device in expected:
        assert names(domains[ref(device)]) == expected
    assert names(domains[ref("gpu-1-partition-0")]) == {"gpu-1", "gpu-1-partition-0", "gpu-1-partition-1"}
    assert len(domains) == 6


def test_the_1_34_shape_with_counters_and_devices_in_one_slice_gives_the_same_domains() -> None:
    split = example_driver_pool()
    together = slice_(split[1]["spec"]["devices"], split[0]["spec"]["sharedCounters"])
    assert fault_domains([together]) == fault_domains(split)


def test_mig_like_devices_join_their_gpu_through_parent_uuid_in_any_attribute_domain() -> None:
    # NVIDIA's driver: qualified attribute names, MIG devices carry their GPU's uuid as parentUUID; no counters.
    devices = [
        {"name": "gpu-0", "attributes": {"gpu.nvidia.com/uuid": {"string": "GPU-aaa"}}},
        {"name": "gpu-0-mig-1g.10gb-0", "attributes": {"gpu.nvidia.com/uuid": {"string": "MIG-111"},
                                                       "gpu.nvidia.com/parentUUID": {"string": "GPU-aaa"}}},
        {"name": "gpu-0-mig-3g.40gb-1", "attributes": {"gpu.nvidia.com/uuid": {"string": "MIG-222"},
                                                       "gpu.nvidia.com/parentUUID": {"string": "GPU-aaa"}}},
        {"name": "gpu-1", "attributes": {"gpu.nvidia.com/uuid": {"string": "GPU-bbb"}}},
        {"name": "gpu-1-mig-7g.80gb-0", "attributes": {"gpu.nvidia.com/uuid": {"string": "MIG-333"},
                                                       "gpu.nvidia.com/parentUUID": {"string": "GPU-bbb"}}},
    ]
    pool = [slice_(devices, driver="gpu.nvidia.com")]
    domain = fault_domain(DeviceRef("gpu.nvidia.com", "node-a", "gpu-0-mig-1g.10gb-0"), pool)
    assert names(domain) == {"gpu-0", "gpu-0-mig-1g.10gb-0", "gpu-0-mig-3g.40gb-1"}
    assert names(fault_domain(DeviceRef("gpu.nvidia.com", "node-a", "gpu-1"), pool)) == {"gpu-1", "gpu-1-mig-7g.80gb-0"}


def test_a_qualified_parent_attribute_matches_only_its_own_domain() -> None:
    devices = [consumer("gpu-0", uuid="GPU-aaa"),
               {"name": "part-a", "attributes": {"other.io/parentUUID": {"string": "GPU-aaa"}}}]
    strict = DomainRules(parent_attributes=("gpu.example.com/parentUUID",))
    assert names(fault_domain(ref("part-a"), [slice_(devices)], rules=strict)) == {"part-a"}
    assert names(fault_domain(ref("part-a"), [slice_(devices)])) == {"gpu-0", "part-a"}


def test_counter_sets_and_parents_add_up() -> None:
    # A MIG-like device publishing both: the union of both groups.
    devices = [consumer("gpu-0", "gpu-0-set", uuid="GPU-aaa"),
               consumer("mig-0", "gpu-0-set", uuid="MIG-1", parentUUID="GPU-aaa"),
               consumer("mig-1", uuid="MIG-2", parentUUID="GPU-aaa")]  # consumes nothing; its parent says where it is
    domains = fault_domains([slice_(devices, [counter_set("gpu-0-set")])])
    assert names(domains[ref("mig-1")]) == {"gpu-0", "mig-0", "mig-1"}
    assert names(domains[ref("gpu-0")]) == {"gpu-0", "mig-0", "mig-1"}


def test_a_device_in_two_counter_sets_is_in_both_domains_which_stay_apart() -> None:
    devices = [consumer("a", "set-1"), consumer("bridge", "set-1", "set-2"), consumer("c", "set-2")]
    domains = fault_domains([slice_(devices, [counter_set("set-1"), counter_set("set-2")])])
    assert names(domains[ref("bridge")]) == {"a", "bridge", "c"}
    assert names(domains[ref("a")]) == {"a", "bridge"}  # not transitive: c shares nothing with a
    assert names(domains[ref("c")]) == {"bridge", "c"}


def test_a_device_without_counters_or_parent_is_its_own_domain() -> None:
    domains = fault_domains([slice_([{"name": "nic-0"}, {"name": "nic-1", "attributes": {"uuid": {"string": "x"}}}])])
    assert domains == {ref("nic-0"): frozenset({ref("nic-0")}), ref("nic-1"): frozenset({ref("nic-1")})}


def test_a_device_the_slices_do_not_list_is_alone() -> None:
    assert fault_domain(ref("gpu-9"), example_driver_pool()) == frozenset({ref("gpu-9")})


def test_the_same_set_name_in_other_pools_or_drivers_does_not_join_them() -> None:
    slices = [*example_driver_pool(pool="node-a"), *example_driver_pool(pool="node-b"),
              slice_([consumer("gpu-0", "gpu-0-counter-set")], [counter_set("gpu-0-counter-set")],
                     driver="other.example.com")]
    domains = fault_domains(slices)
    assert domains[ref("gpu-0", "node-a")] == frozenset(
        {ref("gpu-0", "node-a"), ref("gpu-0-partition-0", "node-a"), ref("gpu-0-partition-1", "node-a")})
    assert domains[DeviceRef("other.example.com", "node-a", "gpu-0")] == frozenset(
        {DeviceRef("other.example.com", "node-a", "gpu-0")})


def test_the_same_parent_value_in_another_pool_does_not_join_them() -> None:
    # An index-like parent attribute repeats across nodes; only the pool's own devices share it.
    slices = [slice_([{"name": "p", "attributes": {"parentUUID": {"int": 0}}}], pool=pool) for pool in ("a", "b")]
    assert fault_domains(slices)[ref("p", "a")] == frozenset({ref("p", "a")})


def test_a_counter_set_no_slice_publishes_still_groups_its_devices_and_is_reported() -> None:
    # The counter slice is not (yet) published, or a driver bug names a set it never lists.
    devices = example_driver_pool()[1]
    domains = fault_domains([devices])
    assert names(domains[ref("gpu-0")]) == {"gpu-0", "gpu-0-partition-0", "gpu-0-partition-1"}
    found = problems([devices])
    assert found == [
        f"{DRIVER}/node-a: counter set 'gpu-0-counter-set' is consumed by gpu-0, gpu-0-partition-0, "
        "gpu-0-partition-1 but no slice of the pool publishes it",
        f"{DRIVER}/node-a: counter set 'gpu-1-counter-set' is consumed by gpu-1, gpu-1-partition-0, "
        "gpu-1-partition-1 but no slice of the pool publishes it"]
    assert problems(example_driver_pool()) == []


def test_only_the_newest_generation_of_a_pool_counts() -> None:
    # The driver re-partitioned the GPU: generation 2 lists other partitions; generation 1's slice lingers.
    old = slice_([consumer("gpu-0", "s"), consumer("gpu-0-old-part", "s")], [counter_set("s")], generation=1)
    new = slice_([consumer("gpu-0", "s"), consumer("gpu-0-new-part", "s")], [counter_set("s")], generation=2)
    domains = fault_domains([old, new])
    assert names(domains[ref("gpu-0")]) == {"gpu-0", "gpu-0-new-part"}
    assert ref("gpu-0-old-part") not in domains


def test_malformed_entries_are_skipped_not_guessed() -> None:
    devices: list[Any] = [
        {"name": "gpu-0", "consumesCounters": [{"counterSet": "s"}]},
        {"name": "no-set", "consumesCounters": [{"counters": {}}, "junk", {"counterSet": ""}]},
        {"name": "not-a-list", "consumesCounters": {"counterSet": "s"}, "attributes": ["x"]},
        {"consumesCounters": [{"counterSet": "s"}]},  # no name
        "junk",
        {"name": "part", "consumesCounters": [{"counterSet": "s"}], "attributes": {"parentUUID": {"string": ""}}},
    ]
    slices: list[Any] = [slice_(devices, [counter_set("s")]), {"spec": None}, {"spec": {"driver": DRIVER}},
                         {"spec": {"driver": DRIVER, "pool": {"name": "node-a", "generation": "x"}, "devices": "x"}}]
    domains = fault_domains(slices)
    assert names(domains[ref("gpu-0")]) == {"gpu-0", "part"}
    assert domains[ref("no-set")] == frozenset({ref("no-set")})
    assert domains[ref("not-a-list")] == frozenset({ref("not-a-list")})
    assert len(domains) == 4
    assert problems(slices) == [f"{DRIVER}/node-a/no-set: a consumesCounters entry names no counterSet; "
                                "it is ignored"] * 2


def test_a_large_pool_is_grouped_once_not_device_by_device() -> None:
    # 8 GPUs with 64 partitions each, on 16 nodes: one domain object per GPU, shared by its 65 devices.
    slices = [s for node in range(16) for s in example_driver_pool(8, 64, pool=f"node-{node}")]
    domains = fault_domains(slices)
    assert len(domains) == 16 * 8 * 65
    gpu = domains[ref("gpu-3", "node-7")]
    assert len(gpu) == 65 and all(r.pool == "node-7" and r.device.startswith("gpu-3") for r in gpu)
    assert all(domains[ref(f"gpu-3-partition-{p}", "node-7")] is gpu for p in range(64))
    assert len({id(d) for d in domains.values()}) == 16 * 8
