"""Benchmark (issue 21's target): 1,000 devices' driver taints at once -> their signal records.

A lab of `--nodes` kwok nodes of 128 GPUs each (8 nodes: 1,024 devices, the device-taints preset), a
Shadow HealthPolicy on the taint key (so nothing is evicted or quarantined: what is measured is the
signals' path), and one slice patch per node that taints all its devices at once. Measured:

- per device, from its slice's patch to its signal record first seen with the observation (a LIST every
  0.5 s, so each latency is up to 0.5 s late): p50, p99, max, and the time until all are there;
- claimwarden's writes per signal record over the whole run, from the apiserver's audit log (``audit_all``):
  the most and the total; and that no record is written again once all are there (no write loop).

    .venv/bin/python bench/signals_burst.py [--nodes 8]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from kubernetes import client, config

from claimwarden_lab import cluster
from claimwarden_lab.processes import free_port

ROOT = Path(__file__).resolve().parents[1]
KEY = "gpu.example.com/xid"
POLICY = {"apiVersion": "claimwarden.io/v1alpha1", "kind": "HealthPolicy", "metadata": {"name": "burst"},
          "spec": {"drivers": ["gpu.example.com"], "rules": [
              {"name": "xid", "source": "DriverTaint", "signal": KEY, "effect": "NoExecute", "mode": "Shadow"}]}}


def _percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def _signal_records(objects: client.CustomObjectsApi) -> dict[str, dict[str, Any]]:
    items = objects.list_cluster_custom_object("claimwarden.io", "v1alpha1", "unhealthydevices")["items"]
    return {r["metadata"]["name"]: r for r in items if (r.get("spec") or {}).get("source") == "signals"
            and (r.get("status") or {}).get("observations")}


def _writes(audit_log: Path, since: str) -> Counter[str]:
    counts: Counter[str] = Counter()
    for line in audit_log.read_text().splitlines():
        entry = json.loads(line)
        ref = entry.get("objectRef") or {}
        if entry.get("stage") != "ResponseComplete" or ref.get("resource") != "unhealthydevices":
            continue
        if entry.get("verb") in ("create", "patch", "update", "delete") and \
                "claimwarden" in (entry.get("userAgent") or "") and entry["requestReceivedTimestamp"] >= since:
            counts[ref.get("name") or ""] += 1
    return counts


def measure(nodes: int, directory: Path) -> dict[str, Any]:
    options = cluster.LabOptions(dir=directory / "lab", nodes=nodes, gpus_per_node=128, presets="device-taints",
                                 audit_all=True)
    state = cluster.up(options, say=lambda line: print(f"lab: {line}"))
    operator = None
    try:
        kubectl = [f"{state.bin_dir}/kubectl", f"--kubeconfig={state.kubeconfig}"]
        subprocess.run([*kubectl, "apply", "-k", str(ROOT / "crds")], check=True, capture_output=True)
        subprocess.run([*kubectl, "wait", "--for=condition=Established", "--timeout=60s",
                        "crd/unhealthydevices.claimwarden.io", "crd/healthpolicies.claimwarden.io"],
                       check=True, capture_output=True)
        log = (directory / "claimwarden.log").open("wb")
        operator = subprocess.Popen(
            [sys.executable, "-m", "claimwarden", "run", "--kubeconfig", str(state.kubeconfig),
             "--leader-elect=false", "--metrics-port", str(free_port()),
             "--liveness", f"http://127.0.0.1:{free_port()}/healthz"],
            stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONPATH": str(ROOT / "operator")})
        api = config.new_client_from_config(config_file=str(state.kubeconfig))
        objects = client.CustomObjectsApi(api)
        objects.create_cluster_custom_object("claimwarden.io", "v1alpha1", "healthpolicies", POLICY)
        time.sleep(10)  # claimwarden up and its indices filled
        slices = objects.list_cluster_custom_object("resource.k8s.io", "v1", "resourceslices")["items"]
        devices = sum(len(s["spec"]["devices"]) for s in slices)
        since = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime())
        patched: dict[str, float] = {}
        started = time.monotonic()
        for slice_ in slices:
            for device in slice_["spec"]["devices"]:
                device["taints"] = [{"key": KEY, "value": "79", "effect": "NoSchedule"}]
            objects.patch_cluster_custom_object("resource.k8s.io", "v1", "resourceslices", slice_["metadata"]["name"],
                                                {"spec": {"devices": slice_["spec"]["devices"]}})
            patched[slice_["spec"]["pool"]["name"]] = time.monotonic()
        seen: dict[str, float] = {}
        deadline = started + 600
        while len(seen) < devices and time.monotonic() < deadline:
            for name, record in _signal_records(objects).items():
                seen.setdefault(name, time.monotonic() - patched[record["spec"]["pool"]])
            time.sleep(0.5)
        all_there = time.monotonic() - started
        writes_at_all = sum(_writes(state.audit_log, since).values())
        time.sleep(20)  # quiet: nothing should be written any more
        writes = _writes(state.audit_log, since)
        latencies = list(seen.values())
        return {"devices": devices, "records": len(seen), "all_there_s": round(all_there, 1),
                "p50_s": round(_percentile(latencies, 0.5), 2), "p99_s": round(_percentile(latencies, 0.99), 2),
                "max_s": round(max(latencies), 2), "writes_total": sum(writes.values()),
                "writes_max_per_record": max(writes.values()), "writes_after_all_there":
                    sum(writes.values()) - writes_at_all}
    finally:
        if operator is not None:
            operator.terminate()
            operator.wait(60)
        cluster.down(options.dir, say=lambda line: print(f"lab: {line}"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=8)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="signals-burst-") as directory:
        print(json.dumps(measure(args.nodes, Path(directory)), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
