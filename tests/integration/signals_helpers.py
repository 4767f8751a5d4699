"""HealthPolicies, driver taints, KEP-4680 pod health and signal records in the lab (issue 21)."""

from __future__ import annotations

import copy
import json
from datetime import datetime
from pathlib import Path
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from claimwarden.health.records import DeviceRef
from claimwarden.signals.records import signal_record_name
from claimwarden.timestamps import parse_rfc3339

from .health_helpers import GROUP, PLURAL, VERSION, device_of, slice_of
from .helpers import pod_with_claims, wait_for

DRIVER = "gpu.example.com"
POLICIES = "healthpolicies"
XID = f"{DRIVER}/xid"


def rule(name: str, source: str, signal: str, *, effect: str = "NoExecute", mode: str = "Enforce",
         values: list[str] | None = None, **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"name": name, "source": source, "signal": signal, "effect": effect, "mode": mode}
    if values:
        body["values"] = values
    return {**body, **extra}


def apply_policy(api: client.ApiClient, name: str, rules: list[dict[str, Any]], **spec: Any) -> None:
    body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "HealthPolicy", "metadata": {"name": name},
            "spec": {"drivers": [DRIVER], "rules": rules, **spec}}
    client.CustomObjectsApi(api).create_cluster_custom_object(GROUP, VERSION, POLICIES, body)


def delete_policy(api: client.ApiClient, name: str) -> None:
    try:
        client.CustomObjectsApi(api).delete_cluster_custom_object(GROUP, VERSION, POLICIES, name)
    except ApiException as exc:
        if exc.status != 404:
            raise


def record_name(pool: str, device: str) -> str:
    return signal_record_name(DeviceRef(DRIVER, pool, device))


def signal_record(api: client.ApiClient, pool: str, device: str) -> dict[str, Any] | None:
    try:
        found: dict[str, Any] = client.CustomObjectsApi(api).get_cluster_custom_object(
            GROUP, VERSION, PLURAL, record_name(pool, device))
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise
    return found


def observed_record(api: client.ApiClient, pool: str, device: str) -> dict[str, Any]:
    """The device's signal record once its status holds observations (created first, its status written next)."""
    return wait_for("the signal record with its observations", lambda: (
        r if (r := signal_record(api, pool, device)) and (r.get("status") or {}).get("observations") else None))


def delete_signal_record(api: client.ApiClient, pool: str, device: str) -> None:
    try:
        client.CustomObjectsApi(api).delete_cluster_custom_object(GROUP, VERSION, PLURAL, record_name(pool, device))
    except ApiException as exc:
        if exc.status != 404:
            raise


def set_taints(api: client.ApiClient, node: str, device: str, taints: list[dict[str, Any]]) -> None:
    """The device's spec.devices[].taints as a driver publishes them (the list is atomic: all devices go back)."""
    objects = client.CustomObjectsApi(api)
    name = slice_of(api, node)
    current = objects.get_cluster_custom_object("resource.k8s.io", "v1", "resourceslices", name)
    devices = copy.deepcopy(current["spec"]["devices"])
    for entry in devices:
        if entry["name"] == device:
            if taints:
                entry["taints"] = taints
            else:
                entry.pop("taints", None)
    objects.patch_cluster_custom_object("resource.k8s.io", "v1", "resourceslices", name,
                                        {"metadata": {"resourceVersion": current["metadata"]["resourceVersion"]},
                                         "spec": {"devices": devices}})


def set_pod_health(api: client.ApiClient, namespace: str, pod: str, pool: str, device: str, health: str,
                   *, claim: str = "gpu", request: str | None = None, container: str = "ctr0") -> None:
    """KEP-4680 health of the pod's device, written through pods/status as the kubelet would (the name is
    claim:<pod claim>[/<request>], as the container's resources.claims entry names it)."""
    body = {"status": {"containerStatuses": [{"name": container, "allocatedResourcesStatus": [{
        "name": f"claim:{claim}" + (f"/{request}" if request else ""),
        "resources": [{"resourceID": f"{DRIVER}/{pool}/{device}", "health": health}]}]}]}}
    client.CoreV1Api(api).patch_namespaced_pod_status(pod, namespace, body, _preload_content=False)


def decision(record: dict[str, Any] | None) -> dict[str, Any]:
    return dict(((record or {}).get("status") or {}).get("decision") or {})


def counter(text: str, series: str) -> float:
    """The value of one exposition line (0 when absent)."""
    for line in text.splitlines():
        if line.startswith(series + " "):
            return float(line.split()[-1])
    return 0.0


def counter_sum(text: str, name: str, *labels: str) -> float:
    """The sum of a metric's samples whose line carries every one of `labels` (like 'mode="Shadow"')."""
    total = 0.0
    for line in text.splitlines():
        if (line.startswith(name + "{") or line.startswith(name + " ")) and all(label in line for label in labels):
            total += float(line.split()[-1])
    return total


def run_pod(api: client.ApiClient, namespace: str, pod: str) -> tuple[str, str]:
    """A pod with one GPU from the namespace's template single-gpu, running; returns its (pool, device)."""
    core = client.CoreV1Api(api)
    core.create_namespaced_pod(namespace, body=pod_with_claims(
        pod, [{"name": "gpu", "resourceClaimTemplateName": "single-gpu"}]))
    wait_for(f"{pod} Running", lambda: core.read_namespaced_pod(pod, namespace).status.phase == "Running")
    return device_of(api, namespace, pod)


def record_writes(audit_log: Path, pool: str, device: str, since: datetime) -> list[str]:
    """claimwarden's writes to the device's signal record since `since`, from the lab apiserver's audit log:
    'verb[/subresource]'. (The lab is shared by the signals tests, and a device's record has the same name in
    each: an earlier test's record of the device is not this one's.)"""
    name, found = record_name(pool, device), []
    for line in audit_log.read_text().splitlines():
        entry = json.loads(line)
        ref = entry.get("objectRef") or {}
        if entry.get("stage", "ResponseComplete") != "ResponseComplete" or ref.get("resource") != PLURAL:
            continue
        received = parse_rfc3339(entry.get("requestReceivedTimestamp"))
        if received is None or received < since:
            continue
        if ref.get("name") == name and "claimwarden" in (entry.get("user") or {}).get("username", "") and \
                entry.get("verb") in ("create", "patch", "update", "delete"):
            found.append(entry["verb"] + (f"/{ref['subresource']}" if ref.get("subresource") else ""))
    return found
