"""Claims on paths the walkthrough never takes: several template claims per pod, late templates,
a refused create, a lost claim, and claims that users forge in their own namespaces."""

from __future__ import annotations

import time

from kubernetes import client

from claimwarden.objects.claims import POD_CLAIM_NAME_ANNOTATION

from .helpers import pod_with_claims, template, wait_for
from .operator import Operator


def _statuses(core: client.CoreV1Api, namespace: str, pod: str) -> dict[str, str]:
    found = core.read_namespaced_pod(pod, namespace).status.resource_claim_statuses or []
    return {s.name: s.resource_claim_name for s in found if s.resource_claim_name}


def _running(core: client.CoreV1Api, namespace: str, pod: str) -> bool:
    return bool(core.read_namespaced_pod(pod, namespace).status.phase == "Running")


def _assert_settled(core: client.CoreV1Api, namespace: str, pod: str, seconds: float = 3.0) -> None:
    """The pod's status no longer changes: nobody rewrites it in a loop."""
    before = core.read_namespaced_pod(pod, namespace).metadata.resource_version
    time.sleep(seconds)
    after = core.read_namespaced_pod(pod, namespace).metadata.resource_version
    assert before == after, f"pod {pod} was still being written ({before} -> {after})"


def _template_claims(count: int) -> list[dict[str, str]]:
    return [{"name": f"gpu{i}", "resourceClaimTemplateName": f"tmpl{i}"} for i in range(count)]


def test_pods_with_two_and_three_template_claims_with_one_template_late_get_all_their_claims(
        api: client.ApiClient, namespace: str, claimwarden: Operator) -> None:
    core, resource = client.CoreV1Api(api), client.ResourceV1Api(api)
    for count in (2, 3):
        pod = f"multi{count}"
        for i in range(count - 1):
            resource.create_namespaced_resource_claim_template(namespace, body=template(f"tmpl{i}"))
        core.create_namespaced_pod(namespace, body=pod_with_claims(pod, _template_claims(count)))
        wait_for(f"{pod}'s first {count - 1} claims recorded",
                 lambda pod=pod, count=count: len(_statuses(core, namespace, pod)) == count - 1, 30)
        time.sleep(2)  # the late template comes after the pod's claims were recorded
        resource.create_namespaced_resource_claim_template(namespace, body=template(f"tmpl{count - 1}"))
        statuses = wait_for(f"all {count} claims of {pod} recorded",
                            lambda pod=pod, count=count: (s := _statuses(core, namespace, pod)) and
                            len(s) == count and s, 30)
        assert sorted(statuses) == [f"gpu{i}" for i in range(count)]
        wait_for(f"{pod} Running", lambda pod=pod: _running(core, namespace, pod), 60)
        _assert_settled(core, namespace, pod)
        for i in range(count - 1):
            resource.delete_namespaced_resource_claim_template(f"tmpl{i}", namespace)
        resource.delete_namespaced_resource_claim_template(f"tmpl{count - 1}", namespace)


def test_a_claim_create_refused_by_quota_then_allowed_ends_with_both_claims(
        api: client.ApiClient, namespace: str, claimwarden: Operator) -> None:
    core, resource = client.CoreV1Api(api), client.ResourceV1Api(api)
    quota = "resourceclaims"
    core.create_namespaced_resource_quota(namespace, body={
        "metadata": {"name": quota}, "spec": {"hard": {"count/resourceclaims.resource.k8s.io": "1"}}})
    wait_for("the quota's status", lambda: core.read_namespaced_resource_quota(quota, namespace).status.hard, 30)
    for i in range(2):
        resource.create_namespaced_resource_claim_template(namespace, body=template(f"tmpl{i}"))
    core.create_namespaced_pod(namespace, body=pod_with_claims("quota", _template_claims(2)))
    wait_for("one claim recorded, the other refused",
             lambda: len(_statuses(core, namespace, "quota")) == 1 and any(
                 e.reason == "FailedResourceClaimCreation" and "exceeded quota" in e.message
                 for e in core.list_namespaced_event(namespace).items), 30)
    core.patch_namespaced_resource_quota(quota, namespace, {"spec": {"hard": {
        "count/resourceclaims.resource.k8s.io": "2"}}})
    wait_for("both claims recorded", lambda: len(_statuses(core, namespace, "quota")) == 2, 90)
    wait_for("the pod Running", lambda: _running(core, namespace, "quota"), 60)
    _assert_settled(core, namespace, "quota")


