"""The lab's device-health signals (issue 21): the fake driver taints its devices as NVIDIA's driver does
(KEP-5055), and tests report a device's health in a pod's status as a kubelet does (KEP-4680).

What the apiserver keeps is what claimwarden's sources read (claimwarden.signals.taints, .podhealth), so
these tests read it back through them. The lab runs the version of $CLAIMWARDEN_KUBERNETES with the presets
`device-taints,resource-health` (gates DRADeviceTaints and ResourceHealthStatus before 1.36; nothing
after: both are on by default, slice taints GA in 1.37, pod health still beta in 1.37.2).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from kubernetes import client, config

from claimwarden.health.records import DeviceRef
from claimwarden.signals import podhealth, taints
from claimwarden.signals.observations import HEALTHY, SOURCE_TAINT, UNHEALTHY, UNKNOWN
from claimwarden_lab import cluster, slice_taints
from claimwarden_lab.binaries import resolve_version
from claimwarden_lab.driver import DRIVER
from claimwarden_lab.processes import LabError

from .conftest import extra_lab, lab_kubernetes
from .health_helpers import running_pod, write_device_health
from .helpers import gpu_claim_spec, pod_with_claims, wait_for

NODE = "kwok-node-0"
XID = "gpu.nvidia.com/xid"
KWOK_QUIET = 20.0
"""How long a written pod status must survive kwok untouched."""


def minor() -> int:
    return int(resolve_version(lab_kubernetes()).split(".")[1])


@pytest.fixture(scope="module")
def signals_lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[cluster.LabState]:
    with extra_lab(tmp_path_factory, nodes=1, gpus_per_node=2, presets="device-taints,resource-health") as state:
        yield state


@pytest.fixture
def lab_api(signals_lab: cluster.LabState) -> Iterator[client.ApiClient]:
    with config.new_client_from_config(config_file=str(signals_lab.kubeconfig)) as api:
        yield api


def slices(api: client.ApiClient) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = json.loads(
        client.ResourceV1Api(api).list_resource_slice(_preload_content=False).data)["items"]
    return items


def device_taints(api: client.ApiClient, device: str) -> list[Any] | None:
    """The device's taints as claimwarden reads them: from its complete pool only."""
    pools = taints.complete_pools(slices(api))
    found = taints.device_taints(pools.get((DRIVER, NODE), []))
    return found.get(DeviceRef(DRIVER, NODE, device))


def test_the_driver_publishes_taints_that_claimwarden_reads(lab_api: client.ApiClient) -> None:
    ref = DeviceRef(DRIVER, NODE, "gpu-1")
    before = datetime.now(UTC).replace(microsecond=0)
    published = slice_taints.taint_device(lab_api, NODE, "gpu-1", XID, "79", "NoSchedule")
    assert [(t["key"], t["value"], t["effect"]) for t in published] == [(XID, "79", "NoSchedule")]
    # The driver leaves timeAdded to the apiserver (as NVIDIA's does), which sets it.
    added = datetime.fromisoformat(published[0]["timeAdded"].replace("Z", "+00:00"))
    assert before - timedelta(seconds=5) <= added <= datetime.now(UTC) + timedelta(seconds=5)

    first = taints.taint_observations(ref, device_taints(lab_api, "gpu-1"), [], datetime.now(UTC))
    assert [(o.source, o.signal, o.value, o.state, o.at) for o in first] == [
        (SOURCE_TAINT, XID, "79", UNHEALTHY, added)]
    assert device_taints(lab_api, "gpu-0") == []

    # The same taint again changes nothing on the slice, so nothing new is observed.
    again = slice_taints.taint_device(lab_api, NODE, "gpu-1", XID, "79", "NoSchedule")
    assert again == published
    assert taints.taint_observations(ref, device_taints(lab_api, "gpu-1"), first, datetime.now(UTC)) == []

    # One taint per key: a new XID replaces the old one, and only claimwarden keeps the history.
    time.sleep(1.1)  # timeAdded has second precision
    replaced = slice_taints.taint_device(lab_api, NODE, "gpu-1", XID, "48", "NoSchedule")
    assert [(t["key"], t["value"]) for t in replaced] == [(XID, "48")]
    assert replaced[0]["timeAdded"] != published[0]["timeAdded"]
    second = taints.taint_observations(ref, device_taints(lab_api, "gpu-1"), first, datetime.now(UTC))
    assert [(o.value, o.state) for o in second] == [("48", UNHEALTHY)]

    assert slice_taints.taint_device(lab_api, NODE, "gpu-1", XID, remove=True) == []
    removed = taints.taint_observations(ref, device_taints(lab_api, "gpu-1"), first + second, datetime.now(UTC))
    assert [(o.signal, o.state) for o in removed] == [(XID, HEALTHY)]

    with pytest.raises(LabError, match=r"ResourceSlice on node 'kwok-node-0' lists device 'gpu-9'"):
        slice_taints.taint_device(lab_api, NODE, "gpu-9", XID, "79")


