"""The lab's partitionable profile: each GPU whole and as two halves drawing from the GPU's counter set, in
slices the apiserver accepts (counter sets and devices apart, within the per-slice limits), refused where the
version cannot serve it."""

from __future__ import annotations

from typing import Any

import pytest

from claimwarden.health.domains import fault_domains, problems
from claimwarden.health.records import DeviceRef
from claimwarden_lab import cluster, driver
from claimwarden_lab.processes import LabError

H100 = driver.MODELS["H100"]


def _devices(slices: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {d["name"]: d for s in slices for d in s["spec"].get("devices") or []}


def test_each_gpu_is_offered_whole_and_as_halves_of_its_counter_set() -> None:
    slices = driver.resource_slices("kwok-node-0", "uid", 2, H100, driver.PROFILE_PARTITIONABLE)
    assert [sorted(s["spec"]) for s in slices] == [
        ["driver", "nodeName", "pool", "sharedCounters"], ["devices", "driver", "nodeName", "pool"]]
    assert {s["spec"]["pool"]["resourceSliceCount"] for s in slices} == {2}
    assert slices[0]["spec"]["sharedCounters"] == [
        {"name": f"gpu-{i}-counter-set", "counters": {"memory": {"value": "80Gi"}, "compute": {"value": "132"}}}
        for i in range(2)]
    devices = _devices(slices)
    assert sorted(devices) == ["gpu-0", "gpu-0-partition-0", "gpu-0-partition-1",
                               "gpu-1", "gpu-1-partition-0", "gpu-1-partition-1"]
    whole, half = devices["gpu-1"], devices["gpu-1-partition-1"]
    assert whole["consumesCounters"] == [{"counterSet": "gpu-1-counter-set", "counters": {
        "memory": {"value": "80Gi"}, "compute": {"value": "132"}}}]
    assert half["consumesCounters"] == [{"counterSet": "gpu-1-counter-set", "counters": {
        "memory": {"value": "40Gi"}, "compute": {"value": "66"}}}]
    assert half["capacity"] == {"memory": {"value": "40Gi"}, "compute": {"value": "66"}}
    assert half["attributes"]["parentUUID"] == whole["attributes"]["uuid"]
    assert (whole["attributes"]["profile"], half["attributes"]["profile"]) == ({"string": "full"}, {"string": "half"})


def test_more_than_eight_gpus_are_split_within_the_slice_limits() -> None:
    # ResourceSliceMaxCounterSets = 8; at most 64 devices consuming counters per slice.
    slices = driver.resource_slices("kwok-node-0", "uid", 20, H100, driver.PROFILE_PARTITIONABLE)
    assert len(slices) == 6 and {s["spec"]["pool"]["resourceSliceCount"] for s in slices} == {6}
    assert all(len(s["spec"].get("sharedCounters") or []) <= 8 for s in slices)
    assert all(len(s["spec"].get("devices") or []) <= 64 for s in slices)
    assert len(_devices(slices)) == 60


def test_the_fault_domains_of_the_profile_are_a_gpu_and_its_halves() -> None:
    slices = driver.resource_slices("kwok-node-0", "uid", 3, H100, driver.PROFILE_PARTITIONABLE)
    domains = fault_domains(slices)
    family = {DeviceRef(driver.DRIVER, "kwok-node-0", n) for n in ("gpu-2", "gpu-2-partition-0", "gpu-2-partition-1")}
    assert all(domains[ref] == family for ref in family)
    assert problems(slices) == []


def test_the_plain_profile_is_unchanged() -> None:
    assert driver.resource_slices("n", "uid", 8, H100) == [driver.resource_slice("n", "uid", 8, H100)]
    with pytest.raises(driver.LabConfigError, match="plain, partitionable"):
        driver.resource_slices("n", "uid", 8, H100, "mig")


def test_the_profile_brings_its_preset_and_is_refused_before_1_35() -> None:
    options = cluster.LabOptions(kubernetes="1.37.2", profile="partitionable", presets="device-taints")
    assert options.all_presets() == "device-taints,partitionable-devices"
    assert cluster.LabOptions().all_presets() == ""
    with pytest.raises(LabError, match=r"not available on Kubernetes 1\.34\.4: .* from 1\.35"):
        cluster.LabOptions(kubernetes="1.34", profile="partitionable").validate()
    with pytest.raises(LabError, match="unknown device profile 'mig'"):
        cluster.LabOptions(profile="mig").validate()
