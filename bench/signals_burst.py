"""Benchmark (issue 21's target): 1,000 devices' driver taints at once -> their signal records.

A lab of `--nodes` kwok nodes of 128 GPUs each (8 nodes: 1,024 devices, the device-taints preset), a
Shadow HealthPolicy on the taint key (so nothing is evicted or quarantined: what is measured is the
signals' path), and one slice patch per node that taints all its devices at once. Measured:

- per device, from its slice's patch to its signal record first seen with the observation (a LIST every
  0.5 s, so each latency is up to 0.5 s late): p50, p99, max, and the time until all are there;
- claimwarden's writes per signal record over the whole run, from the apiserver's audit log (``audit_all``):
  the most and the total; and that no record is written again once all are there (no write loop).

With ``--pods P`` the rule is Enforce NoExecute and P running pods hold one device each before the burst
(claimwarden makes their claims): the breaker must hold, so the evictions (successful ``pods/eviction``
creates by claimwarden in the audit log, until 40 s after all records are there) stay within its room, the
``--breaker-max-fraction`` (0.3) of the pods holding the driver's devices, at least ``--breaker-min-pods`` (8);
and the records' writes in the 20 s after that are counted apart (a write loop would show there).

    .venv/bin/python bench/signals_burst.py [--nodes 8] [--pods 1000]
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
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from kubernetes import client, config

from claimwarden.health import breaker
from claimwarden_lab import cluster
from claimwarden_lab.processes import free_port

ROOT = Path(__file__).resolve().parents[1]
KEY = "gpu.example.com/xid"
NAMESPACE = "burst"
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


def _evictions(audit_log: Path, since: str) -> int:
    """claimwarden's successful evictions (201) since `since`."""
    count = 0
    for line in audit_log.read_text().splitlines():
        if '"eviction"' not in line:
            continue
        entry = json.loads(line)
        ref = entry.get("objectRef") or {}
        if entry.get("stage") == "ResponseComplete" and ref.get("subresource") == "eviction" and \
                "claimwarden" in (entry.get("userAgent") or "") and entry["requestReceivedTimestamp"] >= since and \
                (entry.get("responseStatus") or {}).get("code") == 201:
            count += 1
    return count


def install_crds(state: cluster.LabState) -> None:
    """claimwarden's CRDs in the lab, established."""
    kubectl = [f"{state.bin_dir}/kubectl", f"--kubeconfig={state.kubeconfig}"]
    subprocess.run([*kubectl, "apply", "-k", str(ROOT / "crds")], check=True, capture_output=True)
    subprocess.run([*kubectl, "wait", "--for=condition=Established", "--timeout=60s",
                    "crd/unhealthydevices.claimwarden.io", "crd/healthpolicies.claimwarden.io"],
                   check=True, capture_output=True)


def create_gpu_pods(api: client.ApiClient, namespace: str, pods: int) -> None:
    """The namespace, a claim template `gpu` of one device, and `pods` pods using it (p0000, ...), 8 at a time."""
    core = client.CoreV1Api(api)
    core.create_namespace({"metadata": {"name": namespace}})
    client.ResourceV1Api(api).create_namespaced_resource_claim_template(namespace, {
        "metadata": {"name": "gpu"}, "spec": {"spec": {"devices": {"requests": [
            {"name": "gpu", "exactly": {"deviceClassName": "gpu.example.com"}}]}}}})

    def create(n: int) -> None:
        core.create_namespaced_pod(namespace, {"metadata": {"name": f"p{n:04d}"}, "spec": {
            "terminationGracePeriodSeconds": 0, "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "gpu"}],
            "containers": [{"name": "ctr0", "image": "registry.example/busybox:1",
                            "resources": {"claims": [{"name": "gpu"}]}}]}})

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(create, range(pods)))


def _run_pods(api: client.ApiClient, pods: int) -> int:
    """`pods` pods of one device each; returns how many run with a device (10 min at most)."""
    core = client.CoreV1Api(api)
    create_gpu_pods(api, NAMESPACE, pods)
    deadline, running = time.monotonic() + 600, 0
    while time.monotonic() < deadline:
        running = sum(1 for p in core.list_namespaced_pod(NAMESPACE).items if p.status.phase == "Running")
        if running >= pods:
            break
        time.sleep(2)
    return running


def measure(nodes: int, directory: Path, pods: int = 0) -> dict[str, Any]:
    options = cluster.LabOptions(dir=directory / "lab", nodes=nodes, gpus_per_node=128, presets="device-taints",
                                 audit_all=True)
    state = cluster.up(options, say=lambda line: print(f"lab: {line}"))
    operator = None
    try:
        install_crds(state)
        log = (directory / "claimwarden.log").open("wb")
        operator = subprocess.Popen(
            [sys.executable, "-m", "claimwarden", "run", "--kubeconfig", str(state.kubeconfig),
             "--leader-elect=false", "--metrics-port", str(free_port()),
             "--liveness", f"http://127.0.0.1:{free_port()}/healthz"],
            stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONPATH": str(ROOT / "operator")})
        api = config.new_client_from_config(config_file=str(state.kubeconfig))
        objects = client.CustomObjectsApi(api)
        policy = json.loads(json.dumps(POLICY))
        if pods:
            policy["spec"]["rules"][0]["mode"] = "Enforce"
        objects.create_cluster_custom_object("claimwarden.io", "v1alpha1", "healthpolicies", policy)
        time.sleep(10)  # claimwarden up and its indices filled
        running = _run_pods(api, pods) if pods else 0
        if pods:
            time.sleep(10)  # the claims' and reservations' work settled
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
        evicted = {}
        if pods:
            time.sleep(40)  # the evictions the breaker allows, and no more
            evicted = {"pods_running_before": running, "breaker_room": breaker.Settings().limit(running),
                       "evicted": _evictions(state.audit_log, since), "pods_left": sum(
                           1 for p in client.CoreV1Api(api).list_namespaced_pod(NAMESPACE).items
                           if p.metadata.deletion_timestamp is None)}
        settled = sum(_writes(state.audit_log, since).values())
        time.sleep(20)  # quiet: nothing should be written any more
        writes = _writes(state.audit_log, since)
        latencies = list(seen.values())
        if pods:
            evicted["writes_in_the_last_20_s"] = sum(writes.values()) - settled
        return {**evicted, "devices": devices, "records": len(seen), "all_there_s": round(all_there, 1),
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
    parser.add_argument("--pods", type=int, default=0,
                        help="running pods of one device each; with them the rule is Enforce NoExecute")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="signals-burst-") as directory:
        print(json.dumps(measure(args.nodes, Path(directory), args.pods), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
