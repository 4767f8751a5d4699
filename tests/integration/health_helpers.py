"""Marking devices and reading UnhealthyDevice records in the lab."""

from __future__ import annotations

from typing import Any

from kubernetes import client

from .helpers import wait_for

GROUP, VERSION, PLURAL = "claimwarden.io", "v1alpha1", "unhealthydevices"
PREFIX = "unhealthy.claimwarden.io/"


def slice_of(api: client.ApiClient, node: str) -> str:
    slices = client.ResourceV1Api(api).list_resource_slice().items
    return next(s.metadata.name for s in slices if s.spec.node_name == node)


def annotate(api: client.ApiClient, slice_name: str, annotations: dict[str, str | None]) -> None:
    client.ResourceV1Api(api).patch_resource_slice(slice_name, {"metadata": {"annotations": annotations}})


def mark(api: client.ApiClient, node: str, device: str, reason: str) -> str:
    """Annotate the device unhealthy as a user would; returns the slice name."""
    name = slice_of(api, node)
    annotate(api, name, {PREFIX + device: reason})
    return name


def unmark(api: client.ApiClient, node: str, device: str) -> None:
    annotate(api, slice_of(api, node), {PREFIX + device: None})


def records(api: client.ApiClient) -> list[dict[str, Any]]:
    items = client.CustomObjectsApi(api).list_cluster_custom_object(GROUP, VERSION, PLURAL)["items"]
    return list(items)


def record_for(api: client.ApiClient, pool: str, device: str) -> dict[str, Any] | None:
    return next((r for r in records(api) if (r["spec"]["pool"], r["spec"]["device"]) == (pool, device)), None)


def create_record(api: client.ApiClient, name: str, pool: str, device: str, effect: str, reason: str,
                  **extra: Any) -> dict[str, Any]:
    body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "UnhealthyDevice", "metadata": {"name": name},
            "spec": {"driver": "gpu.example.com", "pool": pool, "device": device, "effect": effect,
                     "reason": reason, **extra}}
    result: dict[str, Any] = client.CustomObjectsApi(api).create_cluster_custom_object(GROUP, VERSION, PLURAL, body)
    return result


def delete_record(api: client.ApiClient, name: str) -> None:
    client.CustomObjectsApi(api).delete_cluster_custom_object(GROUP, VERSION, PLURAL, name)


def device_of(api: client.ApiClient, namespace: str, pod: str) -> tuple[str, str]:
    """(node/pool, device) of the pod's first claim."""
    core, resource = client.CoreV1Api(api), client.ResourceV1Api(api)
    found = core.read_namespaced_pod(pod, namespace)
    entry = found.spec.resource_claims[0]
    name = entry.resource_claim_name or found.status.resource_claim_statuses[0].resource_claim_name
    result = resource.read_namespaced_resource_claim(name, namespace).status.allocation.devices.results[0]
    return result.pool, result.device


def holders(api: client.ApiClient, pool: str, device: str) -> list[str]:
    """Claims (namespace/name) allocated the device, quarantine claims included."""
    found = []
    for claim in client.ResourceV1Api(api).list_resource_claim_for_all_namespaces().items:
        allocation = claim.status.allocation if claim.status else None
        for result in allocation.devices.results if allocation else []:
            if (result.pool, result.device) == (pool, device):
                found.append(f"{claim.metadata.namespace}/{claim.metadata.name}")
    return found


def events(api: client.ApiClient, namespace: str, name: str, reason: str) -> list[Any]:
    items = client.CoreV1Api(api).list_namespaced_event(namespace, field_selector=f"involvedObject.name={name}").items
    return [e for e in items if e.reason == reason]


def wait_gone(api: client.ApiClient, namespace: str, pod: str, timeout: float = 60) -> None:
    core = client.CoreV1Api(api)

    def gone() -> bool:
        return not any(p.metadata.name == pod for p in core.list_namespaced_pod(namespace).items)

    wait_for(f"pod {pod} evicted and gone", gone, timeout)
