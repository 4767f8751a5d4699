"""Who may approve, and who may mark, checked by the real API server (issue 20, findings 6 and 9).

docs/concepts/safety.md "The breaker" and "Who may mark". People are impersonated (the lab's admin may impersonate):
`marker` and `bob` write records but approve nothing, `alice` is in the approvers group; on slices,
`gpu-driver` plays a DRA driver's node pod with slice write, `ops` is in the operators group.
claimwarden runs here with `--breaker-max-pods=0`: every NoExecute eviction waits for an approval, so
whether an approval counts shows as a pod evicted or still running.
"""

from __future__ import annotations

import contextlib
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from claimwarden_lab.cluster import LabState

from .conftest import service_account_kubeconfig
from .health_helpers import GROUP, PLURAL, PREFIX, VERSION, annotate, create_record, delete_record, events
from .helpers import create_pods, pod_with_claims, template, wait_for
from .operator import Operator

ROOT = Path(__file__).resolve().parents[2]
APPROVED_BY, APPROVED_GENERATION = "claimwarden.io/approved-by", "claimwarden.io/approved-generation"
APPROVERS, OPERATORS = "claimwarden:approvers", "claimwarden:operators"
DRAIN = "drain.claimwarden.io/"


def as_user(lab: LabState, user: str, group: str | None = None) -> client.ApiClient:
    """A client that acts as `user` (and `group`), through impersonation by the lab's admin."""
    api = config.new_client_from_config(config_file=str(lab.kubeconfig))
    api.set_default_header("Impersonate-User", user)
    if group:
        api.set_default_header("Impersonate-Group", group)
    return api


@contextlib.contextmanager
def granted(api: client.ApiClient, name: str, rules: list[dict[str, Any]], users: list[str]) -> Iterator[None]:
    """A ClusterRole with `rules` bound to `users` for the test: RBAC lets them try, admission decides."""
    rbac = client.RbacAuthorizationV1Api(api)
    rbac.create_cluster_role({"metadata": {"name": name}, "rules": rules})
    rbac.create_cluster_role_binding({
        "metadata": {"name": name}, "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                                                "name": name},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": u} for u in users]})
    try:
        yield
    finally:
        rbac.delete_cluster_role_binding(name)
        rbac.delete_cluster_role(name)


RECORD_WRITE = [{"apiGroups": [GROUP], "resources": [PLURAL], "verbs": ["get", "list", "create", "patch", "update",
                                                                        "delete"]}]
SLICE_WRITE = [{"apiGroups": ["resource.k8s.io"], "resources": ["resourceslices"],
                "verbs": ["get", "list", "create", "patch", "update"]}]


def refused(action: Any) -> str:
    """The API server's refusal of `action` (it must refuse), as text."""
    with pytest.raises(ApiException) as error:
        action()
    assert error.value.status in (403, 422), error.value
    return str(error.value.body)


def patch_record(api: client.ApiClient, name: str, patch: dict[str, Any]) -> dict[str, Any]:
    result: dict[str, Any] = client.CustomObjectsApi(api).patch_cluster_custom_object(GROUP, VERSION, PLURAL, name,
                                                                                       patch)
    return result


def read_record(api: client.ApiClient, name: str) -> dict[str, Any]:
    result: dict[str, Any] = client.CustomObjectsApi(api).get_cluster_custom_object(GROUP, VERSION, PLURAL, name)
    return result


def approve(api: client.ApiClient, name: str, by: str, generation: int) -> dict[str, Any]:
    return patch_record(api, name, {"metadata": {"annotations": {APPROVED_BY: by,
                                                                 APPROVED_GENERATION: str(generation)}}})


def condition(record: dict[str, Any], kind: str) -> dict[str, Any] | None:
    return next((c for c in (record.get("status") or {}).get("conditions") or [] if c["type"] == kind), None)


