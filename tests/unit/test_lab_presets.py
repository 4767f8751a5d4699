"""The lab's per-version presets: gates and runtime-config per feature, refusals with reasons."""

from __future__ import annotations

import pytest

from claimwarden_lab import presets
from claimwarden_lab.processes import LabError


@pytest.mark.parametrize(("version", "gates", "runtime_config"), [
    ("1.34.4", "DRADeviceTaints=true", "resource.k8s.io/v1alpha3=true"),
    ("1.35.4", "DRADeviceTaints=true,DRADeviceTaintRules=true", "resource.k8s.io/v1alpha3=true"),
    ("1.36.3", "DRADeviceTaintRules=true", "resource.k8s.io/v1beta2=true"),
    ("1.37.2", "", ""),
])
def test_device_taints_need_what_each_version_keeps_off(version: str, gates: str, runtime_config: str) -> None:
    assert presets.resolve(version, "device-taints") == (gates, runtime_config)


def test_presets_merge_and_explicit_values_come_last() -> None:
    gates, config = presets.resolve("1.37.2", "podgroups,device-taints", "Foo=true", "x/v1=true")
    assert gates == "GenericWorkload=true,DRAWorkloadResourceClaims=true,Foo=true"
    assert config == "scheduling.k8s.io/v1beta1=true,x/v1=true"


def test_podgroups_on_1_36_use_the_alpha_scheduling_api() -> None:
    assert presets.resolve("1.36.3", "podgroups")[1] == "scheduling.k8s.io/v1alpha2=true"


@pytest.mark.parametrize("version", ["1.34.4", "1.35.4"])
def test_podgroups_before_1_36_are_refused_with_the_reason(version: str) -> None:
    with pytest.raises(LabError, match=r"first appear in 1\.36"):
        presets.resolve(version, "podgroups")


def test_an_unknown_preset_names_the_known_ones() -> None:
    with pytest.raises(LabError, match="device-taints, extended-resources, partitionable-devices, podgroups, "
                                       "resource-health"):
        presets.resolve("1.37.2", "gpus")


def test_no_preset_leaves_the_given_values_alone() -> None:
    assert presets.resolve("1.34.4", "", "A=true", "b/v1=true") == ("A=true", "b/v1=true")


@pytest.mark.parametrize(("version", "gates"), [
    ("1.34.4", "ResourceHealthStatus=true"), ("1.35.4", "ResourceHealthStatus=true"),
    ("1.36.3", ""), ("1.37.2", ""),
])
def test_resource_health_turns_the_alpha_gate_on_before_1_36(version: str, gates: str) -> None:
    assert presets.resolve(version, "resource-health") == (gates, "")


def test_signals_presets_combine_on_1_34() -> None:
    assert presets.resolve("1.34.4", "device-taints,resource-health") == (
        "DRADeviceTaints=true,ResourceHealthStatus=true", "resource.k8s.io/v1alpha3=true")


@pytest.mark.parametrize(("version", "gates"), [("1.35.4", "DRAPartitionableDevices=true"), ("1.36.3", ""),
                                                ("1.37.2", "")])
def test_partitionable_devices_need_the_gate_until_1_36(version: str, gates: str) -> None:
    assert presets.resolve(version, "partitionable-devices") == (gates, "")


def test_partitionable_devices_on_1_34_are_refused_with_the_reason() -> None:
    with pytest.raises(LabError, match=r"from 1\.35 .*choose --kubernetes 1\.35 or later"):
        presets.resolve("1.34.4", "partitionable-devices")
