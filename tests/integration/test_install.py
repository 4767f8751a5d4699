"""Installing with `kubectl apply -k`, and what claimwarden's ServiceAccount may and may not do."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import yaml
from kubernetes import client, config

from claimwarden_lab.cluster import LabState

from .conftest import extra_lab, token_kubeconfig
from .health_helpers import device_of, mark, unmark, wait_gone
from .helpers import pod_with_claims, template, wait_for
from .operator import Operator

ROOT = Path(__file__).resolve().parents[2]
SA = "system:serviceaccount:claimwarden-system:claimwarden"


def _kubectl(lab: LabState, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run([f"{lab.bin_dir}/kubectl", f"--kubeconfig={lab.kubeconfig}", *args],
                          capture_output=True, text=True, check=check)


def test_manifests_apply_and_the_deployment_passes_restricted_pod_security(lab: LabState,
                                                                           api: client.ApiClient) -> None:
    applied = _kubectl(lab, "apply", "-k", str(ROOT / "manifests" / "base"))
    assert "deployment.apps/claimwarden" in applied.stdout
    try:
        # The namespace enforces the restricted Pod Security level: the pod is only created if it complies.
        core = client.CoreV1Api(api)
        pod = wait_for("the claimwarden pod admitted", lambda: next(iter(core.list_namespaced_pod(
            "claimwarden-system", label_selector="app.kubernetes.io/name=claimwarden").items), None), 60)
        security = pod.spec.containers[0].security_context
        assert security.read_only_root_filesystem and not security.allow_privilege_escalation
        assert pod.spec.service_account_name == "claimwarden"
    finally:
        _kubectl(lab, "delete", "deployment", "claimwarden", "-n", "claimwarden-system", "--wait=false")


def test_monitoring_overlay_renders(lab: LabState) -> None:
    rendered = list(yaml.safe_load_all(_kubectl(lab, "kustomize", str(ROOT / "manifests" / "monitoring")).stdout))
    kinds = sorted(d["kind"] for d in rendered)
    assert "ServiceMonitor" in kinds and "PrometheusRule" in kinds and "Deployment" in kinds


def test_the_role_has_no_wildcards_secrets_or_escalation() -> None:
    docs = list(yaml.safe_load_all((ROOT / "manifests" / "base" / "rbac.yaml").read_text()))
    [role] = [d for d in docs if d["kind"] == "ClusterRole"]
    for rule in role["rules"]:
        assert "*" not in rule["verbs"] + rule["resources"] + rule["apiGroups"], rule
        assert not {"escalate", "bind", "impersonate"} & set(rule["verbs"]), rule
        assert "secrets" not in rule["resources"], rule


@pytest.mark.parametrize(("verb", "resource", "allowed"), [
    ("get", "secrets", False),
    ("list", "secrets", False),
    ("delete", "nodes", False),
    ("update", "resourceslices.resource.k8s.io", False),
    ("patch", "resourceslices.resource.k8s.io", False),
    ("delete", "pods", False),
    ("patch", "pods", False),
    ("create", "pods/exec", False),
    ("create", "pods/eviction", True),
    ("list", "poddisruptionbudgets.policy", True),
    ("get", "poddisruptionbudgets.policy", False),
    ("patch", "resourceclaims.resource.k8s.io/status", True),
    ("create", "resourceclaims.resource.k8s.io", True),
    ("patch", "unhealthydevices.claimwarden.io/status", True),
    # Device health from signals: HealthPolicies, DeviceClasses and Nodes are only read; a HealthPolicy's status
    # (how claimwarden read it) is written.
    ("watch", "healthpolicies.claimwarden.io", True),
    ("patch", "healthpolicies.claimwarden.io", False),
    ("patch", "healthpolicies.claimwarden.io/status", True),
    ("update", "healthpolicies.claimwarden.io/status", False),
    ("list", "deviceclasses.resource.k8s.io", True),
    ("watch", "nodes", True),
    ("patch", "nodes", False),
    # Is the approval policy installed? (health/admission.py) Read only; it may not weaken the policy.
    ("get", "validatingadmissionpolicies.admissionregistration.k8s.io", True),
    ("list", "validatingadmissionpolicybindings.admissionregistration.k8s.io", True),
    ("delete", "validatingadmissionpolicybindings.admissionregistration.k8s.io", False),
    ("patch", "validatingadmissionpolicies.admissionregistration.k8s.io", False),
])
def test_the_service_account_gets_exactly_what_it_needs(lab: LabState, verb: str, resource: str,
                                                        allowed: bool) -> None:
    resource, _, subresource = resource.partition("/")
    extra = [f"--subresource={subresource}"] if subresource else []
    answer = _kubectl(lab, "auth", "can-i", verb, resource, *extra, "--all-namespaces", f"--as={SA}", check=False)
    assert answer.stdout.strip() == ("yes" if allowed else "no"), answer.stdout + answer.stderr


@pytest.mark.parametrize(("verb", "resource", "subresource", "allowed"), [
    ("get", "podgroups", "", True),
    ("list", "podgroups", "", True),
    ("watch", "podgroups", "", True),
    ("patch", "podgroups", "status", True),
    ("patch", "podgroups", "", False),
    ("update", "podgroups", "finalizers", False),
    ("delete", "podgroups", "", False),
    ("create", "podgroups", "", False),
])
def test_the_service_account_may_read_podgroups_and_write_only_their_status(
        api: client.ApiClient, verb: str, resource: str, subresource: str, allowed: bool) -> None:
    """Asked of the authorizer directly (a SubjectAccessReview): `kubectl auth can-i` answers "no" for a
    resource the server does not serve, and the suite's lab may run a version without PodGroups."""
    review = client.AuthorizationV1Api(api).create_subject_access_review(body={
        "apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
        "spec": {"user": SA, "groups": ["system:serviceaccounts", "system:serviceaccounts:claimwarden-system",
                                        "system:authenticated"],
                 "resourceAttributes": {"group": "scheduling.k8s.io", "resource": resource,
                                        "subresource": subresource, "verb": verb, "namespace": "any"}}})
    assert review.status.allowed is allowed, review.status


