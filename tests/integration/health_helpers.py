"""Marking devices, reading UnhealthyDevice records and reporting device health (KEP-4680) in the lab."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from .helpers import pod_with_claims, template, wait_for

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


def running_pod(api: client.ApiClient, namespace: str, pod: str, timeout: float = 60) -> dict[str, Any]:
    """The pod as raw JSON once kwok has made it Running with its container statuses.

    kwok writes a pod's whole status once, when it starts the pod; a status written before that is lost.
    """
    core = client.CoreV1Api(api)

    def probe() -> dict[str, Any] | None:
        found: dict[str, Any] = json.loads(core.read_namespaced_pod(pod, namespace, _preload_content=False).data)
        status = found.get("status") or {}
        return found if status.get("phase") == "Running" and status.get("containerStatuses") else None

    return wait_for(f"pod {namespace}/{pod} Running", probe, timeout)


def write_device_health(api: client.ApiClient, namespace: str, pod: str, health: str, *,
                        container: str | None = None, device: str | None = None, message: str = "") -> dict[str, Any]:
    """Report ``health`` (Healthy, Unhealthy or Unknown) for the pod's DRA devices in
    ``status.containerStatuses[].allocatedResourcesStatus`` (KEP-4680), through the pods/status subresource
    as a kubelet does; returns the pod's status as the apiserver kept it.

    Every container (or the one named) reports every device allocated to each claim it uses (or only
    ``device``). The entry's name is ``claim:<name>[/<request>]`` with the container's claim reference
    (``spec.containers[].resources.claims[]``, i.e. ``pod.spec.resourceClaims[].name``): the apiserver
    refuses any other name, the ResourceClaim's own name included. Before 1.36 it drops ``message``
    (no ResourceHealthStatusMessage gate), and without ResourceHealthStatus the whole field.
    """
    core, resource = client.CoreV1Api(api), client.ResourceV1Api(api)
    for _ in range(5):
        body = running_pod(api, namespace, pod)
        generated = {s["name"]: s.get("resourceClaimName") for s in body["status"].get("resourceClaimStatuses") or []}
        claim_names = {c["name"]: c.get("resourceClaimName") or generated.get(c["name"])
                       for c in body["spec"].get("resourceClaims") or []}
        containers = {c["name"]: c for c in body["spec"]["containers"]}
        for status in body["status"]["containerStatuses"]:
            if container is not None and status["name"] != container:
                continue
            entries = []
            for use in (containers[status["name"]].get("resources") or {}).get("claims") or []:
                claim = claim_names.get(use["name"])
                if not claim:
                    continue
                allocation = json.loads(resource.read_namespaced_resource_claim(
                    claim, namespace, _preload_content=False).data).get("status", {}).get("allocation") or {}
                request = use.get("request") or ""
                results = [r for r in (allocation.get("devices") or {}).get("results") or []
                           if (not request or r["request"] == request or r["request"].startswith(request + "/"))
                           and (device is None or r["device"] == device)]
                resources = [{"resourceID": f"{r['driver']}/{r['pool']}/{r['device']}", "health": health,
                              **({"message": message} if message else {})} for r in results]
                if resources:
                    entries.append({"name": f"claim:{use['name']}" + (f"/{request}" if request else ""),
                                    "resources": resources})
            status["allocatedResourcesStatus"] = entries
        try:
            written: dict[str, Any] = json.loads(core.replace_namespaced_pod_status(
                pod, namespace, body, _preload_content=False).data)
            return dict(written["status"])
        except ApiException as exc:
            if exc.status != 409:
                raise
    raise AssertionError(f"pod {namespace}/{pod} kept changing: its status was not written")


def evicts_from_a_marked_device(api: client.ApiClient, namespace: str, reason: str) -> None:
    """A pod with a template claim on kwok-node-0 in a new namespace; its device marked, the pod evicted
    (podsEvicted 1 on the record), the mark cleared, the record gone, the namespace deleted. For claimwarden
    running as a real pod (test_real_node.py, test_helm.py)."""
    core = client.CoreV1Api(api)
    core.create_namespace(body={"metadata": {"name": namespace}})
    wait_for("the namespace's default ServiceAccount", lambda: core.list_namespaced_service_account(
        namespace, field_selector="metadata.name=default").items, 60)
    client.ResourceV1Api(api).create_namespaced_resource_claim_template(namespace, body=template("single-gpu"))
    body = pod_with_claims("victim", [{"name": "gpu", "resourceClaimTemplateName": "single-gpu"}])
    body["spec"]["nodeSelector"] = {"kubernetes.io/hostname": "kwok-node-0"}
    core.create_namespaced_pod(namespace, body=body)
    wait_for("victim Running", lambda: core.read_namespaced_pod("victim", namespace).status.phase == "Running")
    pool, device = device_of(api, namespace, "victim")
    mark(api, pool, device, reason)
    try:
        wait_gone(api, namespace, "victim")
        record = wait_for("the record", lambda: record_for(api, pool, device))
        assert record["status"].get("podsEvicted") == 1, record["status"]
    finally:
        unmark(api, pool, device)
    wait_for("the record gone", lambda: record_for(api, pool, device) is None, 60)
    core.delete_namespace(namespace)


class DeviceWatch:
    """Lists the claims every 0.2 s in the background and keeps, for each claim outside `quarantine_namespace` seen
    allocated one of `devices`, when it was first seen ("namespace/claim -> device"): a test asserts that none was
    given out while it was marked."""

    def __init__(self, api: client.ApiClient, pool: str, devices: tuple[str, ...], quarantine_namespace: str) -> None:
        self.api, self.pool, self.devices, self.skip = api, pool, devices, f"{quarantine_namespace}/"
        self.first_seen: dict[str, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> DeviceWatch:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        while not self._stop.wait(0.2):
            for device in self.devices:
                for holder in holders(self.api, self.pool, device):
                    if not holder.startswith(self.skip):
                        self.first_seen.setdefault(f"{holder} -> {device}", time.monotonic())
