"""Benchmark: how fast claims are generated for N pods, claimwarden against kube-controller-manager.

Both run in one invocation, each in its own fresh lab, on the same machine, so the ratio is more
telling than either number. The template asks for a device no lab node has, so pods never
schedule and only claim generation (create + pod status write) is measured.

    .venv/bin/python bench/claims_vs_upstream.py [--pods 300]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from kubernetes import client, config

from claimwarden_lab import cluster
from claimwarden_lab.processes import free_port

UNSATISFIABLE = {"devices": {"requests": [{"name": "gpu", "exactly": {
    "deviceClassName": "gpu.example.com",
    "selectors": [{"cel": {"expression": "device.attributes['gpu.example.com'].model == 'none'"}}]}}]}}


def _pod(name: str) -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": {
        "containers": [{"name": "c", "image": "x", "resources": {"claims": [{"name": "gpu"}]}}],
        "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "gpu"}]}}


def _measure(state: cluster.LabState, pods: int) -> float:
    """Seconds from the first pod created to every pod's claim recorded in its status."""
    with config.new_client_from_config(config_file=str(state.kubeconfig)) as api:
        core, resource = client.CoreV1Api(api), client.ResourceV1Api(api)
        core.create_namespace(body={"metadata": {"name": "bench"}})
        resource.create_namespaced_resource_claim_template("bench", body={
            "metadata": {"name": "gpu"}, "spec": {"spec": UNSATISFIABLE}})
        started = time.monotonic()
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda i: core.create_namespaced_pod("bench", body=_pod(f"pod-{i:04d}")), range(pods)))
        while True:
            listed = core.list_namespaced_pod("bench").items
            done = sum(1 for p in listed if p.status.resource_claim_statuses)
            if done == pods:
                return time.monotonic() - started
            if time.monotonic() - started > 600:
                raise SystemExit(f"only {done} of {pods} pods got claims in 600 s")
            time.sleep(0.2)


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--pods", type=int, default=300)
    args = parser.parse_args()
    results: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, upstream in (("claimwarden", False), ("kube-controller-manager", True)):
            directory = Path(tmp) / name
            state = cluster.up(cluster.LabOptions(dir=directory, upstream_claims=upstream), say=lambda _: None)
            operator = None
            try:
                if not upstream:
                    operator = subprocess.Popen(
                        [sys.executable, "-m", "claimwarden", "run", "--kubeconfig", str(state.kubeconfig),
                         "--controllers", "claims,reservations", "--metrics-port", str(free_port()),
                         "--liveness", f"http://127.0.0.1:{free_port()}/healthz"],
                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                    time.sleep(5)
                results[name] = _measure(state, args.pods)
                rss = f", claimwarden RSS {_rss_mib(operator.pid):.0f} MiB" if operator else ""
                print(f"{name:<24} {args.pods} pods -> claims in {results[name]:6.2f} s "
                      f"({args.pods / results[name]:6.1f} pods/s){rss}", flush=True)
            finally:
                if operator is not None:
                    operator.terminate()
                    operator.wait(30)
                cluster.down(directory, say=lambda _: None)
    ratio = results["claimwarden"] / results["kube-controller-manager"]
    print(f"claimwarden / kube-controller-manager time ratio: {ratio:.2f} (lower is faster)")


if __name__ == "__main__":
    main()
