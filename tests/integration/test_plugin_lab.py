"""`kubectl claimwarden` against a lab: doctor finds every planted condition; the verbs, their exit
codes and one-line errors; mark and clear write the documented record; kubectl finds the plugin.

One lab of its own (2 nodes x 4 GPUs, DeviceTaintRule served: the lab's device-taints preset, v1alpha3
with the DRADeviceTaints gate on 1.34, v1 on 1.37) so that a DeviceTaintRule that selects everything
can be planted safely.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, config

from claimwarden_lab.cluster import LabState

from .conftest import extra_lab
from .differential import QUARANTINE_NAMESPACE, decision, release
from .helpers import taint_rule_version, wait_for

PLUGIN = Path(sys.executable).parent / "kubectl-claimwarden"
DRIVER = "gpu.example.com"
RECORDS = ("claimwarden.io", "v1alpha1", "unhealthydevices")


def run(lab: LabState, verb: str, *args: str) -> subprocess.CompletedProcess[str]:
    """`kubectl-claimwarden VERB --kubeconfig=<the lab's> ARGS...`"""
    return subprocess.run([str(PLUGIN), verb, f"--kubeconfig={lab.kubeconfig}", *args],
                          capture_output=True, text=True, timeout=60)


@pytest.fixture(scope="module")
def plugin_lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LabState, client.ApiClient]]:
    with extra_lab(tmp_path_factory, nodes=2, gpus_per_node=4, presets="device-taints") as lab, \
            config.new_client_from_config(config_file=str(lab.kubeconfig)) as api:
        yield lab, api


def _claim(name: str, *, selectors: list[str] = (), count: int = 1, **metadata: Any) -> dict[str, Any]:  # type: ignore[assignment]
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": name, **metadata},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                "deviceClassName": DRIVER, "count": count,
                "selectors": [{"cel": {"expression": s}} for s in selectors]}}]}}}


def _pod(name: str, claims: list[str], *, gated: bool = False) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "terminationGracePeriodSeconds": 0,
        "containers": [{"name": "c", "image": "registry.example/busybox:1",
                        "resources": {"claims": [{"name": f"c{i}"} for i in range(len(claims))]}}],
        "resourceClaims": [{"name": f"c{i}", "resourceClaimName": c} for i, c in enumerate(claims)]}
    if gated:
        spec["schedulingGates"] = [{"name": "example.com/never"}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def _allocate(custom: client.CustomObjectsApi, namespace: str, name: str, device: str, node: str,
              reserved: list[dict[str, str]] | None = None) -> None:
    body = custom.get_namespaced_custom_object("resource.k8s.io", "v1", namespace, "resourceclaims", name)
    body["status"] = {"allocation": {"devices": {"results": [
        {"request": "gpu", "driver": DRIVER, "pool": node, "device": device}]},
        "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
            {"key": "metadata.name", "operator": "In", "values": [node]}]}]}}}
    if reserved:
        body["status"]["reservedFor"] = reserved
    custom.replace_namespaced_custom_object_status("resource.k8s.io", "v1", namespace, "resourceclaims", name, body)


def test_doctor_finds_every_planted_condition(plugin_lab: tuple[LabState, client.ApiClient]) -> None:
    lab, api = plugin_lab
    core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
    ns = f"doctor-{uuid.uuid4().hex[:5]}"
    core.create_namespace({"metadata": {"name": ns}})
    claims: list[str] = []

    def create_claim(body: dict[str, Any]) -> None:
        custom.create_namespaced_custom_object("resource.k8s.io", "v1", ns, "resourceclaims", body)
        claims.append(body["metadata"]["name"])

    rule = f"select-all-{uuid.uuid4().hex[:5]}"
    ghost_record = f"ghost-{uuid.uuid4().hex[:5]}"
    busy_node = ""
    rule_version = taint_rule_version(api)
    assert rule_version, "the plugin lab must serve DeviceTaintRule (preset device-taints)"
    try:
        # a running pod on kwok-node-0/gpu-0, then its device is marked NoExecute (claimwarden is not running)
        create_claim(_claim("busy", selectors=['device.attributes["gpu.example.com"].index == 0']))
        core.create_namespaced_pod(ns, _pod("busy", ["busy"]))
        assert decision(api, ns, "busy")[0]
        busy = custom.get_namespaced_custom_object("resource.k8s.io", "v1", ns, "resourceclaims", "busy")
        busy_node = busy["status"]["allocation"]["devices"]["results"][0]["pool"]
        marked = run(lab, "mark", f"{busy_node}/gpu-0", "--reason", "XID 79", "--effect", "NoExecute")
        assert marked.returncode == 0, marked.stderr
        # leaked: a generated-looking claim (controlled by a pod) allocated, reserved for nobody
        owner = core.create_namespaced_pod(ns, _pod("owner", [], gated=True))
        create_claim(_claim("leaked", ownerReferences=[{"apiVersion": "v1", "kind": "Pod", "name": "owner",
                                                        "uid": owner.metadata.uid, "controller": True}]))
        _allocate(custom, ns, "leaked", "gpu-1", "kwok-node-1")
        # stale: reserved for a pod that does not exist
        create_claim(_claim("stale"))
        _allocate(custom, ns, "stale", "gpu-2", "kwok-node-1",
                  [{"resource": "pods", "name": "ghost", "uid": str(uuid.uuid4())}])
        # near the 256 limit
        create_claim(_claim("crowded"))
        _allocate(custom, ns, "crowded", "gpu-3", "kwok-node-1",
                  [{"resource": "pods", "name": f"p{i}", "uid": str(uuid.uuid4())} for i in range(240)])
        # stuck in deletion, and orphaned (its pod is gone; the garbage collector's delete waits on the finalizer)
        create_claim(_claim("stuck", finalizers=["example.com/hold"]))
        custom.delete_namespaced_custom_object("resource.k8s.io", "v1", ns, "resourceclaims", "stuck")
        create_claim(_claim("orphan", finalizers=["example.com/hold"], ownerReferences=[
            {"apiVersion": "v1", "kind": "Pod", "name": "gone", "uid": str(uuid.uuid4()), "controller": True}]))
        # a pending pod whose claim nothing can satisfy
        create_claim(_claim("b100", selectors=['device.attributes["gpu.example.com"].model == "B100"']))
        core.create_namespaced_pod(ns, _pod("waiting", ["b100"]))
        assert not decision(api, ns, "waiting")[0]
        # a DeviceTaintRule whose empty selector taints every device (NoSchedule: it evicts nobody)
        custom.create_cluster_custom_object("resource.k8s.io", rule_version, "devicetaintrules", {
            "apiVersion": f"resource.k8s.io/{rule_version}", "kind": "DeviceTaintRule", "metadata": {"name": rule},
            "spec": {"deviceSelector": {}, "taint": {"key": "example.com/oops", "effect": "NoSchedule"}}})
        # a record of a device no slice publishes
        custom.create_cluster_custom_object(*RECORDS, {
            "apiVersion": "claimwarden.io/v1alpha1", "kind": "UnhealthyDevice", "metadata": {"name": ghost_record},
            "spec": {"driver": DRIVER, "pool": "kwok-node-9", "device": "gpu-0", "effect": "NoSchedule",
                     "reason": "node retired", "source": "manual"}})

        result = run(lab, "doctor", "--pending-after=0s", "--stuck-after=0s", "-o", "json")
        assert result.returncode == 1, result.stderr
        findings = json.loads(result.stdout)["findings"]
        found = {(f["check"], o) for f in findings for o in f["objects"]}
        expected = {
            ("leaked-device", f"resourceclaim/{ns}/leaked"),
            ("stale-reservation", f"resourceclaim/{ns}/stale"),
            ("reservation-limit", f"resourceclaim/{ns}/crowded"),
            ("stuck-deletion", f"resourceclaim/{ns}/stuck"),
            ("orphaned-claim", f"resourceclaim/{ns}/orphan"),
            ("pending-pod", f"pod/{ns}/waiting"),
            ("taint-rule-selects-all", f"devicetaintrule/{rule}"),
            ("marked-device-has-pods", f"pod/{ns}/busy"),
            ("record-without-device", f"unhealthydevice/{ghost_record}"),
        }
        assert expected <= found, f"not found: {expected - found}\n{result.stdout}"
        pending = next(f for f in findings if f["check"] == "pending-pod")
        assert "blocked by" in pending["message"]
        names = run(lab, "doctor", "--pending-after=0s", "--stuck-after=0s", "-o", "name").stdout.splitlines()
        assert {o for _, o in expected} <= set(names) and len(names) == len(set(names)), names
        text = run(lab, "doctor", "--pending-after=0s", "--stuck-after=0s", "-n", ns)
        assert text.returncode == 1 and "ERROR   leaked-device" in text.stdout, text.stdout
        print(text.stdout)
    finally:
        if busy_node:
            cleared = run(lab, "clear", f"{busy_node}/gpu-0")
            assert cleared.returncode == 0, cleared.stderr
        for delete in (lambda: custom.delete_cluster_custom_object("resource.k8s.io", rule_version,
                                                                   "devicetaintrules", rule),
                       lambda: custom.delete_cluster_custom_object(*RECORDS, ghost_record)):
            try:
                delete()
            except client.ApiException as exc:
                if exc.status != 404:
                    raise
        for pod in ("busy", "owner", "waiting"):
            release(api, ns, pod, [])
        release(api, ns, "-", claims)
        core.delete_namespace(ns)
        wait_for("the doctor namespace to go", lambda: not [n for n in core.list_namespace().items
                                                             if n.metadata.name == ns], timeout=60)
    assert run(lab, "doctor").returncode == 0


def test_verbs_exit_codes_and_one_line_errors(plugin_lab: tuple[LabState, client.ApiClient]) -> None:
    lab, api = plugin_lab
    core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
    ns = f"verbs-{uuid.uuid4().hex[:5]}"
    core.create_namespace({"metadata": {"name": ns}})
    try:
        custom.create_namespaced_custom_object("resource.k8s.io", "v1", ns, "resourceclaims", _claim("one"))
        core.create_namespaced_pod(ns, _pod("trainer", ["one"]))
        assert decision(api, ns, "trainer")[0]
        allocated = run(lab, "explain", "pod/trainer", "-n", ns)
        assert allocated.returncode == 0 and "allocated" in allocated.stdout, allocated.stdout
        custom.create_namespaced_custom_object("resource.k8s.io", "v1", ns, "resourceclaims", _claim("nine", count=9))
        core.create_namespaced_pod(ns, _pod("big", ["nine"]))
        assert not decision(api, ns, "big")[0]
        blocked = run(lab, "explain", "pod/big", "-n", ns)
        assert blocked.returncode == 1 and "verdict: blocked by count" in blocked.stdout, blocked.stdout
        as_json = json.loads(run(lab, "explain", "resourceclaim/nine", "-n", ns, "-o", "json").stdout)
        assert as_json["verdict"]["step"] == "count"
        devices = run(lab, "devices", "--state", "allocated")
        assert devices.returncode == 0 and f"{ns}/trainer" in devices.stdout, devices.stdout
        held = json.loads(run(lab, "devices", "--state", "allocated", "-o", "json").stdout)["devices"]
        named = run(lab, "devices", "--state", "allocated", "-o", "name")
        assert named.stdout.splitlines() == [f"{d['driver']}/{d['pool']}/{d['device']}" for d in held], named.stdout
        # bad input: one line naming the fix, exit 2, never a traceback
        for args, words in [(("explain", "pod/nope", "-n", ns), "not found"),
                            (("explain", "deployment/x"), "pod/NAME or resourceclaim/NAME"),
                            (("devices", "-l", "model=(H100"), "cannot parse -l"),
                            (("mark", "kwok-node-0/gpu-99", "--reason", "x"), "no ResourceSlice publishes"),
                            (("clear", "kwok-node-0/gpu-1"), "is not marked")]:
            bad = run(lab, *args)
            assert bad.returncode == 2 and words in bad.stderr and "Traceback" not in bad.stderr, (args, bad.stderr)
            assert len(bad.stderr.strip().splitlines()) == 1, bad.stderr
        unreachable = subprocess.run([str(PLUGIN), "devices", "--kubeconfig=/nonexistent"], capture_output=True,
                                     text=True, timeout=30)
        assert unreachable.returncode == 3 and "Traceback" not in unreachable.stderr, unreachable.stderr
        # mark writes the documented record (manual), clear deletes it
        marked = run(lab, "mark", f"{DRIVER}/kwok-node-1/gpu-3", "--reason", "fan", "--effect", "None",
                     "--expires", "1h")
        assert marked.returncode == 0, marked.stderr
        records = custom.list_cluster_custom_object(*RECORDS)["items"]
        record = next(r for r in records if r["spec"]["device"] == "gpu-3" and r["spec"]["pool"] == "kwok-node-1")
        assert record["spec"]["source"] == "manual" and record["spec"]["effect"] == "None"
        assert record["spec"]["expiresAt"]
        assert "marked" in run(lab, "devices", "--node", "kwok-node-1", "--state", "marked").stdout
        assert run(lab, "clear", "kwok-node-1/gpu-3").returncode == 0
        assert not [r for r in custom.list_cluster_custom_object(*RECORDS)["items"]
                    if r["metadata"]["name"] == record["metadata"]["name"]]
        # --drain writes spec.drain as the CRD's rule accepts it (EvictAfter=90m: nobody is evicted in this test)
        drained = run(lab, "mark", "kwok-node-1/gpu-2", "--reason", "ecc", "--drain", "EvictAfter=90m", "-o", "json")
        assert drained.returncode == 0, drained.stderr
        assert json.loads(drained.stdout)["spec"]["drain"] == "EvictAfter=1h30m"
        assert run(lab, "clear", "kwok-node-1/gpu-2").returncode == 0
    finally:
        release(api, ns, "trainer", ["one"])
        release(api, ns, "big", ["nine"])
        core.delete_namespace(ns)


def test_kubectl_finds_the_plugin(plugin_lab: tuple[LabState, client.ApiClient]) -> None:
    lab, _ = plugin_lab
    env = {**os.environ, "PATH": f"{PLUGIN.parent}:{os.environ.get('PATH', '')}"}
    listed = subprocess.run([f"{lab.bin_dir}/kubectl", "plugin", "list"], capture_output=True, text=True, env=env)
    assert "kubectl-claimwarden" in listed.stdout, listed.stdout + listed.stderr
    helped = subprocess.run([f"{lab.bin_dir}/kubectl", "claimwarden", "--help"], capture_output=True, text=True,
                            env=env)
    assert helped.returncode == 0 and "explain" in helped.stdout and "doctor" in helped.stdout, helped.stderr
    version = json.loads(run(lab, "version", "-o", "json").stdout)
    assert version["crds"] == {"unhealthydevices": True, "healthpolicies": True}, version
    assert version["serverVersion"]["gitVersion"].startswith("v1."), version
    assert QUARANTINE_NAMESPACE  # the plugin's default --claimwarden-namespace matches the operator's
