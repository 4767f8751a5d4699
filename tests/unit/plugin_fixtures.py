"""Plain-dict clusters for the plugin's pure modules (and the explain benchmark)."""

from __future__ import annotations

from typing import Any

from claimwarden.plugin.snapshot import Snapshot

DRIVER = "gpu.example.com"
MODELS = (("H100", "80Gi"), ("A100", "40Gi"), ("L4", "24Gi"))
Obj = dict[str, Any]


def node(name: str, labels: Obj | None = None, taints: list[Obj] | None = None) -> Obj:
    return {"metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, **(labels or {})}},
            "spec": {"taints": taints or []}}


def slice_(node_name: str, model: str, memory: str, count: int = 8, taints: dict[int, list[Obj]] | None = None) -> Obj:
    return {"metadata": {"name": f"{node_name}-{DRIVER}-x"},
            "spec": {"driver": DRIVER, "nodeName": node_name,
                     "pool": {"name": node_name, "generation": 1, "resourceSliceCount": 1},
                     "devices": [{"name": f"gpu-{i}",
                                  "attributes": {"index": {"int": i}, "model": {"string": model},
                                                 "uuid": {"string": f"{node_name}-{i}"},
                                                 "driverVersion": {"version": "1.0.0"}},
                                  "capacity": {"memory": {"value": memory}},
                                  **({"taints": (taints or {})[i]} if i in (taints or {}) else {})}
                                 for i in range(count)]}}


def device_class(name: str = DRIVER, expression: str = f"device.driver == '{DRIVER}'") -> Obj:
    return {"metadata": {"name": name}, "spec": {"selectors": [{"cel": {"expression": expression}}]}}


def claim(name: str, requests: list[Obj], *, namespace: str = "ns", constraints: list[Obj] | None = None,
          allocated: list[tuple[str, str]] | None = None, reserved: list[str] | None = None,
          owner_pod: tuple[str, str] | None = None, labels: Obj | None = None) -> Obj:
    body: Obj = {"metadata": {"name": name, "namespace": namespace, "uid": f"uid-{name}", "labels": labels or {}},
                 "spec": {"devices": {"requests": requests, "constraints": constraints or []}}, "status": {}}
    if owner_pod:
        body["metadata"]["ownerReferences"] = [{"apiVersion": "v1", "kind": "Pod", "name": owner_pod[0],
                                                "uid": owner_pod[1], "controller": True}]
    if allocated:
        body["status"]["allocation"] = {"devices": {"results": [
            {"request": "gpu", "driver": DRIVER, "pool": pool, "device": device} for pool, device in allocated]}}
    if reserved:
        body["status"]["reservedFor"] = [{"resource": "pods", "name": p, "uid": f"uid-{p}"} for p in reserved]
    return body


def request(name: str = "gpu", selectors: list[str] | None = None, count: int = 1, **extra: Any) -> Obj:
    return {"name": name, "exactly": {"deviceClassName": DRIVER, "count": count,
                                      "selectors": [{"cel": {"expression": s}} for s in selectors or []], **extra}}


def pod(name: str, claims: list[str], *, namespace: str = "ns", node_name: str | None = None,
        phase: str = "Pending", created: str = "2026-01-01T00:00:00Z", **spec: Any) -> Obj:
    return {"metadata": {"name": name, "namespace": namespace, "uid": f"uid-{name}", "creationTimestamp": created},
            "spec": {"resourceClaims": [{"name": f"c{i}", "resourceClaimName": c} for i, c in enumerate(claims)],
                     **({"nodeName": node_name} if node_name else {}), **spec},
            "status": {"phase": phase}}


def cluster(nodes: int = 3, devices: int = 8) -> Snapshot:
    """`nodes` nodes with `devices` GPUs each; models H100, A100, L4 round-robin."""
    names = [f"node-{i}" for i in range(nodes)]
    return Snapshot(
        nodes=[node(n) for n in names],
        slices=[slice_(n, *MODELS[i % len(MODELS)], count=devices) for i, n in enumerate(names)],
        classes=[device_class()])
