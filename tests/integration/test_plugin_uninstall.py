"""`kubectl claimwarden uninstall --check` on the shared lab: it names a marked device, its quarantine claim and
the removal step that would free it (exit 1); once the mark is cleared, nothing is left to release (exit 0). It
reads only: the audit log shows no write of the plugin's.

The lab's audit policy records the writes of claimwarden's ServiceAccount only, so the plugin runs here with that
ServiceAccount's token; its requests are told from the operator's by their user agent (claimwarden/...).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from kubernetes import client

from claimwarden_lab.cluster import CLAIMWARDEN_USER, LabState

from .auditor import WRITE_VERBS, LabAudit
from .conftest import service_account_kubeconfig
from .health_helpers import holders
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
