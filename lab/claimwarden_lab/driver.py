"""A fake DRA driver: the DeviceClass, Nodes and ResourceSlices that dra-example-driver would publish,
and the device taints (KEP-5055) that NVIDIA's driver publishes on a broken GPU (``lab taint``).

Two device profiles: ``plain`` (the default: whole GPUs, one slice per node) and ``partitionable``
(KEP-4815, as dra-example-driver's partitionable example publishes it): each GPU is offered whole and as
two halves, all three drawing from the GPU's one counter set, so that the scheduler never hands out the
whole GPU together with a half of it, nor more halves than fit. Counter sets and devices go in separate
slices of the node's pool (a slice holds one or the other from 1.35).

Only pure functions that build API objects as dicts; ``cluster.py`` writes them.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

DRIVER = "gpu.example.com"
DEVICE_CLASS = "gpu.example.com"
DEFAULT_MODEL = "LATEST-GPU-MODEL"
NODE_ANNOTATION = "kwok.x-k8s.io/node"


@dataclass(frozen=True)
class GpuModel:
    name: str
    memory: str
    compute: str


# Plausible memory sizes for the models users name; the default matches dra-example-driver.
MODELS: dict[str, GpuModel] = {
    DEFAULT_MODEL: GpuModel(DEFAULT_MODEL, "80Gi", "100"),
    "H100": GpuModel("H100", "80Gi", "132"),
    "A100": GpuModel("A100", "40Gi", "108"),
    "L4": GpuModel("L4", "24Gi", "58"),
}
USER_MODELS = [m for m in MODELS if m != DEFAULT_MODEL]


class LabConfigError(ValueError):
    """A lab option the user gave is wrong; the message names the fix."""


def parse_models(text: str | None) -> list[GpuModel]:
    """``"H100,A100"`` -> models; an empty value means the default model on every node."""
    if not text:
        return [MODELS[DEFAULT_MODEL]]
    names = [part.strip() for part in text.split(",")]
    wrong = [n for n in names if n not in USER_MODELS]
    if wrong or not names:
        raise LabConfigError(
            f"unknown GPU model(s) {', '.join(repr(w) for w in wrong)} in --models; "
            f"choose from {','.join(USER_MODELS)} (for example --models H100,A100)")
    return [MODELS[n] for n in names]


def node_name(index: int) -> str:
    return f"kwok-node-{index}"


def node(name: str) -> dict[str, Any]:
    """A Node that kwok manages (selected by annotation) and that pods can land on."""
    resources = {"cpu": "256", "memory": "2Ti", "pods": "1000"}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {NODE_ANNOTATION: "fake"},
            "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
                       "kubernetes.io/arch": "amd64", "type": "kwok"},
        },
        "status": {"allocatable": resources, "capacity": resources},
    }


def device_class() -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": DEVICE_CLASS},
        "spec": {"selectors": [{"cel": {"expression": f"device.driver == '{DRIVER}'"}}]},
    }


def device_uuid(node: str, index: int) -> str:
    """Stable per (node, index), like the real driver's seeded UUIDs (the values differ)."""
    return f"gpu-{uuid.uuid5(uuid.NAMESPACE_DNS, f'{node}/{index}')}"


def devices(node: str, count: int, model: GpuModel) -> list[dict[str, Any]]:
    return [gpu(node, i, model) for i in range(count)]


def gpu(node: str, i: int, model: GpuModel) -> dict[str, Any]:
    return {
        "name": f"gpu-{i}",
        "attributes": {
            "index": {"int": i},
            "uuid": {"string": device_uuid(node, i)},
            "model": {"string": model.name},
            "driverVersion": {"version": "1.0.0"},
        },
        "capacity": {"memory": {"value": model.memory}, "compute": {"value": model.compute}},
    }


def resource_slice(node_name: str, node_uid: str, count: int, model: GpuModel) -> dict[str, Any]:
    """One slice per node, owned by the Node so that deleting the node garbage-collects it."""
    return _slice(node_name, node_uid, 1, {"devices": devices(node_name, count, model)})


def _slice(node_name: str, node_uid: str, slice_count: int, content: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {
            "generateName": f"{node_name}-{DRIVER}-",
            "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": node_name,
                                 "uid": node_uid, "controller": True}],
        },
        "spec": {
            "driver": DRIVER,
            "nodeName": node_name,
            "pool": {"name": node_name, "generation": 1, "resourceSliceCount": slice_count},
            **content,
        },
    }


PROFILE_PLAIN = "plain"
PROFILE_PARTITIONABLE = "partitionable"
PROFILES = (PROFILE_PLAIN, PROFILE_PARTITIONABLE)
PARTITIONS_PER_GPU = 2
GPUS_PER_SLICE_PAIR = 8
"""A slice holds at most 8 counter sets (ResourceSliceMaxCounterSets) and 64 devices that consume counters:
8 GPUs give 8 sets and 24 devices, so each 8 GPUs of a node get a counter slice and a device slice."""


def counter_set_name(index: int) -> str:
    return f"gpu-{index}-counter-set"


def partition_name(index: int, partition: int) -> str:
    return f"gpu-{index}-partition-{partition}"


