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


def test_a_version_the_server_does_not_serve_is_not_read_as_a_missing_object(namespace: str, lab: LabState) -> None:
    """A GET by name whose 404 does not name the object (a PodGroup version, or a version of our own CRD,
    that this apiserver does not serve) raises NotServed; only a missing object of a served kind is None.
    Before, both were None, and the reservations controller took "not served" for "PodGroup deleted"."""
    from claimwarden.kube.errors import NotServed

    async def reads() -> None:
        kube = await Kube.connect(str(lab.kubeconfig), False)
        try:
            # scheduling.k8s.io/v1alpha1 is served by no release with PodGroups (1.36: v1alpha2, 1.37: v1alpha3
            # and v1beta1); the lab's CRD serves claimwarden.io/v1alpha1 only.
            with pytest.raises(NotServed):
                await kube.get_podgroup("v1alpha1", namespace, "team")
            with pytest.raises(NotServed):
                await kube.get_cluster_object("claimwarden.io/v1alpha9", "unhealthydevices", "some-record")
            with pytest.raises(NotServed):
                await kube.delete_cluster_object("claimwarden.io/v1alpha9", "unhealthydevices", "some-record")
            assert await kube.served_version("scheduling.k8s.io", "podgroups", ("v1alpha1",)) is None
            # Missing objects of served kinds are still None.
            assert await kube.get_claim(namespace, "no-such-claim") is None
            assert await kube.get_cluster_object("claimwarden.io/v1alpha1", "unhealthydevices", "no-such") is None
            assert await kube.delete_cluster_object("claimwarden.io/v1alpha1", "unhealthydevices", "no-such") is False
            assert await kube.get_pod("no-such-namespace", "no-such-pod") is None
        finally:
            await kube.close()

    asyncio.run(reads())
