"""A watch that re-lists after objects were deleted: nothing deleted meanwhile may linger in claimwarden.

claimwarden is frozen (SIGSTOP) while pods, a claim and a record are deleted; etcd is then compacted
and kube-apiserver restarted, so every watch that resumes from its old resourceVersion gets 410 Gone
and lists again. A list shows what exists, never what was deleted: claimwarden must find those by
itself, within one resync period, and must not release or evict anything that is still in use.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from kubernetes import client

from claimwarden_lab import cluster, disruptions

from .conftest import service_account_kubeconfig
from .health_helpers import create_record, delete_record, device_of, holders
from .helpers import gpu_claim_spec, pod_with_claims, template, wait_for
from .operator import Operator

RESYNC = 20
TEMPLATE_CLAIM = [{"name": "gpu", "resourceClaimTemplateName": "single-gpu"}]
OWN_NAMESPACE = "claimwarden-system"


def _running(core: client.CoreV1Api, namespace: str, name: str) -> bool:
    return bool(core.read_namespaced_pod(name, namespace).status.phase == "Running")


def _claim_of(core: client.CoreV1Api, namespace: str, pod: str) -> str:
    statuses = core.read_namespaced_pod(pod, namespace).status.resource_claim_statuses or []
    return str(statuses[0].resource_claim_name)


def _quarantined(api: client.ApiClient, pool: str, device: str) -> bool:
    return any(h.startswith(f"{OWN_NAMESPACE}/") for h in holders(api, pool, device))


def _free_device(api: client.ApiClient, pool: str, skip: set[str]) -> str:
    for index in range(7, -1, -1):
        device = f"gpu-{index}"
        if device not in skip and not holders(api, pool, device):
            return device
    raise AssertionError(f"no free device on {pool}")


@pytest.mark.audit(expect_log=[r"storage is \(re\)initializing", r"Request attempt #\d+/\d+ failed; will retry"],
                   reason="kube-apiserver is restarted on purpose; Kopf logs its retries of the watches at ERROR")
def test_objects_deleted_while_watches_were_down_are_forgotten_within_one_resync(
        api: client.ApiClient, namespace: str, lab: cluster.LabState, operator_process: Operator,
        tmp_path: Path) -> None:
    core, resource = client.CoreV1Api(api), client.ResourceV1Api(api)
    pool, kept_device = "kwok-node-1", ""
    with operator_process.stopped():
        operator = Operator(service_account_kubeconfig(lab), tmp_path / "claimwarden.log",
                            ["--resync-period", str(RESYNC)])
        operator.start()
        try:
            resource.create_namespaced_resource_claim_template(namespace, body=template("single-gpu"))
            resource.create_namespaced_resource_claim(namespace, body={"metadata": {"name": "shared"},
                                                                       "spec": gpu_claim_spec()})
            for name in ("gone", "stays"):
                core.create_namespaced_pod(namespace, body=pod_with_claims(name, TEMPLATE_CLAIM))
            core.create_namespaced_pod(namespace, body=pod_with_claims(
                "user", [{"name": "gpu", "resourceClaimName": "shared"}]))
            for name in ("gone", "stays", "user"):
                wait_for(f"{name} Running", lambda name=name: _running(core, namespace, name))
            gone_claim, stays_claim = _claim_of(core, namespace, "gone"), _claim_of(core, namespace, "stays")
            in_use = {device_of(api, namespace, name)[1] for name in ("gone", "stays", "user")}
            dropped_device = _free_device(api, pool, in_use)
            kept_device = _free_device(api, pool, in_use | {dropped_device})
            create_record(api, f"dropped-{namespace}", pool, dropped_device, "NoSchedule", "deleted while down")
            create_record(api, f"kept-{namespace}", pool, kept_device, "NoSchedule", "still marked")
            for device in (dropped_device, kept_device):
                wait_for(f"{device} quarantined", lambda device=device: _quarantined(api, pool, device), 30)

            operator.freeze()
            try:
                core.delete_namespaced_pod("gone", namespace, grace_period_seconds=0)
                core.delete_namespaced_pod("user", namespace, grace_period_seconds=0)
                resource.delete_namespaced_resource_claim("shared", namespace)
                delete_record(api, f"dropped-{namespace}")
                wait_for("the deleted pods gone", lambda: {p.metadata.name for p in core.list_namespaced_pod(
                    namespace).items} == {"stays"}, 30)
                revision = disruptions.compact_etcd(lab)
                disruptions.restart_apiserver(lab, say=print)
                print(f"etcd compacted at revision {revision}; kube-apiserver restarted")
            finally:
                operator.thaw()

            def converged() -> bool:
                names = {c.metadata.name for c in resource.list_namespaced_resource_claim(namespace).items}
                return gone_claim not in names and "shared" not in names and not _quarantined(
                    api, pool, dropped_device)

            wait_for("every object deleted while claimwarden was frozen released", converged, RESYNC + 45)
            assert _quarantined(api, pool, kept_device), "a live record's quarantine was released"
            stays = resource.read_namespaced_resource_claim(stays_claim, namespace)
            assert stays.status.allocation is not None
            assert [r.name for r in stays.status.reserved_for or []] == ["stays"]
            assert _running(core, namespace, "stays")
            assert "forgot pods" in operator.log_path.read_text()
        finally:
            if kept_device:
                delete_record(api, f"kept-{namespace}")
                wait_for("the kept device released", lambda: not _quarantined(api, pool, kept_device), 30)
            assert operator.stop() == 0
