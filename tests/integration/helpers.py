"""Small helpers the integration tests share: polling and object builders."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from kubernetes import client
from kubernetes.client.exceptions import ApiException

T = TypeVar("T")


def wait_for(what: str, probe: Callable[[], T | None], timeout: float = 60.0, interval: float = 0.5) -> T:
    """Poll ``probe`` until it returns something truthy; fail with ``what`` otherwise."""
    deadline = time.monotonic() + timeout
    last: T | None = None
    while time.monotonic() < deadline:
        last = probe()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what} (last: {last!r})")


TAINT_RULE_VERSIONS = ("v1", "v1beta2", "v1alpha3")


def taint_rule_version(api: client.ApiClient) -> str | None:
    """The newest resource.k8s.io version that serves DeviceTaintRule in this lab (discovery), or None."""
    for version in TAINT_RULE_VERSIONS:
        try:
            resources = client.CustomObjectsApi(api).get_api_resources("resource.k8s.io", version).resources
        except ApiException as exc:
            if exc.status == 404:
                continue
            raise
        if any(r.name == "devicetaintrules" for r in resources):
            return version
    return None


def delete_namespace(api: client.ApiClient, name: str) -> None:
    try:
        client.CoreV1Api(api).delete_namespace(name)
    except ApiException as exc:
        if exc.status != 404:
            raise


def gpu_claim_spec(device_class: str = "gpu.example.com") -> dict[str, Any]:
    return {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": device_class}}]}}


def pod_with_claims(name: str, pod_claims: list[dict[str, Any]], containers: list[list[str]] | None = None
                    ) -> dict[str, Any]:
    """A pod whose containers use the named pod claims; by default one container uses all of them."""
    claim_names = [c["name"] for c in pod_claims]
    containers = containers if containers is not None else [claim_names]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "terminationGracePeriodSeconds": 0,
            "containers": [{"name": f"ctr{i}", "image": "registry.example/busybox:1",
                            "resources": {"claims": [{"name": n} for n in names]}}
                           for i, names in enumerate(containers)],
            "resourceClaims": pod_claims,
        },
    }


def kubectl(lab_bin_dir: str, kubeconfig: str, *args: str) -> str:
    return subprocess.run([f"{lab_bin_dir}/kubectl", f"--kubeconfig={kubeconfig}", *args],
                          capture_output=True, text=True, check=True).stdout


def claim_states(lab_bin_dir: str, kubeconfig: str, namespace: str) -> dict[str, str]:
    """NAME -> STATE as `kubectl get resourceclaims` prints them."""
    out = kubectl(lab_bin_dir, kubeconfig, "get", "resourceclaims", "-n", namespace, "--no-headers")
    return {line.split()[0]: line.split()[1] for line in out.splitlines() if line.strip()}


def template(name: str, spec: dict[str, Any] | None = None, labels: dict[str, str] | None = None,
             annotations: dict[str, str] | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {}
    if labels:
        meta["labels"] = labels
    if annotations:
        meta["annotations"] = annotations
    body: dict[str, Any] = {"spec": spec or gpu_claim_spec()}
    if meta:
        body["metadata"] = meta
    return {"metadata": {"name": name}, "spec": body}


def create_pods(api: client.ApiClient, namespace: str, bodies: list[dict[str, Any]], workers: int = 8) -> None:
    """Create many pods concurrently (the sync client is thread-safe)."""
    core = client.CoreV1Api(api)
    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(lambda body: core.create_namespaced_pod(namespace, body=body), bodies))


def delete_pods(api: client.ApiClient, namespace: str, names: list[str], workers: int = 8) -> None:
    core = client.CoreV1Api(api)
    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(lambda name: core.delete_namespaced_pod(name, namespace, grace_period_seconds=0), names))


def stop_process(proc: subprocess.Popen[Any], timeout: float) -> int:
    """SIGTERM, then SIGKILL after ``timeout`` seconds; returns the exit code."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return int(proc.returncode)
