"""How long `explain` takes per claim on a big cluster: the pure funnel and search, in-process.

A synthetic snapshot of --nodes nodes x --devices GPUs (H100, A100, L4 round-robin), half of
them held by running pods' claims, then one pending pod per case: allocatable, blocked by a
selector, blocked by count, blocked by a matchAttribute constraint, blocked by a CEL error. Each
case builds a fresh evaluator (nothing cached between claims). Target: <= 1 s per claim at 500 x 8.

    .venv/bin/python bench/explain_speed.py [--nodes 500] [--devices 8] [--repeat 3]
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

from claimwarden.plugin.explain import explain_pod
from claimwarden.plugin.snapshot import Snapshot

DRIVER = "gpu.example.com"
MODELS = (("H100", "80Gi"), ("A100", "40Gi"), ("L4", "24Gi"))
MODEL = 'device.attributes["gpu.example.com"].model == "{}"'


def snapshot(nodes: int, devices: int) -> Snapshot:
    names = [f"node-{i}" for i in range(nodes)]
    slices, claims = [], []
    for i, name in enumerate(names):
        model, memory = MODELS[i % len(MODELS)]
        slices.append({"metadata": {"name": f"{name}-slice"}, "spec": {
            "driver": DRIVER, "nodeName": name, "pool": {"name": name, "generation": 1, "resourceSliceCount": 1},
            "devices": [{"name": f"gpu-{d}", "attributes": {"index": {"int": d}, "model": {"string": model},
                                                             "driverVersion": {"version": "1.0.0"}},
                         "capacity": {"memory": {"value": memory}}} for d in range(devices)]}})
        held = [{"request": "gpu", "driver": DRIVER, "pool": name, "device": f"gpu-{d}"} for d in range(devices // 2)]
        claims.append({"metadata": {"name": f"held-{i}", "namespace": "work", "uid": f"u{i}"},
                       "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                           "deviceClassName": DRIVER, "count": len(held)}}]}},
                       "status": {"allocation": {"devices": {"results": held}},
                                  "reservedFor": [{"resource": "pods", "name": f"job-{i}", "uid": f"p{i}"}]}})
    return Snapshot(
        nodes=[{"metadata": {"name": n, "labels": {"kubernetes.io/hostname": n}}, "spec": {}} for n in names],
        slices=slices, claims=claims,
        classes=[{"metadata": {"name": DRIVER},
                  "spec": {"selectors": [{"cel": {"expression": f"device.driver == '{DRIVER}'"}}]}}])


def case(name: str, selectors: list[str], count: int, constraints: list[Any] | None = None) -> tuple[str, Any, Any]:
    claim = {"metadata": {"name": name, "namespace": "bench", "uid": name},
             "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                 "deviceClassName": DRIVER, "count": count,
                 "selectors": [{"cel": {"expression": s}} for s in selectors]}}],
                 "constraints": constraints or []}}, "status": {}}
    pod = {"metadata": {"name": name, "namespace": "bench", "uid": f"pod-{name}"},
           "spec": {"resourceClaims": [{"name": "gpu", "resourceClaimName": name}]}, "status": {"phase": "Pending"}}
    return name, claim, pod


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=500)
    parser.add_argument("--devices", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    cases = [
        case("allocatable-l4", [MODEL.format("L4")], 2),
        case("blocked-selector", [MODEL.format("B100")], 1),
        case("blocked-count", [], args.devices // 2 + 1),
        case("blocked-constraint", ['device.capacity["gpu.example.com"].memory.compareTo(quantity("32Gi")) > 0'], 2,
             [{"matchAttribute": f"{DRIVER}/index"}]),
        case("blocked-cel-error", ['device.attributes["gpu.example.com"].nope == 1'], 1),
    ]
    print(f"explain on {args.nodes} nodes x {args.devices} devices ({args.nodes * args.devices} devices, "
          f"{args.nodes} claims holding half of them)")
    worst = 0.0
    for name, claim, pod in cases:
        times = []
        for _ in range(args.repeat):
            snap = snapshot(args.nodes, args.devices)
            snap.claims.append(claim)
            snap.pods.append(pod)
            start = time.perf_counter()
            explanation = explain_pod(snap, pod)
            times.append(time.perf_counter() - start)
        median = statistics.median(times)
        worst = max(worst, median)
        print(f"  {name:20} {median * 1000:7.0f} ms per claim   {explanation.verdict.reason[:90]}")
    print(f"slowest case: {worst * 1000:.0f} ms per claim (target: <= 1000 ms)")


if __name__ == "__main__":
    main()
