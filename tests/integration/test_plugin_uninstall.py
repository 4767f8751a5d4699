"""`kubectl claimwarden uninstall --check` on the shared lab: it names a marked device, its quarantine claim and
the removal step that would free it (exit 1); once the mark is cleared, nothing is left to release (exit 0). It
reads only: the audit log shows no write of the plugin's.

`uninstall --hand-over` on a small lab of its own that serves DeviceTaintRule (preset device-taints): one unowned
NoSchedule rule per marked device, a second run writes nothing, and with the marks gone the scheduler still keeps
a pod off the device.

The lab's audit policy records the writes of claimwarden's ServiceAccount only, so the plugin runs here with that
ServiceAccount's token; its requests are told from the operator's by their user agent (claimwarden/...).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, config

from claimwarden.plugin.uninstall import hand_over_name
from claimwarden_lab.audit_policy import CLAIMWARDEN_USER
from claimwarden_lab.cluster import LabState

from .auditor import WRITE_VERBS, LabAudit
from .conftest import extra_lab, service_account_kubeconfig
from .differential import decision
from .health_helpers import GROUP, PLURAL, VERSION, holders
from .helpers import taint_rule_version, wait_for
from .operator import Operator

PLUGIN = Path(sys.executable).parent / "kubectl-claimwarden"
DRIVER = "gpu.example.com"
QUARANTINE_NAMESPACE = "claimwarden-system"


def plugin(lab: LabState, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(PLUGIN), *args, f"--kubeconfig={service_account_kubeconfig(lab)}"],
                          capture_output=True, text=True, timeout=60)


def _free_device(api: client.ApiClient) -> tuple[str, str]:
    """A device of the shared lab that no claim holds, from the end (other tests take devices from the start)."""
    held = {(r.pool, r.device) for c in client.ResourceV1Api(api).list_resource_claim_for_all_namespaces().items
            if c.status and c.status.allocation for r in c.status.allocation.devices.results}
    for node in ("kwok-node-1", "kwok-node-0"):
        for index in range(7, -1, -1):
            if (node, f"gpu-{index}") not in held:
                return node, f"gpu-{index}"
    raise AssertionError("every device of the shared lab is held")


def _plugin_writes(events: list[dict[str, Any]]) -> list[str]:
    """Writes as claimwarden's ServiceAccount by anything but the operator (whose user agent is claimwarden/...)."""
    return [f"{e.get('verb')} {e.get('requestURI')} ({e.get('userAgent')})" for e in events
            if e.get("stage") == "ResponseComplete" and e.get("verb") in WRITE_VERBS
            and (e.get("user") or {}).get("username") == CLAIMWARDEN_USER
            and not str(e.get("userAgent", "")).startswith("claimwarden/")]


def test_uninstall_check_names_the_marked_device_its_quarantine_claim_and_writes_nothing(
        api: client.ApiClient, lab: LabState, claimwarden: Operator) -> None:
    pool, device = _free_device(api)
    target = f"{DRIVER}/{pool}/{device}"
    audit = LabAudit(lab)
    marked = plugin(lab, "mark", f"{pool}/{device}", "--reason", "uninstall check", "--effect", "NoSchedule")
    assert marked.returncode == 0, marked.stderr
    # The audit sees the plugin's writes: mark's record is one.
    assert any("unhealthydevices" in w for w in _plugin_writes(audit.new_events()))
    try:
        quarantine = wait_for("the device's quarantine claim", lambda: [
            h for h in holders(api, pool, device) if h.startswith(f"{QUARANTINE_NAMESPACE}/")], 30)
        served = taint_rule_version(api) is not None
        audit = LabAudit(lab)
        checked = plugin(lab, "uninstall", "--check", "-o", "json")
        text = plugin(lab, "uninstall", "--check")
        writes = _plugin_writes(audit.new_events())
        assert checked.returncode == 1, checked.stdout + checked.stderr
        assert text.returncode == 1, text.stdout + text.stderr
        found = json.loads(checked.stdout)
        mine = [d for d in found["devices"] if d["device"] == target]
        assert len(mine) == 1, found
        assert mine[0]["quarantineClaims"] == quarantine and mine[0]["effect"] == "NoSchedule"
        assert mine[0]["otherHolders"] == [] and mine[0]["lastingTaintRules"] == []
        # Where DeviceTaintRule is served claimwarden's rule (owned by the record) lasts until the CRDs go.
        assert mine[0]["releasedBy"] == ("crds" if served else "namespace"), mine[0]
        assert found["taintRulesServed"] is served and found["wouldRelease"] >= 1
        assert f"{target} (node {pool}): marked NoSchedule (uninstall check)" in text.stdout
        assert f"quarantine claim {quarantine[0]}" in text.stdout
        print(f"$ kubectl claimwarden uninstall --check\n{text.stdout}")
        assert writes == [], writes
    finally:
        cleared = plugin(lab, "clear", f"{pool}/{device}")
    assert cleared.returncode == 0, cleared.stderr
    wait_for("the quarantine claim released", lambda: not holders(api, pool, device), 30)
    audit = LabAudit(lab)
    after = plugin(lab, "uninstall", "--check")
    assert after.returncode == 0, after.stdout + after.stderr
    assert after.stdout.strip() == "no marked devices: an uninstall releases nothing"
    assert _plugin_writes(audit.new_events()) == []


