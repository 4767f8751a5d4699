"""The claims and reservations metrics move with what claimwarden does."""

from __future__ import annotations

from importlib.metadata import version

from kubernetes import client
from prometheus_client.parser import text_string_to_metric_families

from claimwarden import __version__ as CLAIMWARDEN_VERSION

from .helpers import pod_with_claims, template, wait_for
from .operator import Operator


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def _value(samples: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def test_metrics_count_creations_releases_and_claim_states(api: client.ApiClient, namespace: str,
                                                           claimwarden: Operator) -> None:
    core, resource = client.CoreV1Api(api), client.ResourceV1Api(api)
    before = _samples(claimwarden.metrics())
    resource.create_namespaced_resource_claim_template(namespace, body=template("single-gpu"))
    core.create_namespaced_pod(namespace, body=pod_with_claims(
        "pod", [{"name": "gpu", "resourceClaimTemplateName": "single-gpu"}]))
    wait_for("pod Running", lambda: core.read_namespaced_pod("pod", namespace).status.phase == "Running")
    during = _samples(claimwarden.metrics())
    assert _value(during, "claimwarden_claim_creations_total", result="success") == (
        _value(before, "claimwarden_claim_creations_total", result="success") + 1)
    assert _value(during, "claimwarden_resource_claims", state="reserved", source="resource_claim_template") >= 1
    assert _value(during, "claimwarden_reconcile_total", controller="claims", result="success") > 0
    assert ("claimwarden_workqueue_depth", (("controller", "claims"),)) in during

    core.delete_namespaced_pod("pod", namespace)
    wait_for("the generated claim gone", lambda: not resource.list_namespaced_resource_claim(namespace).items)
    after = _samples(claimwarden.metrics())
    for name in ("claimwarden_reservations_removed_total", "claimwarden_deallocations_total"):
        assert _value(after, name) >= _value(before, name) + 1, name
    assert _value(after, "claimwarden_build_info", version=CLAIMWARDEN_VERSION, kopf_version=version("kopf"),
                  kubernetes_client_version=version("kubernetes")) == 1
