from __future__ import annotations

import pytest

from claimwarden_lab import driver


def test_default_model_is_dra_example_drivers() -> None:
    [model] = driver.parse_models(None)
    assert (model.name, model.memory, model.compute) == ("LATEST-GPU-MODEL", "80Gi", "100")


def test_models_are_parsed_in_order_and_assigned_round_robin() -> None:
    models = driver.parse_models("H100, A100,L4")
    assert [m.name for m in models] == ["H100", "A100", "L4"]
    assert [driver.model_for_node(models, i).name for i in range(5)] == ["H100", "A100", "L4", "H100", "A100"]
    assert len({m.memory for m in models}) == 3


@pytest.mark.parametrize("text", ["H100,X9", "h100", "H100,", "LATEST-GPU-MODEL"])
def test_unknown_models_name_the_choices(text: str) -> None:
    with pytest.raises(driver.LabConfigError, match="choose from H100,A100,L4"):
        driver.parse_models(text)


def test_slice_lists_devices_like_dra_example_driver() -> None:
    model = driver.parse_models("A100")[0]
    body = driver.resource_slice("kwok-node-3", "uid-3", 4, model)
    assert body["metadata"]["generateName"] == "kwok-node-3-gpu.example.com-"
    assert body["metadata"]["ownerReferences"] == [
        {"apiVersion": "v1", "kind": "Node", "name": "kwok-node-3", "uid": "uid-3", "controller": True}]
    spec = body["spec"]
    assert (spec["driver"], spec["nodeName"], spec["pool"]) == (
        "gpu.example.com", "kwok-node-3", {"name": "kwok-node-3", "generation": 1, "resourceSliceCount": 1})
    assert [d["name"] for d in spec["devices"]] == ["gpu-0", "gpu-1", "gpu-2", "gpu-3"]
    first = spec["devices"][0]
    assert first["attributes"]["index"] == {"int": 0}
    assert first["attributes"]["model"] == {"string": "A100"}
    assert first["attributes"]["driverVersion"] == {"version": "1.0.0"}
    assert first["capacity"]["memory"] == {"value": "40Gi"}


def test_device_uuids_are_stable_and_distinct() -> None:
    assert driver.device_uuid("n0", 1) == driver.device_uuid("n0", 1)
    assert len({driver.device_uuid(n, i) for n in ("n0", "n1") for i in range(8)}) == 16
    assert driver.device_uuid("n0", 0).startswith("gpu-")


def test_nodes_are_selected_by_kwok_annotation() -> None:
    body = driver.node("kwok-node-0")
    assert body["metadata"]["annotations"] == {"kwok.x-k8s.io/node": "fake"}
    assert body["metadata"]["labels"]["kubernetes.io/hostname"] == "kwok-node-0"
