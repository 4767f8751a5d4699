"""The ClusterRoles for people (manifests/roles): each person, bound to one role, does what the role is for with
`kubectl claimwarden` and is refused the rest, on the shared lab.

People are real identities, not impersonation: a client certificate per person signed by the lab's CA
(pki.write_user_kubeconfig), the way an identity provider would hand them out, so the plugin runs unchanged.
Records are marked with effect None (a dry run), so a claimwarden running in the same session evicts nothing.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client

from claimwarden_lab import pki
from claimwarden_lab.cluster import LabState

from .helpers import wait_for

ROOT = Path(__file__).resolve().parents[2]
PLUGIN = Path(sys.executable).parent / "kubectl-claimwarden"
APPROVERS = "claimwarden:approvers"
DEVICE = "kwok-node-1/gpu-7"
RECORDS = ("claimwarden.io", "v1alpha1", "unhealthydevices")
# person -> (the ClusterRole bound to them, their groups)
PEOPLE = {
    "role-viewer": ("claimwarden-view", ()),
    "role-reporter": ("claimwarden-health-reporter", ()),
    "role-approver": ("claimwarden-approver", (APPROVERS,)),
    "role-editor": ("claimwarden-edit", ()),
    "std-viewer": ("view", ()),
    "std-editor": ("edit", ()),
}


def _kubectl(lab: LabState, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([f"{lab.bin_dir}/kubectl", f"--kubeconfig={lab.kubeconfig}", *args],
                          capture_output=True, text=True, check=True)


@pytest.fixture(scope="module")
def people(lab: LabState, api: client.ApiClient) -> Iterator[dict[str, Path]]:
    """manifests/roles applied, each person bound to their role; their kubeconfigs by name."""
    _kubectl(lab, "apply", "-k", str(ROOT / "manifests" / "roles"))
    rbac = client.RbacAuthorizationV1Api(api)
    kubeconfigs = {}
    for person, (role, groups) in PEOPLE.items():
        rbac.create_cluster_role_binding({
            "metadata": {"name": f"test-{person}"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": person}]})
        kubeconfigs[person] = lab.dir / f"{person}.kubeconfig"
        pki.write_user_kubeconfig(kubeconfigs[person], lab.dir / "pki", lab.api_url, user=person, groups=groups)
    try:
        yield kubeconfigs
    finally:
        for person in PEOPLE:
            rbac.delete_cluster_role_binding(f"test-{person}")
        # The roles stay: manifests/base installs them too, and other tests may have applied base.


def plugin(kubeconfig: Path, verb: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(PLUGIN), verb, f"--kubeconfig={kubeconfig}", *args],
                          capture_output=True, text=True, timeout=60)


def allowed(api: client.ApiClient, person: str, verb: str, resource: str, group: str = "claimwarden.io") -> bool:
    """A SubjectAccessReview for `person` with their groups; `resource` may name a subresource (pods/eviction)."""
    groups = [*PEOPLE[person][1], "system:authenticated"]
    resource, _, subresource = resource.partition("/")
    review = client.AuthorizationV1Api(api).create_subject_access_review(body={
        "apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
        "spec": {"user": person, "groups": groups,
                 "resourceAttributes": {"group": group, "resource": resource, "subresource": subresource,
                                        "verb": verb}}})
    return bool(review.status.allowed)


@pytest.mark.parametrize(("person", "verb", "resource", "expected"), [
    ("role-viewer", "list", "unhealthydevices", True),
    ("role-viewer", "create", "unhealthydevices", False),
    ("role-viewer", "patch", "unhealthydevices", False),
    ("role-reporter", "create", "unhealthydevices", True),
    ("role-reporter", "delete", "unhealthydevices", True),
    ("role-reporter", "patch", "healthpolicies", False),
    ("role-approver", "patch", "unhealthydevices", True),
    ("role-approver", "create", "unhealthydevices", False),
    ("role-approver", "delete", "unhealthydevices", False),
    ("role-editor", "create", "healthpolicies", True),
    ("role-editor", "delete", "unhealthydevices", True),
    ("role-editor", "patch", "unhealthydevices/status", False),
    # Aggregated: the standard view (and edit, through view) read records and policies, and write none.
    ("std-viewer", "list", "unhealthydevices", True),
    ("std-viewer", "watch", "healthpolicies", True),
    ("std-editor", "list", "unhealthydevices", True),
    ("std-editor", "create", "unhealthydevices", False),
])
def test_each_role_allows_what_it_is_for(api: client.ApiClient, people: dict[str, Path], person: str, verb: str,
                                        resource: str, expected: bool) -> None:
    if expected and PEOPLE[person][0] in ("view", "edit"):
        # kube-controller-manager's aggregation controller copies the rules into view and edit a moment after apply.
        wait_for(f"{person} may {verb} {resource}", lambda: allowed(api, person, verb, resource), 30)
    assert allowed(api, person, verb, resource) is expected


@pytest.mark.parametrize("role", ["claimwarden-view", "claimwarden-health-reporter", "claimwarden-approver",
                                  "claimwarden-edit"])
def test_no_role_for_people_writes_slices_reads_secrets_or_drains(api: client.ApiClient, people: dict[str, Path],
                                                                  role: str) -> None:
    [person] = [p for p, (r, _) in PEOPLE.items() if r == role]
    for verb, resource, group in (("patch", "resourceslices", "resource.k8s.io"), ("get", "secrets", ""),
                                  ("patch", "nodes", ""), ("create", "pods/eviction", ""),
                                  ("patch", "unhealthydevices/status", "claimwarden.io")):
        assert not allowed(api, person, verb, resource, group), (person, verb, resource)


def test_view_reads_with_the_plugin_reporter_marks_approver_approves(api: client.ApiClient,
                                                                    people: dict[str, Path]) -> None:
    viewer, reporter, approver = people["role-viewer"], people["role-reporter"], people["role-approver"]
    for verb in (("devices", "-o", "json"), ("doctor", "-o", "json")):
        read = plugin(viewer, *verb)
        # doctor exits 1 when it finds errors in the shared lab; 3 would be a refusal.
        assert read.returncode in (0, 1) and read.stdout.startswith(("[", "{")), read.stderr
        assert "403" not in read.stderr

    refused = plugin(viewer, "mark", DEVICE, "--effect", "None", "--reason", "roles test")
    assert refused.returncode == 3 and "403" in refused.stderr, refused.stderr

    marked = plugin(reporter, "mark", DEVICE, "--effect", "None", "--reason", "roles test")
    assert marked.returncode == 0, marked.stderr
    custom = client.CustomObjectsApi(api)
    name = marked.stdout.rsplit("unhealthydevice/", 1)[1].strip()
    try:
        # The reporter may write records but is no approver: the approval policy refuses it.
        not_approver = plugin(reporter, "approve", DEVICE)
        assert not_approver.returncode == 3 and "may not approve" in not_approver.stderr, not_approver.stderr
        assert plugin(approver, "mark", "kwok-node-1/gpu-6", "--effect", "None", "--reason", "x").returncode == 3
        assert plugin(approver, "clear", DEVICE).returncode == 3

        approved = plugin(approver, "approve", DEVICE)
        assert approved.returncode == 0, approved.stderr
        record = custom.get_cluster_custom_object(*RECORDS, name)
        assert record["metadata"]["annotations"]["claimwarden.io/approved-by"] == "role-approver"

        assert plugin(viewer, "clear", DEVICE).returncode == 3
        cleared = plugin(reporter, "clear", DEVICE)
        assert cleared.returncode == 0, cleared.stderr
    finally:
        if any(r["metadata"]["name"] == name for r in custom.list_cluster_custom_object(*RECORDS)["items"]):
            custom.delete_cluster_custom_object(*RECORDS, name)
    assert not [r for r in custom.list_cluster_custom_object(*RECORDS)["items"] if r["metadata"]["name"] == name]
