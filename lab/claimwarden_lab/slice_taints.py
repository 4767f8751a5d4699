"""`claimwarden lab taint`: a device taint on the fake driver's ResourceSlice, as a driver publishes one."""

from __future__ import annotations

import json
from typing import Any, cast

from kubernetes import client

from . import driver
from .processes import LabError

TAINT_RETRIES = 5


def status_message(exc: client.ApiException) -> str:
    """The message of the Status an apiserver answered with, else the raw body."""
    try:
        return str(json.loads(exc.body or "")["message"])
    except (TypeError, ValueError, KeyError):
        return str(exc.body or exc.reason)


def raw_json(response: object) -> Any:
    """The JSON of a response read with _preload_content=False: every field, even those the client's models lack."""
    return json.loads(cast(Any, response).data)


def taint_device(api: client.ApiClient, node: str, device: str, key: str, value: str = "",
                 effect: str = "NoSchedule", *, remove: bool = False) -> list[dict[str, Any]]:
    """Publish (or with ``remove``, withdraw) a taint on a device of the fake driver's slice on ``node``,
    as NVIDIA's driver does (driver.set_device_taint); returns the device's taints as the apiserver keeps them.

    The slice is rewritten whole with its resourceVersion (devices are an atomic list), retried on conflict.
    An apiserver without slice taints (gate ``DRADeviceTaints`` off: before 1.36 unless the lab runs with
    ``--preset device-taints``) silently drops them; that is an error here, with the fix.
    """
    resource = client.ResourceV1Api(api)
    for _ in range(TAINT_RETRIES):
        listed = raw_json(resource.list_resource_slice(
            field_selector=f"spec.nodeName={node},spec.driver={driver.DRIVER}", _preload_content=False))
        slices = [s for s in listed.get("items", [])
                  if any(d.get("name") == device for d in s["spec"].get("devices") or [])]
        if not slices:
            raise LabError(f"no {driver.DRIVER} ResourceSlice on node {node!r} lists device {device!r}")
        body = slices[0]
        devices = body["spec"]["devices"]
        try:
            body["spec"]["devices"] = (driver.remove_device_taint(devices, device, key) if remove
                                       else driver.set_device_taint(devices, device, key, value, effect))
        except driver.LabConfigError as exc:
            raise LabError(str(exc)) from None
        try:
            written = raw_json(resource.replace_resource_slice(body["metadata"]["name"], body=body,
                                                               _preload_content=False))
        except client.ApiException as exc:
            if exc.status == 409:
                continue
            raise LabError(f"the apiserver refused the taint ({exc.status}): {status_message(exc)}") from None
        taints: list[dict[str, Any]] = next(
            d.get("taints") or [] for d in written["spec"]["devices"] if d.get("name") == device)
        if not remove and not any(t.get("key") == key for t in taints):
            raise LabError("the apiserver dropped the taint: slice taints need the DRADeviceTaints gate, off "
                           "before Kubernetes 1.36; start the lab with '--preset device-taints'")
        return taints
    raise LabError(f"ResourceSlice of node {node!r} kept changing under {TAINT_RETRIES} writes; try again")
