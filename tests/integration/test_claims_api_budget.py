"""--kube-api-qps/--kube-api-burst: claimwarden's own requests stay within the budget it was given.

Counted from the apiserver's audit log, which records every write claimwarden's ServiceAccount makes.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

from kubernetes import client

from claimwarden_lab import cluster
from claimwarden_lab.audit_policy import CLAIMWARDEN_USER

from .auditor import LabAudit
from .conftest import service_account_kubeconfig
from .helpers import create_pods, pod_with_claims, template, wait_for
from .operator import Operator

QPS, BURST, PODS = 2.0, 2, 8
# The template asks for a model no lab node has: the pods never schedule, so each costs claimwarden
# exactly two writes (create the claim, record it in the pod's status) and nothing else.
UNSATISFIABLE = {"devices": {"requests": [{"name": "gpu", "exactly": {
    "deviceClassName": "gpu.example.com",
    "selectors": [{"cel": {"expression": "device.attributes['gpu.example.com'].model == 'none'"}}]}}]}}


def _received(event: dict[str, object]) -> float:
    return datetime.fromisoformat(str(event["requestReceivedTimestamp"]).replace("Z", "+00:00")).timestamp()


def test_writes_are_spaced_by_the_client_budget(api: client.ApiClient, namespace: str, lab: cluster.LabState,
                                                operator_process: Operator, tmp_path: Path) -> None:
    core = client.CoreV1Api(api)
    with operator_process.stopped():
        operator = Operator(service_account_kubeconfig(lab), tmp_path / "claimwarden.log",
                            ["--leader-elect=false", f"--kube-api-qps={QPS:g}", f"--kube-api-burst={BURST}"])
        operator.start()
        try:
            audit = LabAudit(lab)
            client.ResourceV1Api(api).create_namespaced_resource_claim_template(
                namespace, body=template("unsatisfiable", UNSATISFIABLE))
            create_pods(api, namespace, [pod_with_claims(f"pod-{i}", [
                {"name": "gpu", "resourceClaimTemplateName": "unsatisfiable"}]) for i in range(PODS)])
            wait_for("every pod's claim recorded", lambda: all(
                p.status.resource_claim_statuses for p in core.list_namespaced_pod(namespace).items), 60)
            # This namespace's only: a fresh claimwarden also finishes what earlier tests left elsewhere.
            events = [e for e in audit.new_events()
                      if e.get("user", {}).get("username") == CLAIMWARDEN_USER
                      and e.get("objectRef", {}).get("namespace") == namespace]
        finally:
            operator.stop()
    writes = sorted(_received(e) for e in events)
    kinds = sorted({f"{e['verb']} {e['objectRef'].get('resource')}" for e in events})
    assert kinds == ["create resourceclaims", "patch pods"], kinds
    assert len(writes) == 2 * PODS, f"{len(writes)} writes for {PODS} pods: {kinds}"
    # A burst, then one request per 1/QPS: 16 writes need at least (16 - 2) / 2 = 7 s (unlimited: well under 1 s).
    span = writes[-1] - writes[0]
    assert span >= (len(writes) - BURST) / QPS - 0.5, f"{len(writes)} writes in {span:.2f} s at --kube-api-qps={QPS:g}"
    for i in range(len(writes) - BURST - 1):
        window = writes[i + BURST + 1] - writes[i]
        assert window >= 2 / QPS - 0.2, f"{BURST + 2} writes within {window:.2f} s starting at write {i}"
