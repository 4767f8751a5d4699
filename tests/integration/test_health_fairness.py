"""Tenants share the eviction budget fairly (docs/concepts/safety.md "The eviction budget"; issue 20 finding 8).

Namespace A has many pods on one marked device, all behind a PodDisruptionBudget that refuses every
eviction; namespace B has one pod on each of two other devices. With a small budget, B's pods are
evicted promptly: the one marked while A's first attempts are still queued for tokens gets the next
turn (round-robin over namespaces), the one marked after A's pods were all refused finds the shared
budget untouched, because A's retries take their tokens from the retry budget. The Eviction API calls
are counted from the apiserver's audit log.
"""

from __future__ import annotations

import time
import uuid
from collections import Counter
from datetime import datetime
from pathlib import Path
from typing import Any

from kubernetes import client

from claimwarden_lab.audit_policy import CLAIMWARDEN_USER
from claimwarden_lab.cluster import LabState

from .auditor import LabAudit
from .conftest import service_account_kubeconfig
from .health_helpers import device_of, mark, record_for, unmark
from .helpers import create_pods, delete_namespace, gpu_claim_spec, pod_with_claims, template, wait_for
from .operator import Operator

GUARDED = 24
QPS, RETRY_QPS = 2.0, 0.2
RETRY_BURST = 2  # health/budget.py
QUIET = 10.0  # seconds over which A's refused retries are counted


def _is_eviction(event: dict[str, Any]) -> bool:
    ref = event.get("objectRef") or {}
    return bool(event.get("verb") == "create" and ref.get("resource") == "pods"
                and ref.get("subresource") == "eviction" and event.get("stage") == "ResponseComplete"
                and (event.get("user") or {}).get("username") == CLAIMWARDEN_USER)


class _Evictions:
    """The Eviction API calls claimwarden made, read from the audit log as they come."""

    def __init__(self, lab: LabState) -> None:
        self.audit = LabAudit(lab)
        self.calls: list[tuple[datetime, str, str, int]] = []  # (received, namespace, pod, HTTP code)

    def read(self) -> list[tuple[datetime, str, str, int]]:
        for event in self.audit.new_events():
            if _is_eviction(event):
                ref = event["objectRef"]
                self.calls.append((datetime.fromisoformat(event["requestReceivedTimestamp"]), ref["namespace"],
                                   ref["name"], int((event.get("responseStatus") or {}).get("code") or 0)))
        return self.calls


def _running(api: client.ApiClient, namespace: str, count: int) -> None:
    core = client.CoreV1Api(api)
    wait_for(f"{count} pods running in {namespace}", lambda: sum(
        p.status.phase == "Running" for p in core.list_namespaced_pod(namespace).items) == count, 120)


def _evicted(api: client.ApiClient, namespace: str, pod: str) -> bool:
    try:
        found = client.CoreV1Api(api).read_namespaced_pod(pod, namespace)
    except client.ApiException as exc:
        return exc.status == 404
    return found.metadata.deletion_timestamp is not None


def _mark_and_time(api: client.ApiClient, namespace: str, pod: str, device: tuple[str, str],
                   marked: list[tuple[str, str]]) -> float:
    """Mark the pod's device; seconds until the pod is evicted."""
    started = time.monotonic()
    mark(api, *device, "fan failing")
    marked.append(device)
    wait_for(f"{pod} evicted", lambda: _evicted(api, namespace, pod), 60, 0.1)
    return time.monotonic() - started


