"""The real Eviction API's PodDisruptionBudget refusal is told apart from throttling."""

from __future__ import annotations

import asyncio

import pytest
from kubernetes import client

from claimwarden.kube.api import Kube
from claimwarden.kube.errors import ApiError
from claimwarden_lab.cluster import LabState

from .helpers import wait_for


def test_a_budget_refusal_is_a_disruption_budget_error(api: client.ApiClient, namespace: str,
                                                       lab: LabState) -> None:
    core, policy = client.CoreV1Api(api), client.PolicyV1Api(api)
    core.create_namespaced_pod(namespace, body={
        "metadata": {"name": "guarded", "labels": {"app": "guarded"}},
        "spec": {"terminationGracePeriodSeconds": 0,
                 "containers": [{"name": "main", "image": "registry.example/busybox:1"}]}})
    policy.create_namespaced_pod_disruption_budget(namespace, body={
        "metadata": {"name": "keep-one"},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "guarded"}}}})
    pod = wait_for("the pod Running", lambda: (p := core.read_namespaced_pod("guarded", namespace))
                   and p.status.phase == "Running" and p)
    wait_for("the budget observed", lambda: (policy.read_namespaced_pod_disruption_budget(
        "keep-one", namespace).status.current_healthy or 0) == 1)

    async def evict() -> ApiError:
        kube = await Kube.connect(str(lab.kubeconfig), False)
        try:
            with pytest.raises(ApiError) as refused:
                await kube.evict_pod(namespace, "guarded", pod.metadata.uid)
            return refused.value
        finally:
            await kube.close()

    error = asyncio.run(evict())
    assert error.status == 429
    assert error.disruption_budget and not error.throttled, (error, error.causes)
    assert error.causes == ("DisruptionBudget",)
    assert "disruption budget" in error.message
