"""The lab's partitionable profile against a real apiserver and kube-scheduler: the slices are accepted as
published, the scheduler never hands out a whole GPU together with a half of it, and the fault domain over the
slices the apiserver serves is the GPU and its halves.

Partitionable devices in their own counter slices need 1.35+ (the gate is on by default from 1.36), so on the
suite's default 1.34 this module starts a 1.37 lab; with CLAIMWARDEN_KUBERNETES=1.35 or later, that version.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client, config

from claimwarden.health.domains import fault_domain, problems
from claimwarden.health.records import DeviceRef
from claimwarden_lab import driver
from claimwarden_lab.cluster import LabState

from .conftest import extra_lab, lab_kubernetes
from .helpers import delete_namespace, pod_with_claims, wait_for

NODE = "kwok-node-0"
NAMESPACE = "partitions"


@pytest.fixture(scope="module")
def partitionable_lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LabState]:
    version = lab_kubernetes() if lab_kubernetes() >= "1.35" else "1.37"
    # upstream_claims: kube-controller-manager's claim controller releases the claims at the end (no claimwarden).
    with extra_lab(tmp_path_factory, kubernetes=version, nodes=1, gpus_per_node=2, profile="partitionable",
                   upstream_claims=True) as state:
        yield state


@pytest.fixture
def api(partitionable_lab: LabState) -> Iterator[client.ApiClient]:
    with config.new_client_from_config(config_file=str(partitionable_lab.kubeconfig)) as api_client:
        yield api_client


def _slices(api: client.ApiClient) -> list[dict[str, Any]]:
    """Every slice as the apiserver serves it, every field (the client's models may lack new ones)."""
    response = client.ResourceV1Api(api).list_resource_slice(_preload_content=False)
    items: list[dict[str, Any]] = json.loads(response.data)["items"]
    return items


def _claim(name: str, profile: str, index: int) -> dict[str, Any]:
    attrs = f"device.attributes['{driver.DRIVER}']"
    return {"metadata": {"name": name}, "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
        "deviceClassName": driver.DEVICE_CLASS,
        "selectors": [{"cel": {"expression": f"{attrs}.profile == '{profile}' && {attrs}.index == {index}"}}]}}]}}}


def _start(api: client.ApiClient, name: str, profile: str, index: int) -> None:
    client.ResourceV1Api(api).create_namespaced_resource_claim(NAMESPACE, body=_claim(name, profile, index))
    client.CoreV1Api(api).create_namespaced_pod(NAMESPACE, body=pod_with_claims(
        name, [{"name": "gpu", "resourceClaimName": name}]))


def _allocated(api: client.ApiClient, name: str) -> str | None:
    status = client.ResourceV1Api(api).read_namespaced_resource_claim(name, NAMESPACE).status
    allocation = status.allocation if status else None
    return str(allocation.devices.results[0].device) if allocation else None


def _unschedulable(api: client.ApiClient, name: str) -> str | None:
    status = client.CoreV1Api(api).read_namespaced_pod(name, NAMESPACE).status
    return next((c.message or "" for c in (status.conditions or []) if c.type == "PodScheduled"
                 and c.status == "False" and c.reason == "Unschedulable"), None)


def test_the_apiserver_keeps_the_counter_sets_and_the_fault_domain_is_a_gpu_and_its_halves(
        api: client.ApiClient) -> None:
    slices = _slices(api)
    assert sorted(len(s["spec"].get("sharedCounters") or []) for s in slices) == [0, 2]
    devices = {d["name"]: d for s in slices for d in s["spec"].get("devices") or []}
    assert len(devices) == 6 and all(d.get("consumesCounters") for d in devices.values())
    half = DeviceRef(driver.DRIVER, NODE, "gpu-0-partition-1")
    assert fault_domain(half, slices) == {DeviceRef(driver.DRIVER, NODE, name)
                                          for name in ("gpu-0", "gpu-0-partition-0", "gpu-0-partition-1")}
    assert problems(slices) == []


def test_the_scheduler_never_gives_out_a_whole_gpu_and_a_half_of_it(api: client.ApiClient) -> None:
    client.CoreV1Api(api).create_namespace(body={"metadata": {"name": NAMESPACE}})
    try:
        _start(api, "whole-0", "full", 0)
        assert wait_for("the whole gpu-0 allocated", lambda: _allocated(api, "whole-0"), 90) == "gpu-0"
        _start(api, "half-0", "half", 0)
        _start(api, "half-1", "half", 1)  # the other GPU's half: nothing holds its counters
        other = wait_for("a half of gpu-1 allocated", lambda: _allocated(api, "half-1"), 90)
        assert other.startswith("gpu-1-partition")
        message = wait_for("the half of gpu-0 unschedulable", lambda: _unschedulable(api, "half-0"), 90)
        assert _allocated(api, "half-0") is None, message
        # Once the whole GPU's pod is gone and its claim released, the counters are free for the half.
        client.CoreV1Api(api).delete_namespaced_pod("whole-0", NAMESPACE, grace_period_seconds=0)
        client.ResourceV1Api(api).delete_namespaced_resource_claim("whole-0", NAMESPACE)
        assert wait_for("a half of gpu-0 allocated", lambda: _allocated(api, "half-0"), 120).startswith(
            "gpu-0-partition")
    finally:
        delete_namespace(api, NAMESPACE)
        wait_for(f"namespace {NAMESPACE} gone", lambda: NAMESPACE not in {
            n.metadata.name for n in client.CoreV1Api(api).list_namespace().items}, 120)
