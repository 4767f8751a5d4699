"""claimwarden converges after a SIGKILL in the middle of churn, and runs safely beside upstream."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client, config

from claimwarden_lab.cluster import LabState

from .conftest import extra_lab, service_account_kubeconfig
from .helpers import create_pods, delete_pods, pod_with_claims, template, wait_for
from .operator import Operator

TEMPLATE_CLAIM = [{"name": "gpu", "resourceClaimTemplateName": "single-gpu"}]


def _problems(api: client.ApiClient, namespace: str) -> list[str]:
    """What would be wrong with the namespace once everything has converged; empty when it has."""
    core, resource = client.CoreV1Api(api), client.ResourceV1Api(api)
    pods = {p.metadata.uid: p for p in core.list_namespaced_pod(namespace).items}
    claims = resource.list_namespaced_resource_claim(namespace).items
    problems = []
    owned: dict[str, list[str]] = {}
    for claim in claims:
        owner = next((r for r in claim.metadata.owner_references or [] if r.controller), None)
        if owner is None or owner.uid not in pods:
            problems.append(f"claim {claim.metadata.name} has no live owner pod")
        else:
            owned.setdefault(owner.uid, []).append(claim.metadata.name)
        for reservation in (claim.status.reserved_for if claim.status else None) or []:
            if reservation.uid not in pods:
                problems.append(f"claim {claim.metadata.name} is reserved for gone pod {reservation.name}")
        if claim.status and claim.status.allocation and not claim.status.reserved_for:
            problems.append(f"claim {claim.metadata.name} holds a device nobody uses")
    for uid, pod in pods.items():
        statuses = pod.status.resource_claim_statuses or []
        named = [s.resource_claim_name for s in statuses]
        if owned.get(uid, []) != named or len(named) != 1:
            problems.append(f"pod {pod.metadata.name}: claims {owned.get(uid, [])}, status names {named}")
    return problems


@pytest.fixture(scope="module")
def churn_lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LabState]:
    with extra_lab(tmp_path_factory, nodes=4, gpus_per_node=32) as state:
        yield state


def _wait_converged(api: client.ApiClient, namespace: str, what: str, timeout: float) -> None:
    try:
        wait_for(what, lambda: not _problems(api, namespace), timeout, interval=2)
    except AssertionError as exc:
        raise AssertionError(f"{exc}; still wrong: {_problems(api, namespace)[:10]}") from None


def _client_with_template(lab: LabState, namespace: str) -> client.ApiClient:
    """A client for ``lab`` and a new namespace there holding the template the pods use."""
    api = config.new_client_from_config(config_file=str(lab.kubeconfig))
    client.CoreV1Api(api).create_namespace(body={"metadata": {"name": namespace}})
    client.ResourceV1Api(api).create_namespaced_resource_claim_template(namespace, body=template("single-gpu"))
    return api


def test_sigkill_during_churn_converges_after_restart(churn_lab: LabState,
                                                     tmp_path_factory: pytest.TempPathFactory) -> None:
    namespace = "churn"
    api = _client_with_template(churn_lab, namespace)
    operator = Operator(service_account_kubeconfig(churn_lab), tmp_path_factory.mktemp("churn") / "claimwarden.log")
    operator.start()
    names = [f"pod-{i:03d}" for i in range(100)]
    deleted = names[::2]

    def churn() -> None:
        for batch in range(0, 100, 10):
            create_pods(api, namespace, [pod_with_claims(n, TEMPLATE_CLAIM) for n in names[batch:batch + 10]])
            time.sleep(0.5)
            delete_pods(api, namespace, [n for n in names[batch:batch + 10] if n in deleted])

    worker = threading.Thread(target=churn)
    worker.start()
    time.sleep(4)  # mid-churn: some claims created, some pods already deleted
    operator.kill()
    worker.join()
    time.sleep(2)
    operator.start()
    try:
        _wait_converged(api, namespace, "every live pod with exactly one claim and no leftovers", 180)
        live = {p.metadata.name for p in client.CoreV1Api(api).list_namespaced_pod(namespace).items}
        assert live == set(names) - set(deleted)
    finally:
        problems = _problems(api, namespace)
        assert operator.stop() == 0
        api.close()
    assert not problems, problems


@pytest.fixture(scope="module")
def upstream_lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LabState]:
    with extra_lab(tmp_path_factory, nodes=4, gpus_per_node=64, upstream_claims=True) as state:
        yield state


def test_beside_upstream_controller_every_pod_gets_exactly_one_claim(
        upstream_lab: LabState, tmp_path_factory: pytest.TempPathFactory) -> None:
    namespace = "side-by-side"
    api = _client_with_template(upstream_lab, namespace)
    operator = Operator(service_account_kubeconfig(upstream_lab), tmp_path_factory.mktemp("side") / "claimwarden.log")
    operator.start()
    try:
        bodies: list[dict[str, Any]] = [pod_with_claims(f"pod-{i:03d}", TEMPLATE_CLAIM) for i in range(200)]
        create_pods(api, namespace, bodies)
        _wait_converged(api, namespace, "200 pods with exactly one claim each and no orphans", 300)
        # Stable, not just momentarily right: nothing creates more claims afterwards.
        time.sleep(5)
        assert _problems(api, namespace) == []
        assert len(client.ResourceV1Api(api).list_namespaced_resource_claim(namespace).items) == 200
    finally:
        assert operator.stop() == 0
        api.close()