def test_lab_taint_from_the_command_line(signals_lab: cluster.LabState, lab_api: client.ApiClient) -> None:
    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "claimwarden", "lab", "taint", NODE, *args,
                               "--dir", str(signals_lab.dir)], capture_output=True, text=True, timeout=60, check=False)

    done = cli("gpu-0", "--key", "gpu.nvidia.com/gpu-lost")
    assert done.returncode == 0, done.stderr
    assert "kwok-node-0/gpu-0 taints: gpu.nvidia.com/gpu-lost:NoSchedule (added 20" in done.stdout
    assert [t["key"] for t in device_taints(lab_api, "gpu-0") or []] == ["gpu.nvidia.com/gpu-lost"]
    removed = cli("gpu-0", "--key", "gpu.nvidia.com/gpu-lost", "--remove")
    assert (removed.returncode, removed.stdout.strip()) == (0, "lab: kwok-node-0/gpu-0 taints: none"), removed.stderr
    # NVIDIA's driver taints non-fatal XIDs and unmonitored GPUs with effect None, which 1.34 refuses.
    unmonitored = cli("gpu-0", "--key", "gpu.nvidia.com/unmonitored", "--effect", "None")
    if minor() >= 35:
        assert unmonitored.returncode == 0, unmonitored.stderr
        assert "gpu.nvidia.com/unmonitored:None" in unmonitored.stdout
        assert cli("gpu-0", "--key", "gpu.nvidia.com/unmonitored", "--remove").returncode == 0
    else:
        assert unmonitored.returncode == 1
        assert unmonitored.stderr.startswith("lab: error: the apiserver refused the taint (422): ")
        assert 'Unsupported value: "None"' in unmonitored.stderr, unmonitored.stderr
    missing = cli("gpu-7", "--key", XID)
    assert missing.returncode == 1
    assert missing.stderr.strip() == (f"lab: error: no {DRIVER} ResourceSlice on node '{NODE}' lists device 'gpu-7'")


def test_a_kubelet_style_pod_health_report_is_kept(lab_api: client.ApiClient, signals_lab: cluster.LabState) -> None:
    namespace = f"signals-{int(time.time() * 1000) % 10**8}"
    core = client.CoreV1Api(lab_api)
    core.create_namespace(body={"metadata": {"name": namespace}})
    try:
        # A standalone claim: the lab's kube-controller-manager makes no claims from templates (claimwarden does).
        client.ResourceV1Api(lab_api).create_namespaced_resource_claim(
            namespace, {"metadata": {"name": "gpu-claim"}, "spec": gpu_claim_spec()})
        core.create_namespaced_pod(namespace, pod_with_claims("p", [{"name": "gpu", "resourceClaimName": "gpu-claim"}]))
        pod = running_pod(lab_api, namespace, "p")
        claim = client.ResourceV1Api(lab_api).read_namespaced_resource_claim("gpu-claim", namespace)
        result = claim.status.allocation.devices.results[0]
        ref = DeviceRef(result.driver, result.pool, result.device)

        status = write_device_health(lab_api, namespace, "p", UNHEALTHY, message="XID 79")
        written = status["containerStatuses"][0].get("allocatedResourcesStatus")
        assert written, "the apiserver dropped allocatedResourcesStatus (is ResourceHealthStatus on?)"
        assert written[0]["name"] == "claim:gpu"
        # ResourceHealthStatusMessage first exists in 1.36: before, the apiserver drops the message.
        expected_message = "XID 79" if minor() >= 36 else ""

        def read() -> list[podhealth.DeviceHealth]:
            raw = json.loads(core.read_namespaced_pod("p", namespace, _preload_content=False).data)
            return podhealth.pod_device_health(raw)

        uid = pod["metadata"]["uid"]
        expected = [podhealth.DeviceHealth(ref, f"{uid}/ctr0/{ref}", UNHEALTHY, expected_message)]
        assert read() == expected
        # kwok writes a pod's status when it starts it, and not again: the report stays.
        time.sleep(KWOK_QUIET)
        assert read() == expected

        write_device_health(lab_api, namespace, "p", UNKNOWN)
        assert [h.health for h in wait_for("the Unknown report", read, 10)] == [UNKNOWN]
    finally:
        core.delete_namespace(namespace)
