"""A burst: many pods on one marked device are evicted at once, in parallel. A PodDisruptionBudget still
holds them back (and the record says so), and the record counts every eviction the apiserver saw
while its status is written a few times, not once per pod (docs/concepts/safety.md "The eviction budget")."""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path
from typing import Any

from kubernetes import client

from claimwarden_lab.audit_policy import CLAIMWARDEN_USER
from claimwarden_lab.cluster import LabState

from .auditor import LabAudit
from .conftest import service_account_kubeconfig
from .health_helpers import device_of, events, mark, record_for, unmark
from .helpers import create_pods, gpu_claim_spec, pod_with_claims, wait_for
from .operator import Operator
from .test_health_eviction import _counter

FREE, GUARDED = 16, 4
# One claim shared by every pod puts them all on one device, so one record evicts them all at once.
SHARED = [{"name": "gpu", "resourceClaimName": "shared"}]


def _pods(api: client.ApiClient, namespace: str) -> list[str]:
    core = client.CoreV1Api(api)
    bodies = []
    for i in range(FREE + GUARDED):
        body = pod_with_claims(f"pod-{i:02d}", SHARED)
        body["metadata"]["labels"] = {"app": "guarded" if i < GUARDED else "free"}
        bodies.append(body)
    create_pods(api, namespace, bodies)
    wait_for(f"{FREE + GUARDED} pods running", lambda: sum(
        p.status.phase == "Running" for p in core.list_namespaced_pod(namespace).items) == FREE + GUARDED, 90)
    return [b["metadata"]["name"] for b in bodies]


def _evicted(api: client.ApiClient, namespace: str) -> set[str]:
    return {p.metadata.name for p in client.CoreV1Api(api).list_namespaced_pod(namespace).items
            if p.metadata.deletion_timestamp} | _gone(api, namespace)


def _gone(api: client.ApiClient, namespace: str) -> set[str]:
    present = {p.metadata.name for p in client.CoreV1Api(api).list_namespaced_pod(namespace).items}
    return {f"pod-{i:02d}" for i in range(FREE + GUARDED)} - present


def _status(api: client.ApiClient, pool: str, device: str) -> dict[str, Any]:
    return dict((record_for(api, pool, device) or {}).get("status") or {})


def test_a_burst_on_one_device_respects_a_pdb_and_counts_every_eviction(
        api: client.ApiClient, namespace: str, lab: LabState, claimwarden: Operator, tmp_path: Path) -> None:
    client.ResourceV1Api(api).create_namespaced_resource_claim(namespace, body={
        "metadata": {"name": "shared"}, "spec": gpu_claim_spec()})
    names = _pods(api, namespace)
    guarded = names[:GUARDED]
    policy = client.PolicyV1Api(api)
    policy.create_namespaced_pod_disruption_budget(namespace, body={
        "metadata": {"name": "keep-guarded"},
        "spec": {"minAvailable": GUARDED, "selector": {"matchLabels": {"app": "guarded"}}}})
    wait_for("the budget observed", lambda: (policy.read_namespaced_pod_disruption_budget(
        "keep-guarded", namespace).status.expected_pods or 0) == GUARDED)
    pool, device = device_of(api, namespace, names[0])

    # The breaker would (rightly) hold back 20 pods of a 2-node lab; the burst is what is tested here.
    with claimwarden.stopped():
        own = Operator(service_account_kubeconfig(lab), tmp_path / "claimwarden.log",
                       extra=["--breaker-max-fraction=1", "--eviction-qps=0"])
        own.start()
        audit = LabAudit(lab)
        try:
            started = time.monotonic()
            mark(api, pool, device, "burst")
            wait_for(f"the {FREE} unguarded pods evicted", lambda: _evicted(api, namespace) >= set(names[GUARDED:]),
                     30, 0.1)
            print(f"{FREE} pods on one device evicted {time.monotonic() - started:.2f} s after the mark")
            wait_for("EvictionBlocked on every guarded pod", lambda: all(
                events(api, namespace, name, "EvictionBlocked") for name in guarded), 30)
            wait_for("the record counting the burst", lambda: (s := _status(api, pool, device)).get(
                "podsEvicted") == FREE and s.get("podsPending") == GUARDED, 30)
            time.sleep(2)
            assert not _evicted(api, namespace) & set(guarded), "a PodDisruptionBudget was overridden"
            status = _status(api, pool, device)
            assert (status["podsEvicted"], status["podsPending"]) == (FREE, GUARDED)
            [evicting] = [c for c in status["conditions"] if c["type"] == "Evicting"]
            assert (evicting["status"], evicting["reason"]) == ("True", "PodsPendingEviction")
            assert f"{GUARDED} pod(s) still to evict" in evicting["message"]
            assert _counter(own.metrics(), 'claimwarden_evictions_total{result="pdb_blocked"}') >= GUARDED

            policy.patch_namespaced_pod_disruption_budget("keep-guarded", namespace, {"spec": {"minAvailable": 0}})
            wait_for("the guarded pods evicted too", lambda: _evicted(api, namespace) == set(names), 90)
            wait_for("the record counting every eviction", lambda: (s := _status(api, pool, device)).get(
                "podsEvicted") == FREE + GUARDED and s.get("podsPending") == 0, 30)
            time.sleep(1)  # whatever write was still paced has gone out
            record_name = record_for(api, pool, device)["metadata"]["name"]  # type: ignore[index]
            seen = audit.new_events()
        finally:
            unmark(api, pool, device)
            wait_for("the record gone", lambda: record_for(api, pool, device) is None, 30)
            own.stop()

    done = [e for e in seen if e.get("stage") == "ResponseComplete"]
    evicted = Counter(e["objectRef"]["name"] for e in done if _is_eviction(e) and e["responseStatus"]["code"] == 201)
    assert set(evicted) == set(names) and set(evicted.values()) == {1}, evicted
    writes = [e for e in done if (e.get("user") or {}).get("username") == CLAIMWARDEN_USER
              and e.get("verb") == "patch" and e["objectRef"].get("resource") == "unhealthydevices"
              and e["objectRef"].get("name") == record_name and e["objectRef"].get("subresource") == "status"]
    quarantines = [e for e in done if (e.get("user") or {}).get("username") == CLAIMWARDEN_USER
                   and e.get("verb") == "create" and e["objectRef"].get("resource") == "resourceclaims"
                   and e["objectRef"].get("namespace") == "claimwarden-system"]
    # One quarantine claim, and at most one re-assertion once the shared claim lets go; not a churn.
    assert 1 <= len(quarantines) <= 2, f"{len(quarantines)} quarantine claims created for one device"
    # Once per pod would be 20 writes of the counts alone, plus the record's own; paced, a handful.
    print(f"{len(writes)} status writes of the record for {FREE + GUARDED} evictions")
    assert len(writes) < (FREE + GUARDED) // 2, f"{len(writes)} status writes for {FREE + GUARDED} evictions"


def _is_eviction(event: dict[str, Any]) -> bool:
    ref = event.get("objectRef") or {}
    return event.get("verb") == "create" and ref.get("resource") == "pods" and ref.get("subresource") == "eviction"