def test_only_an_approver_approves_in_their_own_name_for_the_current_generation_and_never_on_create(
        api: client.ApiClient, lab: LabState) -> None:
    """The ValidatingAdmissionPolicy alone (manifests/approval), without claimwarden."""
    name = "approval-rules"
    marker, bob, alice = as_user(lab, "marker"), as_user(lab, "bob"), as_user(lab, "alice", APPROVERS)
    with granted(api, "approval-rules-test", RECORD_WRITE, ["marker", "bob", "alice"]):
        try:
            # A mass-marking script cannot create its records approved, in its own name or anyone's.
            def create_approved() -> ApiException | None:
                try:
                    client.CustomObjectsApi(marker).create_cluster_custom_object(GROUP, VERSION, PLURAL, {
                        "apiVersion": f"{GROUP}/{VERSION}", "kind": "UnhealthyDevice",
                        "metadata": {"name": name, "annotations": {APPROVED_BY: "marker", APPROVED_GENERATION: "1"}},
                        "spec": {"driver": "gpu.example.com", "pool": "kwok-node-0", "device": "gpu-7",
                                 "effect": "NoExecute", "reason": "self-approved"}})
                except ApiException as exc:
                    return exc
                delete_record(api, name)  # the policy is loaded asynchronously after it is created
                return None

            error = wait_for("the approval policy in force", create_approved, 30)
            assert error.status in (403, 422) and "cannot be created approved" in str(error.body), error.body

            create_record(marker, name, "kwok-node-0", "gpu-7", "None", "checking")
            # The marker is no approver, nor is bob, even in their own names and for the current generation.
            for user, who in ((marker, "marker"), (bob, "bob")):
                text = refused(lambda: approve(user, name, who, 1))  # noqa: B023 - called at once
                assert f"{who} may not approve" in text and APPROVERS in text, text
            # An approver approves in her own name only, and only the generation she sees.
            assert "must be the name of the user who sets it (alice)" in refused(
                lambda: approve(alice, name, "someone-else", 1))
            assert "must be the metadata.generation of the record (1)" in refused(lambda: approve(alice, name,
                                                                                                 "alice", 7))
            approved = approve(alice, name, "alice", 1)
            assert approved["metadata"]["annotations"][APPROVED_BY] == "alice"
            # An unchanged approval lets the marker change the spec; the generation then moves past the approval.
            changed = patch_record(marker, name, {"spec": {"effect": "NoExecute"}})
            assert changed["metadata"]["generation"] == 2
            assert changed["metadata"]["annotations"][APPROVED_GENERATION] == "1"
            # ...and the marker cannot move the approval along with it.
            assert "may not approve" in refused(lambda: patch_record(marker, name, {"metadata": {
                "annotations": {APPROVED_GENERATION: "2"}}}))
            # Anyone who may update the record may withdraw an approval.
            withdrawn = patch_record(marker, name, {"metadata": {"annotations": {APPROVED_BY: None,
                                                                                 APPROVED_GENERATION: None}}})
            assert APPROVED_BY not in (withdrawn["metadata"].get("annotations") or {})
        finally:
            with contextlib.suppress(ApiException):
                delete_record(api, name)
            for each in (marker, bob, alice):
                each.close()


def _running_pod_on_a_device(api: client.ApiClient, namespace: str) -> tuple[str, str]:
    """One pod holding one device; its (pool, device)."""
    client.ResourceV1Api(api).create_namespaced_resource_claim_template(namespace, body=template("single-gpu"))
    create_pods(api, namespace, [pod_with_claims("worker", [{"name": "gpu",
                                                             "resourceClaimTemplateName": "single-gpu"}])])
    core = client.CoreV1Api(api)
    wait_for("the pod running", lambda: core.read_namespaced_pod("worker", namespace).status.phase == "Running", 90)
    claim = client.ResourceV1Api(api).list_namespaced_resource_claim(namespace).items[0]
    result = claim.status.allocation.devices.results[0]
    return result.pool, result.device


def _alive(api: client.ApiClient, namespace: str) -> bool:
    try:
        pod = client.CoreV1Api(api).read_namespaced_pod("worker", namespace)
    except ApiException as exc:
        if exc.status == 404:
            return False
        raise
    return pod.metadata.deletion_timestamp is None


@contextlib.contextmanager
def approvals_only(lab: LabState, claimwarden: Operator, tmp_path: Path) -> Iterator[Operator]:
    """claimwarden with a breaker that lets no unapproved eviction through."""
    with claimwarden.stopped():
        own = Operator(service_account_kubeconfig(lab), tmp_path / "claimwarden.log", extra=["--breaker-max-pods=0"])
        own.start()
        try:
            yield own
        finally:
            own.stop()