def partitionable_devices(node: str, indices: range, model: GpuModel) -> list[dict[str, Any]]:
    """Per GPU: the whole GPU (profile ``full``) and its halves (profile ``half``, with the GPU's uuid as
    ``parentUUID``), each consuming its share of the GPU's counter set."""
    memory, compute = _quantity(model.memory), int(model.compute)
    result = []
    for i in indices:
        whole = gpu(node, i, model)
        whole["attributes"]["profile"] = {"string": "full"}
        whole["consumesCounters"] = [{"counterSet": counter_set_name(i), "counters": _counters(memory, compute)}]
        result.append(whole)
        for p in range(PARTITIONS_PER_GPU):
            share = (memory[0] // PARTITIONS_PER_GPU, memory[1]), compute // PARTITIONS_PER_GPU
            result.append({
                "name": partition_name(i, p),
                "attributes": {
                    "index": {"int": i},
                    "uuid": {"string": f"{device_uuid(node, i)}-{p}"},
                    "parentUUID": {"string": device_uuid(node, i)},
                    "model": {"string": model.name},
                    "profile": {"string": "half"},
                    "driverVersion": {"version": "1.0.0"},
                },
                "capacity": {"memory": {"value": f"{share[0][0]}{share[0][1]}"}, "compute": {"value": str(share[1])}},
                "consumesCounters": [{"counterSet": counter_set_name(i), "counters": _counters(*share)}],
            })
    return result


def partitionable_slices(node_name: str, node_uid: str, count: int, model: GpuModel) -> list[dict[str, Any]]:
    """The node's pool in the partitionable profile: per 8 GPUs, a slice of their counter sets and a slice of
    their devices (whole and halves)."""
    memory, compute = _quantity(model.memory), int(model.compute)
    chunks = [range(first, min(first + GPUS_PER_SLICE_PAIR, count)) for first in range(0, count, GPUS_PER_SLICE_PAIR)]
    slices = []
    for chunk in chunks:
        slices.append(_slice(node_name, node_uid, 2 * len(chunks), {"sharedCounters": [
            {"name": counter_set_name(i), "counters": _counters(memory, compute)} for i in chunk]}))
        slices.append(_slice(node_name, node_uid, 2 * len(chunks),
                             {"devices": partitionable_devices(node_name, chunk, model)}))
    return slices


def resource_slices(node_name: str, node_uid: str, count: int, model: GpuModel,
                    profile: str = PROFILE_PLAIN) -> list[dict[str, Any]]:
    """The slices of a node's pool in ``profile``."""
    if profile == PROFILE_PARTITIONABLE:
        return partitionable_slices(node_name, node_uid, count, model)
    if profile != PROFILE_PLAIN:
        raise LabConfigError(f"unknown device profile {profile!r}; choose from {', '.join(PROFILES)}")
    return [resource_slice(node_name, node_uid, count, model)]


def _quantity(text: str) -> tuple[int, str]:
    """``"80Gi"`` -> ``(80, "Gi")``: the models' memory is a whole number with a binary suffix."""
    digits = text.rstrip("KMGTPEi")
    return int(digits), text[len(digits):]


def _counters(memory: tuple[int, str], compute: int) -> dict[str, Any]:
    return {"memory": {"value": f"{memory[0]}{memory[1]}"}, "compute": {"value": str(compute)}}


def model_for_node(models: list[GpuModel], index: int) -> GpuModel:
    """Nodes get the models round-robin."""
    return models[index % len(models)]


TAINT_EFFECTS = ("None", "NoSchedule", "NoExecute")


def set_device_taint(devices: list[dict[str, Any]], device: str, key: str, value: str = "",
                     effect: str = "NoSchedule") -> list[dict[str, Any]]:
    """The slice's devices with ``key=value:effect`` on ``device``, as NVIDIA's driver taints a GPU.

    Like NVIDIA's driver it keeps one taint per key (the latest value wins, the history is lost) and leaves
    ``timeAdded`` for the apiserver to set; the same taint again (key, value and effect) changes nothing, so its
    ``timeAdded`` stays, as the kubelet plugin helper's slice controller keeps it (``DevicesDeepEqual``).
    """
    if effect not in TAINT_EFFECTS:
        raise LabConfigError(f"taint effect {effect!r} is not one of {', '.join(TAINT_EFFECTS)}")
    if not key:
        raise LabConfigError("a taint needs a key, e.g. --key gpu.nvidia.com/xid")

    def change(taints: list[dict[str, Any]]) -> list[dict[str, Any]]:
        same = [t for t in taints if t.get("key") == key]
        if same and (same[0].get("value") or "", same[0].get("effect")) == (value, effect):
            return taints
        taint: dict[str, Any] = {"key": key, "effect": effect, **({"value": value} if value else {})}
        return [*(t for t in taints if t.get("key") != key), taint]

    return _with_taints(devices, device, change)


def remove_device_taint(devices: list[dict[str, Any]], device: str, key: str) -> list[dict[str, Any]]:
    """The slice's devices without the taint ``key`` on ``device`` (as the driver does on restart)."""
    return _with_taints(devices, device, lambda taints: [t for t in taints if t.get("key") != key])


def _with_taints(devices: list[dict[str, Any]], device: str,
                 change: Callable[[list[dict[str, Any]]], list[dict[str, Any]]]) -> list[dict[str, Any]]:
    if not any(d.get("name") == device for d in devices):
        names = ", ".join(str(d.get("name")) for d in devices)
        raise LabConfigError(f"the slice has no device {device!r}; it has {names}")
    result = []
    for item in devices:
        if item.get("name") != device:
            result.append(item)
            continue
        taints = change(list(item.get("taints") or []))
        result.append({**{k: v for k, v in item.items() if k != "taints"}, **({"taints": taints} if taints else {})})
    return result
