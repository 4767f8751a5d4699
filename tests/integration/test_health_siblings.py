"""A fault covers its fault domain (issue 22, part 1; docs/concepts/fault-domains.md), in a partitionable lab.

One node, two GPUs, each offered whole and as two halves drawing from the GPU's counter set. Marking the whole
gpu-0 evicts the pods on both of its halves, exactly once each, keeps every device of gpu-0 from new work while
the mark stands (the records derived for its halves hold them), and clearing it frees them all. Marking one half
of gpu-1 evicts only that half's pod; a slice annotation on the whole gpu-1 then takes its other half's pod.

Partitionable devices in their own counter slices need 1.35+; the module runs on 1.36 (the gate on by default)
unless CLAIMWARDEN_KUBERNETES names 1.35 or later.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client, config

from claimwarden_lab import driver
from claimwarden_lab.cluster import LabState

from .auditor import LabAudit
from .conftest import extra_lab, lab_kubernetes, service_account_kubeconfig
from .health_helpers import (
    GROUP,
    PLURAL,
    PREFIX,
    VERSION,
    DeviceWatch,
    annotate,
    create_record,
    delete_record,
    holders,
    records,
    wait_gone,
)
from .helpers import pod_with_claims, wait_for
from .operator import Operator

POOL = "kwok-node-0"
NAMESPACE = "siblings"
QUARANTINE_NAMESPACE = "claimwarden-system"
GPU_0 = ("gpu-0", "gpu-0-partition-0", "gpu-0-partition-1")


@pytest.fixture(scope="module")
def partitionable_lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LabState]:
    version = lab_kubernetes() if lab_kubernetes() >= "1.35" else "1.36"
    with extra_lab(tmp_path_factory, kubernetes=version, nodes=1, gpus_per_node=2, profile="partitionable") as state:
        yield state


def _template(name: str, profile: str, index: int) -> dict[str, Any]:
    attrs = f"device.attributes['{driver.DRIVER}']"
    return {"metadata": {"name": name}, "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
        "deviceClassName": driver.DEVICE_CLASS,
        "selectors": [{"cel": {"expression": f"{attrs}.profile == '{profile}' && {attrs}.index == {index}"}}]}}]}}}}


def _start(core: client.CoreV1Api, name: str, template: str) -> None:
    core.create_namespaced_pod(NAMESPACE, body=pod_with_claims(
        name, [{"name": "gpu", "resourceClaimTemplateName": template}]))


def _devices_of_pods(api: client.ApiClient) -> dict[str, str]:
    """pod -> the device its generated claim was allocated, for the scheduled pods of the namespace."""
    found = {}
    for claim in client.ResourceV1Api(api).list_namespaced_resource_claim(NAMESPACE).items:
        allocation = claim.status.allocation if claim.status else None
        owners = claim.metadata.owner_references or []
        if allocation and owners:
            found[owners[0].name] = allocation.devices.results[0].device
    return found


def _placed(api: client.ApiClient, pods: set[str]) -> dict[str, str] | None:
    """pod -> device once every one of `pods` was allocated a device."""
    found = _devices_of_pods(api)
    return found if pods <= set(found) else None


def _pods(core: client.CoreV1Api) -> set[str]:
    return {p.metadata.name for p in core.list_namespaced_pod(NAMESPACE).items}


def _derived(api: client.ApiClient) -> dict[str, str]:
    """device -> origin record name, for the records derived for siblings."""
    return {r["spec"]["device"]: r["metadata"]["ownerReferences"][0]["name"]
            for r in records(api) if r["spec"].get("source") == "sibling"}


def _evictions(audit: LabAudit) -> Counter[str]:
    counts: Counter[str] = Counter()
    for event in audit.new_events():
        ref = event.get("objectRef") or {}
        if event.get("verb") == "create" and ref.get("subresource") == "eviction" and \
                (event.get("responseStatus") or {}).get("code") == 201:
            counts[ref.get("name") or ""] += 1
    return counts


def test_a_mark_of_the_whole_gpu_covers_its_partitions_and_a_mark_of_a_partition_only_itself(
        partitionable_lab: LabState, tmp_path_factory: pytest.TempPathFactory) -> None:
    lab = partitionable_lab
    api = config.new_client_from_config(config_file=str(lab.kubeconfig))
    core, resource = client.CoreV1Api(api), client.ResourceV1Api(api)
    custom = client.CustomObjectsApi(api)
    core.create_namespace(body={"metadata": {"name": NAMESPACE}})
    for name, profile, index in (("half-0", "half", 0), ("half-1", "half", 1), ("full-0", "full", 0)):
        resource.create_namespaced_resource_claim_template(NAMESPACE, body=_template(name, profile, index))
    operator = Operator(service_account_kubeconfig(lab), tmp_path_factory.mktemp("siblings") / "claimwarden.log")
    operator.start()
    audit = LabAudit(lab)
    try:
        for pod, template in (("a", "half-0"), ("b", "half-0"), ("c", "half-1"), ("d", "half-1")):
            _start(core, pod, template)
        placed = wait_for("four pods on the four halves", lambda: _placed(api, {"a", "b", "c", "d"}), 90)
        assert sorted(placed.values()) == ["gpu-0-partition-0", "gpu-0-partition-1",
                                           "gpu-1-partition-0", "gpu-1-partition-1"]

        # The whole gpu-0 marked: its halves' pods go, once each; gpu-1's stay.
        held_before = {f"{h} -> {device}" for device in GPU_0 for h in holders(api, POOL, device)}
        started = time.monotonic()
        create_record(api, "broken-gpu-0", POOL, "gpu-0", "NoExecute", "XID 79: fallen off the bus")
        with DeviceWatch(api, POOL, GPU_0, QUARANTINE_NAMESPACE) as watch:
            wait_gone(api, NAMESPACE, "a", 60)
            wait_gone(api, NAMESPACE, "b", 60)
            evicted_in = time.monotonic() - started
            assert _derived(api) == {"gpu-0-partition-0": "broken-gpu-0", "gpu-0-partition-1": "broken-gpu-0"}
            # Approving the whole device's mark approves its siblings' records too (their pods are the ones a breaker
            # would hold back).
            approved = subprocess.run([sys.executable, "-m", "claimwarden", "approve", f"{POOL}/gpu-0", "--kubeconfig",
                                       str(lab.kubeconfig)], capture_output=True, text=True, timeout=60)
            assert approved.returncode == 0 and "also the 2 record(s) derived" in approved.stdout, approved
            assert {r["spec"]["device"] for r in records(api) if r["spec"].get("source") == "sibling"
                    and (r["metadata"].get("annotations") or {}).get("claimwarden.io/approved-by")} == set(GPU_0[1:])
            status = wait_for("the record shows its fault domain", lambda: (custom.get_cluster_custom_object(
                GROUP, VERSION, PLURAL, "broken-gpu-0").get("status") or {}).get("faultDomain"), 30)
            assert status == list(GPU_0)
            # New pods for any device of gpu-0, whole or half, get none of them while the mark stands.
            for pod, template in (("e", "half-0"), ("f", "half-0"), ("g", "full-0")):
                _start(core, pod, template)
            wait_for("every device of gpu-0 quarantined", lambda: all(
                any(h.startswith(f"{QUARANTINE_NAMESPACE}/") for h in holders(api, POOL, device)) for device in GPU_0),
                60)
            time.sleep(8)
            assert {"e", "f", "g"}.isdisjoint(_devices_of_pods(api)), "a pod got a device of the marked gpu-0"
            assert _pods(core) == {"c", "d", "e", "f", "g"}
            # g would take the whole gpu-0 once it is free, and leave no counters for e and f.
            core.delete_namespaced_pod("g", NAMESPACE, grace_period_seconds=0)
            wait_gone(api, NAMESPACE, "g", 30)

            # Cleared: the derived records go with it and the halves take new work again.
            cleared = time.monotonic()
            delete_record(api, "broken-gpu-0")
            wait_for("the derived records gone", lambda: not _derived(api), 60)
            freed = wait_for("e and f scheduled on gpu-0's halves", lambda: _placed(api, {"e", "f"}), 90)
        assert sorted((freed["e"], freed["f"])) == ["gpu-0-partition-0", "gpu-0-partition-1"]
        early = {what: round(cleared - at, 1) for what, at in watch.first_seen.items()
                 if at < cleared and what not in held_before}
        assert early == {}, f"allocated while gpu-0 was marked (seconds before the clear): {early}"

        # One half of gpu-1 marked (a partition: its own device only): only its pod goes.
        victim = next(pod for pod, device in placed.items() if device == "gpu-1-partition-0")
        survivor = next(pod for pod, device in placed.items() if device == "gpu-1-partition-1")
        create_record(api, "broken-half", POOL, "gpu-1-partition-0", "NoExecute", "ECC errors in one half")
        wait_gone(api, NAMESPACE, victim, 60)
        time.sleep(3)
        assert survivor in _pods(core) and _derived(api) == {}
        delete_record(api, "broken-half")
        wait_for("gpu-1-partition-0 free again", lambda: holders(api, POOL, "gpu-1-partition-0") == [], 60)

        # The whole gpu-1 marked by a slice annotation (any source extends): the other half's pod goes too.
        devices_slice = next(item.metadata.name for item in resource.list_resource_slice().items
                             if item.spec.node_name == POOL and item.spec.devices)
        annotate(api, devices_slice, {f"{PREFIX}gpu-1": "XID 48 (marked on the slice)"})
        wait_gone(api, NAMESPACE, survivor, 60)
        assert set(_derived(api)) == {"gpu-1-partition-0", "gpu-1-partition-1"}
        annotate(api, devices_slice, {f"{PREFIX}gpu-1": None})
        wait_for("gpu-1's derived records gone", lambda: not _derived(api), 60)
        wait_for("gpu-1 and its halves free again", lambda: not any(
            holders(api, POOL, device) for device in ("gpu-1", "gpu-1-partition-0", "gpu-1-partition-1")), 60)

        evictions = _evictions(audit)
        assert evictions == Counter({"a": 1, "b": 1, victim: 1, survivor: 1}), evictions
        print(f"siblings: the halves' pods evicted {evicted_in:.1f} s after the mark of gpu-0")
    finally:
        core.delete_namespace(NAMESPACE)
        wait_for("the namespace gone", lambda: NAMESPACE not in {
            n.metadata.name for n in core.list_namespace().items}, 120, interval=1)
        assert operator.stop() in (None, 0)
        api.close()
