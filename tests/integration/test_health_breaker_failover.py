"""The breaker's limit holds across a failover: the leader is SIGKILLed right after its first evictions, and the
new leader evicts no more than the limit allows in total (issue 20, finding 3; docs/concepts/safety.md "State after a
restart").

Before the window was written ahead (health/window.py), the killed leader's evictions lived in its memory
until the record's status was written, seconds later; the new leader counted none of them and allowed a
whole limit again.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from claimwarden import __version__
from claimwarden_lab.cluster import LabState

from .auditor import LabAudit
from .conftest import service_account_kubeconfig
from .health_helpers import GROUP, PLURAL, PREFIX, VERSION, annotate, device_of, records, slice_of
from .helpers import create_pods, pod_with_claims, template, wait_for
from .operator import Operator, replica_pair

DRIVER = "gpu.example.com"
LIMIT = 3
MARKED = 6
LEASE_SECONDS, RETRY_SECONDS = 15, 2
TEMPLATE_CLAIM = [{"name": "gpu", "resourceClaimTemplateName": "single-gpu"}]


@pytest.fixture
def replicas(lab: LabState, claimwarden: Operator, tmp_path: Path) -> Iterator[list[Operator]]:
    """Two replicas with a breaker limit of LIMIT pods (the session's claimwarden is stopped meanwhile)."""
    with claimwarden.stopped(), replica_pair(service_account_kubeconfig(lab), tmp_path,
                                             identities=("breaker-a", "breaker-b"),
                                             extra=[f"--breaker-max-pods={LIMIT}"]) as pair:
        yield pair

def _evictions(events: list[dict[str, Any]], namespace: str) -> list[dict[str, Any]]:
    """Successful evictions (HTTP 201) of the namespace's pods, in the apiserver's audit log."""
    return [e for e in events if e.get("stage") == "ResponseComplete"
            and (ref := e.get("objectRef") or {}).get("subresource") == "eviction"
            and ref.get("namespace") == namespace and (e.get("responseStatus") or {}).get("code") == 201]


def _leaving(core: client.CoreV1Api, namespace: str, names: list[str]) -> list[str]:
    """The pods of `names` being deleted or gone."""
    present = {p.metadata.name: p for p in core.list_namespaced_pod(namespace).items}
    return [n for n in names if n not in present or present[n].metadata.deletion_timestamp]


def _breaker_open(operator: Operator) -> bool:
    series = f'claimwarden_eviction_breaker_open{{driver="{DRIVER}"}} 1.0'
    return series in operator.metrics()


def test_a_leader_killed_right_after_evicting_leaves_the_new_leader_no_more_than_the_limit(
        api: client.ApiClient, namespace: str, lab: LabState, replicas: list[Operator]) -> None:
    leader, standby = replicas
    core = client.CoreV1Api(api)
    client.ResourceV1Api(api).create_namespaced_resource_claim_template(namespace, body=template("single-gpu"))
    names = [f"job-{i}" for i in range(MARKED)]
    create_pods(api, namespace, [pod_with_claims(n, TEMPLATE_CLAIM) for n in names])
    wait_for("the pods running", lambda: all(p.status.phase == "Running" for p in core.list_namespaced_pod(
        namespace).items) and len(core.list_namespaced_pod(namespace).items) == MARKED, 120)
    devices = {n: device_of(api, namespace, n) for n in names}
    by_pool: dict[str, dict[str, str | None]] = {}
    for pool, device in devices.values():
        by_pool.setdefault(pool, {})[PREFIX + device] = "bad batch"
    audit = LabAudit(lab)
    try:
        for pool, wanted in by_pool.items():
            annotate(api, slice_of(api, pool), wanted)
        # Killed right after its first eviction: its records' status is not written yet on the old code.
        wait_for("the first eviction", lambda: _leaving(core, namespace, names), 60, interval=0.02)
        leader.kill()
        wait_for("the standby to lead", standby.leads, LEASE_SECONDS + RETRY_SECONDS + 15, interval=0.2)
        # The new leader decides on the marks: it finds the breaker open (6 marked, limit 3), or it evicts.
        wait_for("the new leader's breaker decision", lambda: _breaker_open(standby) or len(
            _leaving(core, namespace, names)) > LIMIT, 60)
        time.sleep(5)  # evictions it would make, made
        evicted = _evictions(audit.new_events(), namespace)
        by_replica = {agent: sum(1 for e in evicted if e.get("userAgent") == agent)
                      for agent in {str(e.get("userAgent")) for e in evicted}}
        print(f"evictions by replica: {by_replica}; limit {LIMIT}")
        assert len(evicted) <= LIMIT, f"{len(evicted)} pods evicted across the failover, limit {LIMIT}: {by_replica}"
        assert evicted and by_replica.get(f"claimwarden/{__version__} (breaker-a)"), "the killed leader evicted first"
        assert _breaker_open(standby), "the new leader counts the old leader's evictions and holds the rest"
        assert len(names) - len(_leaving(core, namespace, names)) >= MARKED - LIMIT
        # The records never count fewer evictions than were made (an entry is written before its eviction).
        ours = [r for r in records(api) if (r["spec"]["pool"], r["spec"]["device"]) in set(devices.values())]
        assert sum(int((r.get("status") or {}).get("podsEvicted") or 0) for r in ours) >= len(evicted)
        assert sum(len((r.get("status") or {}).get("recentEvictions") or []) for r in ours) >= len(evicted)

        # The write ahead is guarded by resourceVersion: the apiserver refuses a status patch built on an old one.
        record = ours[0]
        with pytest.raises(ApiException) as refused:
            client.CustomObjectsApi(api).patch_cluster_custom_object_status(
                GROUP, VERSION, PLURAL, record["metadata"]["name"],
                {"metadata": {"resourceVersion": "1"}, "status": {"podsEvicted": 0}})
        assert refused.value.status == 409
    finally:
        for pool, wanted in by_pool.items():
            annotate(api, slice_of(api, pool), {key: None for key in wanted})
        wait_for("the records gone", lambda: not [r for r in records(api) if (
            r["spec"]["pool"], r["spec"]["device"]) in set(devices.values())], 60)