def test_an_approval_counts_only_for_the_generation_it_was_given_for(
        api: client.ApiClient, lab: LabState, namespace: str, claimwarden: Operator, tmp_path: Path) -> None:
    """Issue 20 finding 6: on the old code an approval of a dry run (effect None) let the record evict once it
    was changed to NoExecute."""
    pool, device = _running_pod_on_a_device(api, namespace)
    name = f"stale-{namespace}"[:60]
    alice = as_user(lab, "alice", APPROVERS)
    with granted(api, "approval-stale-test", RECORD_WRITE, ["alice"]), approvals_only(lab, claimwarden, tmp_path):
        try:
            create_record(api, name, pool, device, "None", "is it broken?")
            approve(alice, name, "alice", 1)
            approval = wait_for("the approval honoured", lambda: (read_record(api, name).get("status") or {}).get(
                "approval"), 30)
            assert approval["by"] == "alice" and approval["generation"] == 1 and approval["at"]
            assert condition(read_record(api, name), "Approved")["status"] == "True"

            patch_record(api, name, {"spec": {"effect": "NoExecute"}})  # generation 2: not what alice approved
            stale = wait_for("the approval stale", lambda: c if (c := condition(read_record(api, name), "Approved"))
                             and c["reason"] == "ApprovalStale" else None, 30)
            assert stale["status"] == "False" and "generation 1" in stale["message"], stale
            assert (read_record(api, name).get("status") or {}).get("approval") is None
            wait_for("the Warning Event", lambda: events(api, "default", name, "ApprovalIgnored"), 30)
            wait_for("the eviction paused by the breaker", lambda: (condition(read_record(api, name), "EvictionPaused")
                                                                     or {}).get("status") == "True", 30)
            time.sleep(3)
            assert _alive(api, namespace), "the stale approval let the eviction through"

            approve(alice, name, "alice", 2)
            wait_for("the pod evicted on the new approval", lambda: not _alive(api, namespace), 30)
            assert (read_record(api, name)["status"]["approval"])["generation"] == 2
        finally:
            delete_record(api, name)
            alice.close()


def test_without_the_policy_no_approval_counts_and_claimwarden_says_so(
        api: client.ApiClient, lab: LabState, namespace: str, claimwarden: Operator, tmp_path: Path) -> None:
    pool, device = _running_pod_on_a_device(api, namespace)
    name = f"unchecked-{namespace}"[:60]
    kubectl = [f"{lab.bin_dir}/kubectl", f"--kubeconfig={lab.kubeconfig}"]
    series = 'claimwarden_admission_policy_installed{policy="claimwarden-approval"} '
    marker = as_user(lab, "marker")

    def gauge(own: Operator) -> float | None:
        line = next((li for li in own.metrics().splitlines() if li.startswith(series)), None)
        return float(line.split()[-1]) if line else None

    with granted(api, "approval-unchecked-test", RECORD_WRITE, ["marker", "alice"]), \
            approvals_only(lab, claimwarden, tmp_path) as own:
        try:
            assert gauge(own) == 1
            create_record(api, name, pool, device, "NoExecute", "is it broken?")
            wait_for("the eviction paused", lambda: (condition(read_record(api, name), "EvictionPaused")
                                                      or {}).get("status") == "True", 30)
            subprocess.run([*kubectl, "delete", "validatingadmissionpolicybinding", "claimwarden-approval"],
                           check=True, capture_output=True)
            wait_for("claimwarden to see the binding gone", lambda: gauge(own) == 0, 40)
            # Without the binding the API server checks nothing: the marker approves in anyone's name...
            approve(marker, name, "someone-else", 1)
            # ...and claimwarden removes the approval and says why, rather than evict.
            wait_for("the approval removed", lambda: APPROVED_BY not in (
                read_record(api, name)["metadata"].get("annotations") or {}), 30)
            removed = wait_for("the Warning Event", lambda: events(api, "default", name, "ApprovalRemoved"), 30)
            assert removed[0].type == "Warning" and "claimwarden-approval" in removed[0].message
            shown = wait_for("the condition", lambda: condition(read_record(api, name), "Approved"), 30)
            assert shown["status"] == "False" and shown["reason"] == "ApprovalPolicyMissing", shown
            assert _alive(api, namespace), "an unchecked approval let the eviction through"
            assert 'claimwarden_approvals_ignored_total{reason="ApprovalPolicyMissing"} 1.0' in own.metrics()
        finally:
            subprocess.run([*kubectl, "apply", "-k", str(ROOT / "manifests" / "approval")], check=True,
                           capture_output=True)
        wait_for("claimwarden to see the policy back", lambda: gauge(own) == 1, 40)
        wait_for("the condition gone with the policy back", lambda: condition(read_record(api, name), "Approved")
                 is None, 30)
        try:
            alice = as_user(lab, "alice", APPROVERS)
            approve(alice, name, "alice", 1)
            wait_for("the pod evicted on an approval the API server checked", lambda: not _alive(api, namespace), 30)
            alice.close()
        finally:
            delete_record(api, name)
            marker.close()