def test_a_namespace_behind_a_pdb_does_not_hold_back_another_namespaces_evictions(
        api: client.ApiClient, namespace: str, lab: LabState, claimwarden: Operator, tmp_path: Path) -> None:
    core, policy = client.CoreV1Api(api), client.PolicyV1Api(api)
    other = f"fairness-b-{uuid.uuid4().hex[:5]}"
    core.create_namespace(body={"metadata": {"name": other}})
    marked: list[tuple[str, str]] = []
    try:
        # A: GUARDED pods sharing one claim (one device), a PodDisruptionBudget that allows no disruption.
        client.ResourceV1Api(api).create_namespaced_resource_claim(namespace, body={
            "metadata": {"name": "shared"}, "spec": gpu_claim_spec()})
        bodies = []
        for i in range(GUARDED):
            body = pod_with_claims(f"a-{i:02d}", [{"name": "gpu", "resourceClaimName": "shared"}])
            body["metadata"]["labels"] = {"app": "guarded"}
            bodies.append(body)
        create_pods(api, namespace, bodies)
        policy.create_namespaced_pod_disruption_budget(namespace, body={
            "metadata": {"name": "keep-all"},
            "spec": {"minAvailable": GUARDED, "selector": {"matchLabels": {"app": "guarded"}}}})
        # B: two pods, a device each.
        client.ResourceV1Api(api).create_namespaced_resource_claim_template(other, body=template("single-gpu"))
        create_pods(api, other, [pod_with_claims(f"b-{i}", [{"name": "gpu", "resourceClaimTemplateName": "single-gpu"}])
                                 for i in range(2)])
        _running(api, namespace, GUARDED)
        _running(api, other, 2)
        wait_for("the budget observed", lambda: (policy.read_namespaced_pod_disruption_budget(
            "keep-all", namespace).status.expected_pods or 0) == GUARDED)
        shared = device_of(api, namespace, "a-00")
        devices = [device_of(api, other, f"b-{i}") for i in range(2)]

        with claimwarden.stopped():
            # The breaker would (rightly) hold back 24 pods of a 16-device lab; the budget is what is tested.
            own = Operator(service_account_kubeconfig(lab), tmp_path / "claimwarden.log",
                           extra=["--breaker-max-fraction=1", f"--eviction-qps={QPS:g}", "--eviction-burst=1",
                                  f"--eviction-retry-qps={RETRY_QPS:g}"])
            own.start()
            evictions = _Evictions(lab)
            try:
                mark(api, *shared, "PCIe errors")
                marked.append(shared)
                wait_for("A's first eviction refused", lambda: any(
                    code == 429 for _, _, _, code in evictions.read()), 30, 0.2)
                # A's other 23 first attempts wait for tokens (2 a second): b-0 is served next but one.
                first = _mark_and_time(api, other, "b-0", devices[0], marked)
                print(f"b-0 evicted {first:.2f} s after its mark, with A's first attempts queued for tokens")
                assert first < 5, f"b-0 waited {first:.1f} s behind namespace A's evictions"

                wait_for("every pod of A refused once", lambda: {
                    pod for _, ns, pod, code in evictions.read() if ns == namespace and code == 429} ==
                    {b["metadata"]["name"] for b in bodies}, 60, 0.5)
                refused_all = max(at for at, ns, _, _ in evictions.calls if ns == namespace)
                second = _mark_and_time(api, other, "b-1", devices[1], marked)
                print(f"b-1 evicted {second:.2f} s after its mark, with A's pods all refused and retrying")
                assert second < 3, f"b-1 waited {second:.1f} s behind namespace A's refused retries"

                time.sleep(QUIET + 1)
                calls = evictions.read()
                retries = [at for at, ns, _, _ in calls
                           if ns == namespace and 0 < (at - refused_all).total_seconds() <= QUIET]
                print(f"A's refused retries in the {QUIET:g} s after all were refused: {len(retries)} "
                      f"(retry budget {RETRY_QPS:g}/s, burst {RETRY_BURST})")
                # Without a budget of their own, 24 keys backing off from 1 s retried about 3 times each in
                # 10 s, at the whole shared budget (2/s, 20 calls).
                assert len(retries) <= RETRY_QPS * QUIET + RETRY_BURST + 1
                codes = Counter((ns, code) for _, ns, _, code in calls)
                assert codes[(namespace, 201)] == 0, "a PodDisruptionBudget was overridden"
                assert codes[(other, 201)] == 2
            finally:
                for pool, device in marked:
                    unmark(api, pool, device)
                wait_for("the records gone", lambda: all(record_for(api, *d) is None for d in marked), 30)
                own.stop()
    finally:
        delete_namespace(api, other)
