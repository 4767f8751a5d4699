"""The eviction budget (`--eviction-qps`, `--eviction-burst`): the defaults empty one broken node at
once; a small budget spaces the calls out (docs/concepts/safety.md)."""

from __future__ import annotations

import time
from pathlib import Path

from kubernetes import client

from claimwarden_lab.cluster import LabState

from .conftest import service_account_kubeconfig
from .health_helpers import PREFIX, annotate, slice_of
from .helpers import create_pods, pod_with_claims, template, wait_for
from .operator import Operator
from .test_health_eviction import _counter

NODE = "kwok-node-0"


def _fill_node(api: client.ApiClient, namespace: str, count: int) -> list[str]:
    """`count` pods on NODE, one device each; returns the devices they hold."""
    client.ResourceV1Api(api).create_namespaced_resource_claim_template(namespace, body=template("single-gpu"))
    bodies = []
    for i in range(count):
        body = pod_with_claims(f"pod-{i}", [{"name": "gpu", "resourceClaimTemplateName": "single-gpu"}])
        body["spec"]["nodeSelector"] = {"kubernetes.io/hostname": NODE}
        bodies.append(body)
    create_pods(api, namespace, bodies)
    core = client.CoreV1Api(api)
    wait_for(f"{count} pods running", lambda: sum(
        p.status.phase == "Running" for p in core.list_namespaced_pod(namespace).items) == count, 90)
    devices = []
    for claim in client.ResourceV1Api(api).list_namespaced_resource_claim(namespace).items:
        devices.append(claim.status.allocation.devices.results[0].device)
    return sorted(devices)


def _mark_and_time(api: client.ApiClient, namespace: str, devices: list[str]) -> float:
    """Mark every device in one patch; seconds until every pod is gone or terminating."""
    core = client.CoreV1Api(api)
    started = time.monotonic()
    annotate(api, slice_of(api, NODE), {PREFIX + device: "node lost its PCIe switch" for device in devices})
    wait_for("every pod evicted", lambda: all(
        p.metadata.deletion_timestamp for p in core.list_namespaced_pod(namespace).items), 60, 0.1)
    return time.monotonic() - started


def _unmark(api: client.ApiClient, devices: list[str]) -> None:
    annotate(api, slice_of(api, NODE), {PREFIX + device: None for device in devices})


def test_the_default_budget_evicts_one_broken_node_at_once(api: client.ApiClient, namespace: str,
                                                           claimwarden: Operator) -> None:
    devices = _fill_node(api, namespace, 8)
    deferred = _counter(claimwarden.metrics(), 'claimwarden_evictions_deferred_total{reason="budget"}')
    try:
        elapsed = _mark_and_time(api, namespace, devices)
        print(f"8 pods on one node evicted {elapsed:.2f} s after the mark (defaults: qps 10, burst 20)")
        assert elapsed < 5
        exposition = claimwarden.metrics()
        assert _counter(exposition, 'claimwarden_evictions_deferred_total{reason="budget"}') == deferred
        assert _counter(exposition, 'claimwarden_evictions_deferred_total{reason="breaker"}') == 0
    finally:
        _unmark(api, devices)


def test_a_small_budget_spaces_the_evictions_out(api: client.ApiClient, namespace: str, lab: LabState,
                                                 claimwarden: Operator, tmp_path: Path) -> None:
    devices = _fill_node(api, namespace, 6)
    with claimwarden.stopped():
        own = Operator(service_account_kubeconfig(lab), tmp_path / "claimwarden.log",
                       extra=["--eviction-qps=1", "--eviction-burst=2"])
        own.start()
        try:
            elapsed = _mark_and_time(api, namespace, devices)
            print(f"6 pods evicted in {elapsed:.2f} s with --eviction-qps=1 --eviction-burst=2")
            # Two at once, then one a second: the sixth no earlier than 4 s after the first.
            assert elapsed >= 3.5
            assert _counter(own.metrics(), 'claimwarden_evictions_deferred_total{reason="budget"}') >= 4
        finally:
            _unmark(api, devices)
            wait_for("the records gone", lambda: not client.CustomObjectsApi(api).list_cluster_custom_object(
                "claimwarden.io", "v1alpha1", "unhealthydevices")["items"], 30)
            own.stop()
