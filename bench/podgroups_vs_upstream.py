"""Benchmark: N pods of one PodGroup sharing one claim, claimwarden against kube-controller-manager.

Both run in one invocation, each in its own fresh Kubernetes 1.37 lab with the PodGroup gates (one
node, one device: every pod shares the group's one claim), so the ratio is more telling than either
number. Measured: seconds from the first pod created to every pod Running, and claims created.

    .venv/bin/python bench/podgroups_vs_upstream.py [--pods 1000] [--upstream-first]
"""

from __future__ import annotations

import argparse
import json
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

USES = [{"name": "gpu", "resourceClaimTemplateName": "gpu"}]


def _pod(name: str) -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": {
        "terminationGracePeriodSeconds": 0, "schedulingGroup": {"podGroupName": "team"},
        "containers": [{"name": "c", "image": "x", "resources": {"claims": [{"name": "gpu"}]}}],
        "resourceClaims": USES}}


def _measure(state: cluster.LabState, pods: int) -> tuple[float, int, int]:
    """(seconds to all pods Running, claims in the namespace, reservedFor entries of the claim)."""
    with config.new_client_from_config(config_file=str(state.kubeconfig)) as api:
        core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
        core.create_namespace(body={"metadata": {"name": "bench"}})
        client.ResourceV1Api(api).create_namespaced_resource_claim_template("bench", body={
            "metadata": {"name": "gpu"}, "spec": {"spec": {"devices": {"requests": [
                {"name": "gpu", "exactly": {"deviceClassName": "gpu.example.com"}}]}}}})
        custom.create_namespaced_custom_object("scheduling.k8s.io", "v1beta1", "bench", "podgroups", {
            "apiVersion": "scheduling.k8s.io/v1beta1", "kind": "PodGroup", "metadata": {"name": "team"},
            "spec": {"schedulingPolicy": {"basic": {}}, "resourceClaims": USES}})
        started = time.monotonic()
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda i: core.create_namespaced_pod("bench", body=_pod(f"pod-{i:04d}")), range(pods)))
        while True:
            listed = json.loads(core.list_namespaced_pod("bench", _preload_content=False).data)["items"]
            running = sum(1 for p in listed if (p.get("status") or {}).get("phase") == "Running")
            if running == pods:
                elapsed = time.monotonic() - started
                break
            if time.monotonic() - started > 900:
                raise SystemExit(f"only {running} of {pods} pods running after 900 s")
            time.sleep(1)
        claims = custom.list_namespaced_custom_object("resource.k8s.io", "v1", "bench", "resourceclaims")["items"]
        reserved = sum(len((c.get("status") or {}).get("reservedFor") or []) for c in claims)
        return elapsed, len(claims), reserved


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--pods", type=int, default=1000)
    parser.add_argument("--upstream-first", action="store_true", help="measure kube-controller-manager first")
    args = parser.parse_args()
    runs = [("claimwarden", False), ("kube-controller-manager", True)]
    results: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, upstream in reversed(runs) if args.upstream_first else runs:
            directory = Path(tmp) / name
            state = cluster.up(cluster.LabOptions(
                dir=directory, upstream_claims=upstream, kubernetes="1.37", nodes=1, gpus_per_node=1,
                presets="podgroups"), say=lambda _: None)
            operator = None
            try:
                if not upstream:
                    operator = subprocess.Popen(
                        [sys.executable, "-m", "claimwarden", "run", "--kubeconfig", str(state.kubeconfig),
                         "--controllers", "claims,reservations", "--metrics-port", str(free_port()),
                         "--liveness", f"http://127.0.0.1:{free_port()}/healthz"],
                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                    time.sleep(5)
                elapsed, claims, reserved = _measure(state, args.pods)
                results[name] = elapsed
                print(f"{name:<24} {args.pods} pods of one PodGroup running in {elapsed:6.1f} s "
                      f"({args.pods / elapsed:5.1f} pods/s); {claims} claim(s), {reserved} reservedFor entr(ies)",
                      flush=True)
            finally:
                if operator is not None:
                    operator.terminate()
                    operator.wait(30)
                cluster.down(directory, say=lambda _: None)
    ratio = results["claimwarden"] / results["kube-controller-manager"]
    print(f"claimwarden / kube-controller-manager time ratio: {ratio:.2f} (lower is faster)")


if __name__ == "__main__":
    main()