def test_one_of_two_generated_claims_deleted_is_recreated_and_both_stay_recorded(
        api: client.ApiClient, namespace: str, claimwarden: Operator) -> None:
    core, resource = client.CoreV1Api(api), client.ResourceV1Api(api)
    for i in range(2):
        resource.create_namespaced_resource_claim_template(namespace, body=template(f"tmpl{i}"))
    # Unschedulable on purpose (no such node), so the claims stay unreserved and can really go.
    body = pod_with_claims("lost", _template_claims(2))
    body["spec"]["nodeSelector"] = {"kubernetes.io/hostname": "no-such-node"}
    core.create_namespaced_pod(namespace, body=body)
    first = wait_for("both claims recorded", lambda: (s := _statuses(core, namespace, "lost")) and len(s) == 2 and s,
                     30)
    resource.delete_namespaced_resource_claim(first["gpu1"], namespace)
    second = wait_for("gpu1 re-created and recorded beside gpu0",
                      lambda: (s := _statuses(core, namespace, "lost")) and len(s) == 2 and
                      s["gpu1"] != first["gpu1"] and s, 30)
    assert second["gpu0"] == first["gpu0"]
    names = {c.metadata.name for c in resource.list_namespaced_resource_claim(namespace).items}
    assert names == set(second.values())
    _assert_settled(core, namespace, "lost")


def test_generated_claims_block_owner_deletion_like_upstream(
        api: client.ApiClient, namespace: str, claimwarden: Operator) -> None:
    core, resource = client.CoreV1Api(api), client.ResourceV1Api(api)
    resource.create_namespaced_resource_claim_template(namespace, body=template("tmpl0"))
    core.create_namespaced_pod(namespace, body=pod_with_claims("owned", _template_claims(1)))
    name = wait_for("the claim recorded", lambda: _statuses(core, namespace, "owned").get("gpu0"), 30)
    (ref,) = resource.read_namespaced_resource_claim(name, namespace).metadata.owner_references
    assert (ref.kind, ref.name, ref.controller, ref.block_owner_deletion) == ("Pod", "owned", True, True)


def test_a_claim_in_another_namespace_naming_the_pod_as_owner_is_never_taken_for_the_pods(
        api: client.ApiClient, namespace: str, claimwarden: Operator) -> None:
    """Owner references are only meaningful within a namespace. A claim elsewhere that names the pod's
    UID as its controller (anyone who can create claims in some namespace can write one) must not be
    adopted, nor make the duplicate clean-up delete the user's claim that has the same name here."""
    core, resource = client.CoreV1Api(api), client.ResourceV1Api(api)
    other = f"{namespace}-x"[:63]
    core.create_namespace(body={"metadata": {"name": other}})
    try:
        resource.create_namespaced_resource_claim_template(namespace, body=template("tmpl0"))
        pod = core.create_namespaced_pod(namespace, body=pod_with_claims("victim", _template_claims(1)))
        own = wait_for("the pod's own claim recorded", lambda: _statuses(core, namespace, "victim").get("gpu0"), 30)
        resource.create_namespaced_resource_claim(namespace, body={
            "metadata": {"name": "forged"}, "spec": template("x")["spec"]["spec"]})
        resource.create_namespaced_resource_claim(other, body={
            "metadata": {"name": "forged", "annotations": {POD_CLAIM_NAME_ANNOTATION: "gpu0"},
                         "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": "victim",
                                              "uid": pod.metadata.uid, "controller": True}]},
            "spec": template("x")["spec"]["spec"]})
        # Any update of the pod makes claimwarden look at it again (the garbage collector soon deletes
        # the forged claim, whose owner does not exist in its namespace, so this must come at once).
        core.patch_namespaced_pod("victim", namespace, {"metadata": {"labels": {"touched": "yes"}}})
        time.sleep(3)
        mine = resource.read_namespaced_resource_claim("forged", namespace)
        assert mine.metadata.deletion_timestamp is None, "the user's claim was deleted as a duplicate"
        assert _statuses(core, namespace, "victim") == {"gpu0": own}
    finally:
        core.delete_namespace(other)
