"""Two replicas, one leader: hand-overs on SIGKILL, SIGTERM and a frozen leader, and fencing.

The replicas are processes against the lab with the ServiceAccount's token (kwok runs no
containers); each has its own identity (POD_NAME) and user agent, so the apiserver's audit log
tells which replica wrote what.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from claimwarden_lab.cluster import LabState

from .auditor import LabAudit
from .conftest import service_account_kubeconfig
from .helpers import pod_with_claims, template, wait_for
from .operator import Operator

LEASE = ("claimwarden-system", "claimwarden")
TEMPLATE_CLAIM = [{"name": "gpu", "resourceClaimTemplateName": "single-gpu"}]
LEASE_SECONDS, RETRY_SECONDS = 15, 2


@pytest.fixture
def replicas(lab: LabState, claimwarden: Operator, tmp_path: Path) -> Iterator[list[Operator]]:
    """Two claimwarden replicas (the session's one is stopped meanwhile, and after them cleans up the
    test's namespace); the first one leads."""
    with claimwarden.stopped():
        first = Operator(service_account_kubeconfig(lab), tmp_path / "a.log", identity="replica-a")
        second = Operator(service_account_kubeconfig(lab), tmp_path / "b.log", identity="replica-b")
        try:
            first.start()
            second.start(lead=False)
            yield [first, second]
        finally:
            for replica in (first, second):
                if replica.running:
                    replica.stop()


def _holder(api: client.ApiClient) -> str:
    lease = client.CoordinationV1Api(api).read_namespaced_lease(LEASE[1], LEASE[0])
    return str(lease.spec.holder_identity or "")


def _generates_claims(api: client.ApiClient, namespace: str, pod: str) -> None:
    core = client.CoreV1Api(api)
    core.create_namespaced_pod(namespace, body=pod_with_claims(pod, TEMPLATE_CLAIM))
    wait_for(f"{pod}'s claim recorded", lambda: core.read_namespaced_pod(pod, namespace).status.resource_claim_statuses,
             30)


def _writers(events: list[dict[str, Any]]) -> dict[str, list[str]]:
    """User agent -> the non-lease objects it wrote (as claimwarden)."""
    found: dict[str, list[str]] = {}
    for event in events:
        ref = event.get("objectRef") or {}
        if event.get("stage") != "ResponseComplete" or ref.get("resource") == "leases":
            continue
        if not str((event.get("user") or {}).get("username", "")).endswith(":claimwarden"):
            continue
        found.setdefault(str(event.get("userAgent")), []).append(f"{ref.get('resource')}/{ref.get('name')}")
    return found


def test_only_the_leader_runs_the_controllers_and_the_standby_reports_zero(
        api: client.ApiClient, namespace: str, lab: LabState, replicas: list[Operator]) -> None:
    _, standby = replicas
    audit = LabAudit(lab)
    assert _holder(api) == "replica-a"
    time.sleep(RETRY_SECONDS * 2)
    assert standby.running and not standby.leads()
    assert "\nclaimwarden_leader 0.0" in standby.metrics()
    # The cluster's gauges come from the leader only, so that sums over replicas stay true.
    assert "claimwarden_resource_claims{" not in standby.metrics()
    client.ResourceV1Api(api).create_namespaced_resource_claim_template(namespace, body=template("single-gpu"))
    _generates_claims(api, namespace, "work")
    writers = _writers(audit.new_events())
    assert set(writers) == {"claimwarden/0.1.0 (replica-a)"}, writers


def test_a_killed_leader_is_replaced_within_a_lease_duration_plus_a_retry(
        api: client.ApiClient, namespace: str, replicas: list[Operator]) -> None:
    leader, standby = replicas
    client.ResourceV1Api(api).create_namespaced_resource_claim_template(namespace, body=template("single-gpu"))
    leader.kill()
    killed = time.monotonic()
    wait_for("the standby to lead", standby.leads, LEASE_SECONDS + RETRY_SECONDS + 10, interval=0.2)
    failover = time.monotonic() - killed
    print(f"failover after SIGKILL: {failover:.1f} s")
    assert failover <= LEASE_SECONDS + RETRY_SECONDS + 1.5, failover  # 1.5 s: the metrics poll and scheduling
    assert _holder(api) == "replica-b"
    _generates_claims(api, namespace, "after-kill")


def test_sigterm_hands_the_lease_over_in_seconds(api: client.ApiClient, namespace: str,
                                                 replicas: list[Operator]) -> None:
    leader, standby = replicas
    stopped = time.monotonic()
    assert leader.stop() == 0
    wait_for("the standby to lead", standby.leads, 10, interval=0.2)
    handover = time.monotonic() - stopped
    print(f"hand-over after SIGTERM (stop included): {handover:.1f} s")
    assert handover <= 5 + 2, handover  # target 5 s; the stop itself waits for the drain of the workers
    assert _holder(api) == "replica-b"


@pytest.mark.audit(expect_log=[r"lost the lease"], reason="the frozen leader must give up and say so")
def test_a_frozen_leader_writes_nothing_after_the_takeover_and_exits_non_zero(
        api: client.ApiClient, namespace: str, lab: LabState, replicas: list[Operator]) -> None:
    leader, standby = replicas
    resource, core = client.ResourceV1Api(api), client.CoreV1Api(api)
    resource.create_namespaced_resource_claim_template(namespace, body=template("single-gpu"))
    leader.freeze()
    try:
        wait_for("the standby to take over", standby.leads, LEASE_SECONDS + RETRY_SECONDS + 10, interval=0.2)
        audit = LabAudit(lab)
        # Work for the frozen leader's queues: it must not act on it when it wakes up.
        core.create_namespaced_pod(namespace, body=pod_with_claims("contested", TEMPLATE_CLAIM))
        wait_for("the new leader handles it",
                 lambda: core.read_namespaced_pod("contested", namespace).status.resource_claim_statuses, 30)
    finally:
        leader.thaw()
    assert leader.proc is not None
    code = leader.proc.wait(timeout=30)
    assert code != 0, "a leader that lost its lease exits non-zero, for the kubelet to restart it"
    writers = _writers(audit.new_events())
    assert set(writers) <= {"claimwarden/0.1.0 (replica-b)"}, writers
    assert len(resource.list_namespaced_resource_claim(namespace).items) == 1