@pytest.mark.parametrize(("verb", "where", "allowed"), [
    ("update", ["leases/claimwarden", "-n", "claimwarden-system"], True),
    ("get", ["leases/claimwarden", "-n", "claimwarden-system"], True),
    ("create", ["leases", "-n", "claimwarden-system"], True),
    ("update", ["leases/other", "-n", "claimwarden-system"], False),
    ("create", ["leases", "-n", "default"], False),
    ("update", ["leases/claimwarden", "-n", "kube-system"], False),
])
def test_leader_election_may_touch_only_its_own_lease(lab: LabState, verb: str, where: list[str],
                                                      allowed: bool) -> None:
    answer = _kubectl(lab, "auth", "can-i", verb, *where, f"--as={SA}", check=False)
    assert answer.stdout.strip() == ("yes" if allowed else "no"), answer.stdout + answer.stderr


def test_an_overlay_into_another_namespace_keeps_the_lease_and_the_quarantine_there(
        tmp_path_factory: pytest.TempPathFactory, tmp_path: Path) -> None:
    """`namespace: gpu-ops` over manifests/base, applied in a lab of its own (the overlay's ClusterRoleBinding
    names the gpu-ops ServiceAccount): claimwarden, run as that ServiceAccount with the Downward API's
    POD_NAMESPACE, elects itself in gpu-ops and parks a marked device there."""
    overlay = tmp_path / "overlay"
    overlay.mkdir()
    (overlay / "kustomization.yaml").write_text(yaml.safe_dump({
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization", "namespace": "gpu-ops",
        "resources": [os.path.relpath(ROOT / "manifests" / "base", overlay)]}))  # kustomize refuses absolute
    with extra_lab(tmp_path_factory, nodes=1, gpus_per_node=2) as state:
        rendered = _kubectl(state, "kustomize", str(overlay)).stdout
        docs = list(yaml.safe_load_all(rendered))
        [deployment] = [d for d in docs if d["kind"] == "Deployment"]
        container = deployment["spec"]["template"]["spec"]["containers"][0]
        assert not [a for a in container["args"] if a.startswith("--namespace")]
        downward = {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}}
        assert downward in container["env"]
        [role] = [d for d in docs if d["kind"] == "ClusterRole" and d["metadata"]["name"] == "claimwarden"]
        assert not [r for r in role["rules"] if "namespaces" in r["resources"]]
        (tmp_path / "rendered.yaml").write_text(rendered)
        _kubectl(state, "apply", "-f", str(tmp_path / "rendered.yaml"))
        _kubectl(state, "delete", "deployment", "claimwarden", "-n", "gpu-ops")  # this test runs it as a process
        sa = "system:serviceaccount:gpu-ops:claimwarden"
        for verb, where in (("update", ["leases/claimwarden", "-n", "gpu-ops"]), ("create", ["namespaces"])):
            answer = _kubectl(state, "auth", "can-i", verb, *where, f"--as={sa}", check=False).stdout.strip()
            assert answer == ("yes" if verb == "update" else "no"), (verb, where, answer)

        with config.new_client_from_config(config_file=str(state.kubeconfig)) as api:
            core, resource = client.CoreV1Api(api), client.ResourceV1Api(api)
            token = core.create_namespaced_service_account_token("claimwarden", "gpu-ops", body={
                "spec": {"audiences": [], "expirationSeconds": 3600}}).status.token
            kubeconfig = token_kubeconfig(state, tmp_path / "gpu-ops.kubeconfig", token)
            operator = Operator(kubeconfig, tmp_path / "claimwarden.log", env={"POD_NAMESPACE": "gpu-ops"})
            operator.start()
            try:
                lease = client.CoordinationV1Api(api).read_namespaced_lease("claimwarden", "gpu-ops")
                assert lease.spec.holder_identity == operator.identity
                core.create_namespace({"metadata": {"name": "overlay-work"}})
                resource.create_namespaced_resource_claim_template("overlay-work", body=template("gpu"))
                core.create_namespaced_pod("overlay-work", body=pod_with_claims(
                    "pod", [{"name": "gpu", "resourceClaimTemplateName": "gpu"}]))
                wait_for("the pod Running",
                         lambda: core.read_namespaced_pod("pod", "overlay-work").status.phase == "Running")
                pool, device = device_of(api, "overlay-work", "pod")
                mark(api, pool, device, "overlay test")
                wait_gone(api, "overlay-work", "pod")
                parked = wait_for("a quarantine claim in gpu-ops", lambda: resource.list_namespaced_resource_claim(
                    "gpu-ops").items, 60)
                assert parked[0].status.allocation.devices.results[0].device == device
                assert not resource.list_namespaced_resource_claim("claimwarden-system").items
                unmark(api, pool, device)
                wait_for("the quarantine claim released",
                         lambda: not resource.list_namespaced_resource_claim("gpu-ops").items, 60)
                core.delete_namespace("overlay-work")
            finally:
                operator.stop()