def test_only_operators_mark_devices_and_drivers_still_write_their_slices(api: client.ApiClient,
                                                                         lab: LabState) -> None:
    """manifests/marking (optional); issue 20 finding 9: without it the driver could mark."""
    kubectl = [f"{lab.bin_dir}/kubectl", f"--kubeconfig={lab.kubeconfig}"]
    resource = client.ResourceV1Api(api)
    slice_name = sorted(s.metadata.name for s in resource.list_resource_slice().items)[0]
    driver, ops = as_user(lab, "gpu-driver"), as_user(lab, "ops", OPERATORS)
    try:
        with granted(api, "marking-test", SLICE_WRITE, ["gpu-driver", "ops"]):
            # Without the policy, the right to mark is the right to write a slice: the driver may stop evictions.
            annotate(driver, slice_name, {DRAIN + "gpu-0": "AllowCompletion"})
            annotate(api, slice_name, {DRAIN + "gpu-0": None})
            subprocess.run([*kubectl, "apply", "-k", str(ROOT / "manifests" / "marking")], check=True,
                           capture_output=True)
            def driver_marks() -> ApiException | None:
                try:
                    annotate(driver, slice_name, {PREFIX + "gpu-0": "the driver says so"})
                except ApiException as exc:
                    return exc
                annotate(api, slice_name, {PREFIX + "gpu-0": None})  # the policy is loaded asynchronously
                return None

            error = wait_for("the marking policy in force", driver_marks, 30)
            assert error.status in (403, 422) and "gpu-driver may not change the annotations" in str(error.body)
            # Neither a drain mode, nor a mark on a slice it creates.
            assert "may not change" in refused(lambda: annotate(driver, slice_name,
                                                                {DRAIN + "gpu-0": "AllowCompletion"}))
            existing = resource.read_resource_slice(slice_name)
            new_slice = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
                         "metadata": {"name": "marking-test-slice", "annotations": {PREFIX + "gpu-0": "born broken"}},
                         "spec": {"driver": existing.spec.driver, "nodeName": existing.spec.node_name,
                                  "pool": {"name": "marking-test-pool", "generation": 1, "resourceSliceCount": 1},
                                  "devices": [{"name": "gpu-0"}]}}
            assert "may not change" in refused(lambda: client.ResourceV1Api(driver).create_resource_slice(new_slice))
            # Other writes of its slice pass: its own annotations, and its spec.
            annotate(driver, slice_name, {"driver.example.com/health-checked": "now"})
            as_driver = client.ResourceV1Api(driver)
            # written back whole, as a driver's update does
            as_driver.replace_resource_slice(slice_name, as_driver.read_resource_slice(slice_name))
            # An operator marks, and clears; the driver still writes its slice meanwhile, leaving the mark alone.
            annotate(ops, slice_name, {PREFIX + "gpu-0": "XID 79", DRAIN + "gpu-0": "AllowCompletion"})
            annotate(driver, slice_name, {"driver.example.com/health-checked": "later"})
            assert "may not change" in refused(lambda: annotate(driver, slice_name, {PREFIX + "gpu-0": None}))
            annotate(ops, slice_name, {PREFIX + "gpu-0": None, DRAIN + "gpu-0": None})
    finally:
        subprocess.run([*kubectl, "delete", "--ignore-not-found", "-k", str(ROOT / "manifests" / "marking")],
                       check=True, capture_output=True)
        annotate(api, slice_name, {PREFIX + "gpu-0": None, DRAIN + "gpu-0": None,
                                   "driver.example.com/health-checked": None})
        driver.close()
        ops.close()


def test_an_approval_set_while_the_binding_was_briefly_gone_is_removed(
        api: client.ApiClient, lab: LabState, namespace: str, claimwarden: Operator, tmp_path: Path) -> None:
    """The binding deleted and created again between two of claimwarden's reads: the new UID gives it away."""
    pool, device = _running_pod_on_a_device(api, namespace)
    name = f"gap-{namespace}"[:60]
    kubectl = [f"{lab.bin_dir}/kubectl", f"--kubeconfig={lab.kubeconfig}"]
    marker = as_user(lab, "marker")
    with granted(api, "approval-gap-test", RECORD_WRITE, ["marker"]), approvals_only(lab, claimwarden, tmp_path):
        try:
            create_record(api, name, pool, device, "NoExecute", "is it broken?")
            wait_for("the eviction paused", lambda: (condition(read_record(api, name), "EvictionPaused")
                                                      or {}).get("status") == "True", 30)
            subprocess.run([*kubectl, "delete", "validatingadmissionpolicybinding", "claimwarden-approval"],
                           check=True, capture_output=True)

            def forged() -> bool:
                try:
                    approve(marker, name, "someone-else", 1)
                except ApiException:  # the API server has not dropped the binding yet
                    return False
                return True

            wait_for("a forged approval admitted", forged, 20, 0.2)
        finally:
            subprocess.run([*kubectl, "apply", "-k", str(ROOT / "manifests" / "approval")], check=True,
                           capture_output=True)
        try:
            # Seen as missing or as created again, whichever read came first: the approval goes either way.
            wait_for("the forged approval removed", lambda: APPROVED_BY not in (
                read_record(api, name)["metadata"].get("annotations") or {}), 40)
            assert wait_for("the Warning Event", lambda: events(api, "default", name, "ApprovalRemoved"), 30)
            assert _alive(api, namespace), "a forged approval let the eviction through"
        finally:
            delete_record(api, name)
            marker.close()
