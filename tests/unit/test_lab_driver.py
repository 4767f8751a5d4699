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


def _devices() -> list[dict[str, object]]:
    return driver.devices("node-0", 2, driver.MODELS[driver.DEFAULT_MODEL])


def test_a_taint_is_published_on_one_device_without_time_added() -> None:
    tainted = driver.set_device_taint(_devices(), "gpu-1", "gpu.nvidia.com/xid", "79")
    assert "taints" not in tainted[0]
    assert tainted[1]["taints"] == [{"key": "gpu.nvidia.com/xid", "value": "79", "effect": "NoSchedule"}]
    lost = driver.set_device_taint(tainted, "gpu-1", "gpu.nvidia.com/gpu-lost")
    assert lost[1]["taints"][1] == {"key": "gpu.nvidia.com/gpu-lost", "effect": "NoSchedule"}


def test_one_taint_per_key_the_latest_value_wins_and_the_same_taint_keeps_its_time() -> None:
    published = [{**d, "taints": [{"key": "gpu.nvidia.com/xid", "value": "79", "effect": "NoSchedule",
                                   "timeAdded": "2026-12-02T12:00:00Z"}]} for d in _devices()]
    assert driver.set_device_taint(published, "gpu-0", "gpu.nvidia.com/xid", "79") == published
    changed = driver.set_device_taint(published, "gpu-0", "gpu.nvidia.com/xid", "48", "NoExecute")
    assert changed[0]["taints"] == [{"key": "gpu.nvidia.com/xid", "value": "48", "effect": "NoExecute"}]
    assert changed[1] == published[1]


def test_removing_a_taint_drops_only_that_key_and_an_empty_list() -> None:
    tainted = driver.set_device_taint(driver.set_device_taint(_devices(), "gpu-0", "a.example/x", "1"),
                                      "gpu-0", "a.example/y")
    once = driver.remove_device_taint(tainted, "gpu-0", "a.example/x")
    assert [t["key"] for t in once[0]["taints"]] == ["a.example/y"]
    assert "taints" not in driver.remove_device_taint(once, "gpu-0", "a.example/y")[0]
    assert driver.remove_device_taint(_devices(), "gpu-0", "a.example/x") == _devices()


def test_taint_mistakes_are_refused_with_the_fix() -> None:
    with pytest.raises(driver.LabConfigError, match="no device 'gpu-9'; it has gpu-0, gpu-1"):
        driver.set_device_taint(_devices(), "gpu-9", "a.example/x")
    with pytest.raises(driver.LabConfigError, match="effect 'Bad'"):
        driver.set_device_taint(_devices(), "gpu-0", "a.example/x", effect="Bad")
    with pytest.raises(driver.LabConfigError, match="needs a key"):
        driver.set_device_taint(_devices(), "gpu-0", "")