def test_hand_over_leaves_an_unowned_noschedule_rule_that_keeps_the_device_off_without_the_marks(
        tmp_path_factory: pytest.TempPathFactory) -> None:
    with extra_lab(tmp_path_factory, nodes=1, gpus_per_node=2, presets="device-taints") as lab, \
            config.new_client_from_config(config_file=str(lab.kubeconfig)) as api:
        version = taint_rule_version(api)
        assert version, "the lab must serve DeviceTaintRule (preset device-taints)"
        custom, core = client.CustomObjectsApi(api), client.CoreV1Api(api)
        for device, effect in (("gpu-0", "NoExecute"), ("gpu-1", "NoSchedule")):
            marked = plugin(lab, "mark", f"kwok-node-0/{device}", "--reason", "XID 79", "--effect", effect)
            assert marked.returncode == 0, marked.stderr
        # gpu-1 is kept off by a rule of someone else's already: no hand-over rule for it
        custom.create_cluster_custom_object("resource.k8s.io", version, "devicetaintrules", {
            "apiVersion": f"resource.k8s.io/{version}", "kind": "DeviceTaintRule", "metadata": {"name": "theirs"},
            "spec": {"deviceSelector": {"driver": DRIVER, "pool": "kwok-node-0", "device": "gpu-1"},
                     "taint": {"key": "example.com/repair", "effect": "NoSchedule"}}})

        # A rule of someone else's under the hand-over rule's name is never overwritten: exit 2, nothing written.
        squatter = hand_over_name((DRIVER, "kwok-node-0", "gpu-0"))
        custom.create_cluster_custom_object("resource.k8s.io", version, "devicetaintrules", {
            "apiVersion": f"resource.k8s.io/{version}", "kind": "DeviceTaintRule", "metadata": {"name": squatter},
            "spec": {"deviceSelector": {"driver": DRIVER, "pool": "kwok-node-0", "device": "gpu-1"},
                     "taint": {"key": "example.com/other", "effect": "NoSchedule"}}})
        refused = plugin(lab, "uninstall", "--hand-over")
        assert refused.returncode == 2, refused.stdout + refused.stderr
        assert f"devicetaintrule {squatter} exists and is not the hand-over rule of {DRIVER}/kwok-node-0/gpu-0" \
            in refused.stderr
        rules = custom.list_cluster_custom_object("resource.k8s.io", version, "devicetaintrules")["items"]
        assert sorted(r["metadata"]["name"] for r in rules) == sorted([squatter, "theirs"])
        custom.delete_cluster_custom_object("resource.k8s.io", version, "devicetaintrules", squatter)

        first = plugin(lab, "uninstall", "--hand-over", "-o", "json")
        assert first.returncode == 0, first.stdout + first.stderr
        written = json.loads(first.stdout)
        assert written["alreadyKeptOff"] == [f"{DRIVER}/kwok-node-0/gpu-1"] and len(written["written"]) == 1
        name = written["written"][0]
        rule = custom.get_cluster_custom_object("resource.k8s.io", version, "devicetaintrules", name)
        assert not rule["metadata"].get("ownerReferences")
        assert rule["metadata"]["labels"] == {"claimwarden.io/handed-over": "true"}
        assert rule["spec"]["deviceSelector"] == {"driver": DRIVER, "pool": "kwok-node-0", "device": "gpu-0"}
        assert rule["spec"]["taint"]["effect"] == "NoSchedule"
        again = plugin(lab, "uninstall", "--hand-over")
        assert again.returncode == 0, again.stdout + again.stderr
        assert "0 rule(s) written; 2 of 2 marked device(s) stay kept off" in again.stdout, again.stdout
        assert custom.get_cluster_custom_object("resource.k8s.io", version, "devicetaintrules", name)[
            "metadata"]["resourceVersion"] == rule["metadata"]["resourceVersion"]
        checked = plugin(lab, "uninstall", "--check", "-o", "json")
        assert checked.returncode == 0, checked.stdout + checked.stderr
        assert [(d["lastingTaintRules"], d["releasedBy"]) for d in json.loads(checked.stdout)["devices"]] == [
            ([name], None), (["theirs"], None)]

        # The uninstall takes the records (as deleting the CRDs would); the rule stays and keeps new pods off.
        for record in custom.list_cluster_custom_object(GROUP, VERSION, PLURAL)["items"]:
            custom.delete_cluster_custom_object(GROUP, VERSION, PLURAL, record["metadata"]["name"])
        namespace = "handed-over"
        core.create_namespace({"metadata": {"name": namespace}})
        custom.create_namespaced_custom_object("resource.k8s.io", "v1", namespace, "resourceclaims", {
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": "gpu-0"},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                "deviceClassName": DRIVER, "selectors": [
                    {"cel": {"expression": 'device.attributes["gpu.example.com"].index == 0'}}]}}]}}})
        core.create_namespaced_pod(namespace, {
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "wants-gpu-0"},
            "spec": {"terminationGracePeriodSeconds": 0, "containers": [{"name": "c", "image": "registry.example/x:1",
                                                                          "resources": {"claims": [{"name": "g"}]}}],
                     "resourceClaims": [{"name": "g", "resourceClaimName": "gpu-0"}]}})
        bound, why = decision(api, namespace, "wants-gpu-0")
        assert not bound, why
        print(f"wants-gpu-0: {why}")
        # ...and it is the rule that does: deleted by hand (the device repaired), the pod gets the device.
        for leftover in (name, "theirs"):
            custom.delete_cluster_custom_object("resource.k8s.io", version, "devicetaintrules", leftover)
        wait_for("the pod bound once the hand-over rule is deleted",
                 lambda: core.read_namespaced_pod("wants-gpu-0", namespace).spec.node_name, 30)
        core.delete_namespaced_pod("wants-gpu-0", namespace, grace_period_seconds=0)
        core.delete_namespace(namespace)
