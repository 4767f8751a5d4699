"""What the caches signal about devices now: the level-based sources put together, read from the cache.

``taints``, ``podhealth`` and ``nodes`` turn one object's fields into observations; this module finds the
objects that speak of a device (its complete pool's slices, the pods holding it through their claims, its
node) and asks them. ``collect`` also says whether a fault is still signalled now, and ``candidates`` lists
every device that has a signal record or a signal now (what a resync queues).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any, cast

from ..cache import Body, Cache
from ..health import records, slice_marks
from ..health.records import DeviceRef
from . import nodes, observations, podhealth, policy, taints
from . import records as signal_records
from .observations import HEALTHY, Observation


def candidates(cache: Cache, *, pushed: Iterable[DeviceRef], policies: Sequence[policy.Policy]) -> set[DeviceRef]:
    """Every device with a signal record, pushed observations (`pushed`) or a signal in the caches now."""
    found = {ref for record in cache.records() if signal_records.is_signal_record(record)
             and (ref := records.record_ref(record)) is not None}
    found |= set(pushed)
    for slice_ in cache.resource_slices():
        driver = str(slice_["spec"].get("driver") or "")
        pool = slice_marks.slice_pool(slice_)
        for device in slice_["spec"].get("devices") or []:
            if any(t.get("key") != records.TAINT_KEY for t in device.get("taints") or []):
                found.add(DeviceRef(driver, pool, str(device.get("name") or "")))
    for key in cache.pod_keys():
        pod = cache.pod(*key)
        if pod is not None:
            found |= {entry.ref for entry in podhealth.pod_device_health(pod)}
    watched = {rule.signal for p in policies for rule in p.rules if rule.source == observations.SOURCE_NODE}
    if watched:
        for node_name in cache.node_names():
            conditions = cache.node_conditions(node_name)
            if any(c.get("type") in watched for c in conditions):
                found |= set(nodes.devices_of_node(node_name, cache.resource_slices()))
    return found


def collect(cache: Cache, ref: DeviceRef, device_policy: policy.Policy | None, previous: Sequence[Observation],
            moment: datetime) -> tuple[list[Observation], bool]:
    """The level-based observations of the device now (the sources keep only what `previous` lacks), and
    whether a fault is still signalled now (a driver taint, a pod's report other than Healthy, a node
    condition a rule names, or a pool too incomplete to tell): its record must not be deleted then, or
    the fault would come back as new, without the record's history (its boundary, its clears)."""
    found: list[Observation] = []
    pool_slices = taints.complete_pools(cache.resource_slices_of_pool(ref.driver, ref.pool)).get(
        (ref.driver, ref.pool))
    device_taints: list[Mapping[str, Any]] | None = None
    if pool_slices is not None:
        device_taints = taints.device_taints(pool_slices).get(ref)
    signalled = device_taints is None or any(t.get("key") != records.TAINT_KEY for t in device_taints)
    found += taints.taint_observations(ref, device_taints, previous, moment)
    entries = [entry for pod in pods_holding(cache, ref) for entry in podhealth.pod_device_health(pod)
               if entry.ref == ref]
    signalled = signalled or any(entry.health != HEALTHY for entry in entries)
    found += podhealth.pod_health_observations(entries, previous, moment)
    node_rules = [rule for rule in device_policy.rules if rule.source == observations.SOURCE_NODE] \
        if device_policy is not None else []
    node_name = node_of(cache, ref) if node_rules else ""
    if node_name:  # only for a policy that watches them: every node has a handful of conditions
        conditions = nodes.condition_observations(node_name, cache.node_conditions(node_name))
        signalled = signalled or any(rule.matches(o) for o in conditions for rule in node_rules)
        found += conditions
    return found, signalled


def published(cache: Cache, ref: DeviceRef) -> Mapping[str, Any] | None:
    """The device as a slice in the cache lists it, or None."""
    for slice_ in cache.resource_slices_of_pool(ref.driver, ref.pool):
        for device in slice_["spec"].get("devices") or []:
            if device.get("name") == ref.device:
                return cast(Mapping[str, Any], device)
    return None


def pods_holding(cache: Cache, ref: DeviceRef) -> list[Body]:
    """The pods a claim allocated the device to is reserved for, by namespace and name."""
    pods: dict[tuple[str, str], Body] = {}
    for claim in cache.claims_holding((ref.driver, ref.pool, ref.device)):
        namespace = claim["metadata"].get("namespace") or ""
        for entry in (claim.get("status") or {}).get("reservedFor") or []:
            if entry.get("resource") == "pods" and (pod := cache.pod(namespace, entry.get("name", ""))):
                pods[(namespace, pod["metadata"]["name"])] = pod
    return [pods[k] for k in sorted(pods)]


def node_of(cache: Cache, ref: DeviceRef) -> str:
    """The node of the device (its slice's, or the device's own nodeName), or ""."""
    for slice_ in cache.resource_slices_of_pool(ref.driver, ref.pool):
        if ref in nodes.devices_of_node(str(slice_["spec"].get("nodeName") or ""), [slice_]):
            return str(slice_["spec"].get("nodeName") or "")
        for device in slice_["spec"].get("devices") or []:
            if device.get("name") == ref.device and device.get("nodeName"):
                return str(device["nodeName"])
    return ""


def slice_taints(slice_: Body) -> dict[str, list[Body]]:
    """Device name -> its taints, for the devices of the slice that have any."""
    return {str(d.get("name") or ""): list(d.get("taints") or [])
            for d in (slice_.get("spec") or {}).get("devices") or [] if d.get("taints")}
