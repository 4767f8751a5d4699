"""Benchmark: how fast claimwarden empties deliberately marked devices, 1,000 pods by default.

A fresh lab (10 nodes x 100 devices), 1,000 pods with one device each, then every device in use
marked in one patch per slice. Measured: seconds from the marks to every pod evicted (terminating
or gone), and to the records counting them all. The breaker and the budget are what the target is
*not* about, so by default they are off; pass other settings to see what they cost:

    .venv/bin/python bench/eviction_throughput.py                       # --breaker-max-fraction=1 --eviction-qps=0
    .venv/bin/python bench/eviction_throughput.py --claimwarden-args="--breaker-max-fraction=1"  # default budget
"""

from __future__ import annotations

import argparse
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from kubernetes import client, config

from claimwarden_lab import cluster
from claimwarden_lab.processes import free_port

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_ARGS = "--breaker-max-fraction=1 --eviction-qps=0"
NAMESPACE = "bench"


def _pod(name: str) -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": {
        "containers": [{"name": "c", "image": "x", "resources": {"claims": [{"name": "gpu"}]}}],
        "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "gpu"}]}}


def _until(what: str, probe: Callable[[], bool], timeout: float, interval: float = 0.1) -> None:
    deadline = time.monotonic() + timeout
    while not probe():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=10)
    parser.add_argument("--gpus-per-node", type=int, default=100)
    parser.add_argument("--pods", type=int, default=1000)
    parser.add_argument("--claimwarden-args", default=DEFAULT_ARGS)
    args = parser.parse_args()
    extra = shlex.split(args.claimwarden_args)
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp) / "lab"
        state = cluster.up(cluster.LabOptions(dir=directory, nodes=args.nodes, gpus_per_node=args.gpus_per_node),
                           say=lambda _: None)
        operator = None
        try:
            kubectl = [f"{state.bin_dir}/kubectl", f"--kubeconfig={state.kubeconfig}"]
            for kustomization in ("crds", "manifests/approval"):
                subprocess.run([*kubectl, "apply", "-k", str(ROOT / kustomization)], check=True, capture_output=True)
            subprocess.run([*kubectl, "wait", "--for=condition=Established", "--timeout=60s",
                            "crd/unhealthydevices.claimwarden.io"], check=True, capture_output=True)
            log = (Path(tmp) / "claimwarden.log").open("wb")
            operator = subprocess.Popen(
                [sys.executable, "-m", "claimwarden", "run", "--kubeconfig", str(state.kubeconfig),
                 "--metrics-port", str(free_port()), "--liveness", f"http://127.0.0.1:{free_port()}/healthz",
                 *extra], stdout=log, stderr=subprocess.STDOUT)
            time.sleep(5)
            with config.new_client_from_config(config_file=str(state.kubeconfig)) as api:
                _run(api, args.pods, extra)
        finally:
            if operator is not None:
                operator.terminate()
                operator.wait(30)
            cluster.down(directory, say=lambda _: None)


def _run(api: client.ApiClient, pods: int, extra: list[str]) -> None:
    core, resource = client.CoreV1Api(api), client.ResourceV1Api(api)
    objects = client.CustomObjectsApi(api)
    core.create_namespace(body={"metadata": {"name": NAMESPACE}})
    resource.create_namespaced_resource_claim_template(NAMESPACE, body={
        "metadata": {"name": "gpu"}, "spec": {"spec": {"devices": {"requests": [
            {"name": "gpu", "exactly": {"deviceClassName": "gpu.example.com"}}]}}}})
    started = time.monotonic()
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda i: core.create_namespaced_pod(NAMESPACE, body=_pod(f"pod-{i:04d}")), range(pods)))
    _until(f"{pods} pods running", lambda: sum(
        p.status.phase == "Running" for p in core.list_namespaced_pod(NAMESPACE).items) == pods, 900, 1)
    print(f"set-up: {pods} pods running after {time.monotonic() - started:.0f} s", flush=True)

    held: dict[str, set[str]] = {}
    for claim in resource.list_namespaced_resource_claim(NAMESPACE).items:
        result = claim.status.allocation.devices.results[0]
        held.setdefault(result.pool, set()).add(result.device)
    slices = {s.spec.pool.name: s.metadata.name for s in resource.list_resource_slice().items}

    marked = time.monotonic()
    for pool, devices in held.items():
        resource.patch_resource_slice(slices[pool], {"metadata": {"annotations": {
            f"unhealthy.claimwarden.io/{device}": "benchmark: deliberately marked" for device in devices}}})
    marking = time.monotonic() - marked

    def all_evicted() -> bool:
        return all(p.metadata.deletion_timestamp for p in core.list_namespaced_pod(NAMESPACE).items)

    _until("every pod evicted", all_evicted, 900, 0.2)
    evicted = time.monotonic() - marked

    def counted() -> bool:
        items = objects.list_cluster_custom_object("claimwarden.io", "v1alpha1", "unhealthydevices")["items"]
        return sum(int((r.get("status") or {}).get("podsEvicted") or 0) for r in items) >= pods

    _until("the records counting every eviction", counted, 900, 0.5)
    recorded = time.monotonic() - marked
    settings = " ".join(extra) or "(claimwarden's defaults)"
    print(f"claimwarden {settings}: {pods} pods on {sum(map(len, held.values()))} marked devices "
          f"({len(held)} slices, marking took {marking:.2f} s)", flush=True)
    print(f"  every pod evicted {evicted:.2f} s after the first mark; every eviction counted in the records "
          f"after {recorded:.2f} s", flush=True)


if __name__ == "__main__":
    main()
