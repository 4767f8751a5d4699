"""The auditor fires on real violations planted in the lab, one per rule.

The test calls the check of its own autouse auditor (the `audit` fixture), which consumes what
it read, then removes what it planted, so that the same auditor passes at teardown.
"""

from __future__ import annotations

import time
from typing import Any

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from claimwarden_lab.cluster import LabState

from .auditor import QUARANTINE_NAMESPACE, RECORD_LABEL, Audit
from .conftest import service_account_kubeconfig
from .helpers import gpu_claim_spec, wait_for
from .operator import LOG_PATHS, Operator

# The last devices of the second node: the session lab's tests use the lowest free ones first.
POOL = "kwok-node-1"


def _allocation(device: str) -> dict[str, Any]:
    return {"devices": {"results": [{"request": "gpu", "driver": "gpu.example.com", "pool": POOL, "device": device}]},
            "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                {"key": "metadata.name", "operator": "In", "values": [POOL]}]}]}}


def _claim_with_status(resource: client.ResourceV1Api, namespace: str, name: str, status: dict[str, Any],
                       labels: dict[str, str] | None = None) -> None:
    resource.create_namespaced_resource_claim(namespace, body={
        "metadata": {"name": name, "labels": labels or {}}, "spec": gpu_claim_spec()})
    resource.patch_namespaced_resource_claim_status(name, namespace, {"status": status})


def _evict(core: client.CoreV1Api, namespace: str, name: str) -> None:
    """Evict the pod, retrying the rare 404 of a pod created a moment ago under a just-deleted pod's name."""
    for attempt in range(10):
        try:
            core.create_namespaced_pod_eviction(name, namespace, body={"metadata": {"name": name,
                                                                                    "namespace": namespace}})
            return
        except ApiException as exc:
            if exc.status != 404 or attempt == 9:
                raise
            time.sleep(0.5)


def _plain_pod(name: str) -> dict[str, Any]:
    # Never scheduled, so kwok never handles it: kwok deletes evicted pods by name, and a late delete of
    # the first "twice" could otherwise remove the second one.
    return {"metadata": {"name": name}, "spec": {"terminationGracePeriodSeconds": 0, "schedulerName": "nobody",
                                                 "containers": [{"name": "c", "image": "registry.example/busybox:1"}]}}


def _pod_gone(core: client.CoreV1Api, namespace: str, name: str) -> bool:
    try:
        core.read_namespaced_pod(name, namespace)
    except ApiException as exc:
        return exc.status == 404
    return False


def test_each_rule_fires_on_a_planted_violation(lab: LabState, api: client.ApiClient, namespace: str,
                                                audit: Audit, operator_process: Operator,
                                                tmp_path_factory: Any) -> None:
    core, resource = client.CoreV1Api(api), client.ResourceV1Api(api)
    # claimwarden would clean up some of what is planted here (rightly): keep it away meanwhile.
    with operator_process.stopped():
        # A hot object: 21 writes to one claim as claimwarden's ServiceAccount.
        resource.create_namespaced_resource_claim(namespace, body={"metadata": {"name": "hot"},
                                                                   "spec": gpu_claim_spec()})
        with config.new_client_from_config(config_file=str(service_account_kubeconfig(lab))) as as_claimwarden:
            for i in range(21):
                client.ResourceV1Api(as_claimwarden).patch_namespaced_resource_claim(
                    "hot", namespace, {"metadata": {"labels": {"write": str(i)}}})

        # One pod (by name) evicted twice.
        for _ in range(2):
            core.create_namespaced_pod(namespace, body=_plain_pod("twice"))
            _evict(core, namespace, "twice")
            wait_for("the evicted pod gone", lambda: _pod_gone(core, namespace, "twice"), 30)

        # A traceback in a claimwarden log.
        log = tmp_path_factory.mktemp("planted") / "claimwarden.log"
        Operator(service_account_kubeconfig(lab), log)  # registers the log; never started
        log.write_text("[2026-12-01 12:00:00,000] kopf.objects [ERROR   ] Handler failed\n"
                       "Traceback (most recent call last):\nRuntimeError: planted\n")

        # A quarantine claim whose record does not exist.
        _claim_with_status(resource, QUARANTINE_NAMESPACE, "planted-orphan", {"allocation": _allocation("gpu-7")},
                           labels={RECORD_LABEL: "no-such-record"})

        # One device allocated to two claims (as admin, as a broken controller might).
        for name in ("double-a", "double-b"):
            _claim_with_status(resource, namespace, name, {"allocation": _allocation("gpu-6")})

        # A reservation for a pod that never existed.
        _claim_with_status(resource, namespace, "stale", {"allocation": _allocation("gpu-5"), "reservedFor": [
            {"resource": "pods", "name": "ghost", "uid": "00000000-0000-0000-0000-000000000000"}]})

        started = time.monotonic()
        try:
            problems = audit.check(converge=15)
        finally:
            # Remove what was planted, before claimwarden comes back: the teardown audit must pass.
            LOG_PATHS.remove(log)
            resource.delete_namespaced_resource_claim("planted-orphan", QUARANTINE_NAMESPACE)
            for name in ("double-a", "double-b", "stale"):
                resource.delete_namespaced_resource_claim(name, namespace)
    assert time.monotonic() - started > 10, "a stale reservation counts only once it lasted 10 s"

    text = "\n".join(problems)
    assert f"resourceclaims.resource.k8s.io {namespace}/hot 21 times (bound 20): 21 patch" in text, text
    assert f"pod {namespace}/twice was evicted 2 times" in text, text
    assert f"a traceback in {log}" in text and "Handler failed" in text, text
    assert f"quarantine claim ResourceClaim {QUARANTINE_NAMESPACE}/planted-orphan names record " \
           "'no-such-record', which is gone" in text, text
    assert f"ResourceClaim {QUARANTINE_NAMESPACE}/planted-orphan appeared during the test" in text, text
    assert (f"gpu.example.com/{POOL}/gpu-6 is allocated to 2 claims: {namespace}/double-a, {namespace}/double-b"
            in text), text
    assert f"claim {namespace}/stale is reserved for pod ghost" in text, text
    assert len(problems) == 8, text  # the planted ERROR line and its traceback are two
