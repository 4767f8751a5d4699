"""A lab with mixed GPU models: devices chosen by model, by capacity, and by a prioritized list."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client, config

from claimwarden_lab.cluster import LabState

from .conftest import extra_lab
from .helpers import wait_for

MODEL = "device.attributes['gpu.example.com'].model == '{}'"


@pytest.fixture(scope="module")
def models_lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LabState]:
    with extra_lab(tmp_path_factory, nodes=3, gpus_per_node=2, models="H100,A100,L4") as state:
        yield state


def _allocate(api: client.ApiClient, name: str, request: dict[str, Any]) -> str:
    """Create a claim and a pod using it; return the node (pool) of the device it got."""
    core, resource = client.CoreV1Api(api), client.ResourceV1Api(api)
    resource.create_namespaced_resource_claim("default", body={
        "metadata": {"name": name}, "spec": {"devices": {"requests": [{"name": "gpu", **request}]}}})
    core.create_namespaced_pod("default", body={"metadata": {"name": name}, "spec": {
        "containers": [{"name": "c", "image": "x", "resources": {"claims": [{"name": "gpu"}]}}],
        "resourceClaims": [{"name": "gpu", "resourceClaimName": name}]}})
    claim = wait_for(f"{name} allocated", lambda: (
        c if (c := resource.read_namespaced_resource_claim(name, "default")).status.allocation else None))
    return str(claim.status.allocation.devices.results[0].pool)


def test_nodes_get_the_models_round_robin_with_their_memory(models_lab: LabState) -> None:
    with config.new_client_from_config(config_file=str(models_lab.kubeconfig)) as api:
        slices = client.ResourceV1Api(api).list_resource_slice().items
        seen = {s.spec.node_name: (s.spec.devices[0].attributes["model"].string,
                                   s.spec.devices[0].capacity["memory"].value) for s in slices}
    assert seen == {"kwok-node-0": ("H100", "80Gi"), "kwok-node-1": ("A100", "40Gi"),
                    "kwok-node-2": ("L4", "24Gi")}


def test_devices_are_chosen_by_model_capacity_and_prioritized_list(models_lab: LabState) -> None:
    with config.new_client_from_config(config_file=str(models_lab.kubeconfig)) as api:
        by_model = _allocate(api, "wants-l4", {"exactly": {
            "deviceClassName": "gpu.example.com", "selectors": [{"cel": {"expression": MODEL.format("L4")}}]}})
        assert by_model == "kwok-node-2"
        by_memory = _allocate(api, "wants-40gi", {"exactly": {
            "deviceClassName": "gpu.example.com", "selectors": [{"cel": {"expression":
                "device.capacity['gpu.example.com'].memory.compareTo(quantity('40Gi')) >= 0 && "
                "device.capacity['gpu.example.com'].memory.compareTo(quantity('80Gi')) < 0"}}]}})
        assert by_memory == "kwok-node-1"
        # "H100, else A100", never the L4. The list is ordered per node; which node wins is the
        # scheduler's choice, so check that every result names the subrequest its device satisfies.
        fallback = {"firstAvailable": [
            {"name": "h100", "deviceClassName": "gpu.example.com",
             "selectors": [{"cel": {"expression": MODEL.format("H100")}}]},
            {"name": "a100", "deviceClassName": "gpu.example.com",
             "selectors": [{"cel": {"expression": MODEL.format("A100")}}]}]}
        placed = [_allocate(api, f"choice-{i}", fallback) for i in range(3)]
        assert sorted(placed) == ["kwok-node-0", "kwok-node-0", "kwok-node-1"]  # both H100s, the last A100
        for i, node in enumerate(placed):
            result = client.ResourceV1Api(api).read_namespaced_resource_claim(f"choice-{i}", "default")
            expected = {"kwok-node-0": "gpu/h100", "kwok-node-1": "gpu/a100"}[node]
            assert result.status.allocation.devices.results[0].request == expected
