"""PodGroup claims (claims/podgroups.py and the PodGroup parts of the claims and reservations plans)."""

from __future__ import annotations

from typing import Any

import pytest

from claimwarden.claims import podgroups
from claimwarden.claims.generation import ClaimPlan, ClaimProblem, CreateClaim, RecordClaim, status_entries
from claimwarden.claims.plan import PodPlan, ReserveClaim, plan_pod
from claimwarden.claims.podgroups import GroupView, build_podgroup_claim, group_entry_for, plan_podgroup
from claimwarden.objects.claims import DELETE_PROTECTION_FINALIZER, POD_CLAIM_NAME_ANNOTATION
from claimwarden.reservations.plan import plan_claim

NS = "ns"
PG_UID = "pg-uid-1"
ALLOCATION = {"devices": {"results": [{"request": "gpu", "driver": "gpu.example.com", "pool": "n1",
                                       "device": "gpu-0"}]}}
TEMPLATE = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": "gpu", "namespace": NS},
            "spec": {"metadata": {"labels": {"team": "a"}, "annotations": {"note": "x"}},
                     "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu"}}]}}}}


def podgroup(entries: list[dict[str, Any]] | None = None, statuses: list[dict[str, Any]] | None = None, *,
             name: str = "team", uid: str = PG_UID, deleting: bool = False) -> dict[str, Any]:
    group: dict[str, Any] = {"apiVersion": "scheduling.k8s.io/v1beta1", "kind": "PodGroup",
                             "metadata": {"name": name, "namespace": NS, "uid": uid},
                             "spec": {"resourceClaims": entries if entries is not None
                                      else [{"name": "gpu", "resourceClaimTemplateName": "gpu"}]}}
    if statuses is not None:
        group["status"] = {"resourceClaimStatuses": statuses}
    if deleting:
        group["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return group


def member(entries: list[dict[str, Any]] | None = None, statuses: list[dict[str, Any]] | None = None, *,
           group: str | None = "team", node: str | None = None, name: str = "p1", uid: str = "pod-1") -> dict[str, Any]:
    pod: dict[str, Any] = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NS, "uid": uid},
                           "spec": {"resourceClaims": entries if entries is not None
                                    else [{"name": "gpu", "resourceClaimTemplateName": "gpu"}]}}
    if group:
        pod["spec"]["schedulingGroup"] = {"podGroupName": group}
    if node:
        pod["spec"]["nodeName"] = node
    if statuses is not None:
        pod["status"] = {"resourceClaimStatuses": statuses}
    return pod


def group_claim(name: str = "team-gpu-abcde", *, owner_uid: str = PG_UID, owner_name: str = "team",
                entry: str = "gpu", allocated: bool = False, reserved: list[dict[str, Any]] | None = None,
                created: str = "2026-01-01T00:00:00Z", version: str = "v1beta1") -> dict[str, Any]:
    claim: dict[str, Any] = {
        "metadata": {"name": name, "namespace": NS, "uid": f"uid-{name}", "creationTimestamp": created,
                     "annotations": {POD_CLAIM_NAME_ANNOTATION: entry},
                     "ownerReferences": [{"apiVersion": f"scheduling.k8s.io/{version}", "kind": "PodGroup",
                                          "name": owner_name, "uid": owner_uid, "controller": True}]},
        "status": {}}
    if allocated:
        claim["status"]["allocation"] = ALLOCATION
        claim["metadata"]["finalizers"] = [DELETE_PROTECTION_FINALIZER]
    if reserved:
        claim["status"]["reservedFor"] = reserved
    return claim


GROUP_ENTRY = {"apiGroup": "scheduling.k8s.io", "resource": "podgroups", "name": "team", "uid": PG_UID}


# --- BindTo ---------------------------------------------------------------------------------------

@pytest.mark.parametrize(("pod_entry", "binds"), [
    ({"name": "gpu", "resourceClaimTemplateName": "gpu"}, True),
    ({"name": "gpu", "resourceClaimTemplateName": "other"}, False),  # same name, other template
    ({"name": "gpu", "resourceClaimName": "gpu"}, False),  # same name, a claim instead of a template
    ({"name": "nic", "resourceClaimTemplateName": "gpu"}, False),  # same template, other name
])
def test_a_pod_claim_binds_to_the_group_only_when_name_and_source_match(pod_entry: dict[str, Any],
                                                                         binds: bool) -> None:
    assert (group_entry_for(podgroup(), pod_entry) is not None) is binds


# --- the claim body -------------------------------------------------------------------------------

def test_the_group_claim_is_owned_by_the_podgroup_named_after_it_and_annotated_like_upstream() -> None:
    claim = build_podgroup_claim(podgroup(), "gpu", TEMPLATE, "scheduling.k8s.io/v1beta1")
    meta = claim["metadata"]
    assert meta["generateName"] == "team-gpu-"
    assert meta["namespace"] == NS
    assert meta["ownerReferences"] == [{"apiVersion": "scheduling.k8s.io/v1beta1", "kind": "PodGroup",
                                        "name": "team", "uid": PG_UID, "controller": True}]
    assert meta["annotations"] == {"note": "x", POD_CLAIM_NAME_ANNOTATION: "gpu"}
    assert meta["labels"] == {"team": "a"}
    assert claim["spec"] == TEMPLATE["spec"]["spec"]
    assert set(meta) == {"generateName", "namespace", "ownerReferences", "annotations", "labels"}


def test_long_podgroup_and_claim_names_are_truncated_like_pod_claims() -> None:
    claim = build_podgroup_claim(podgroup(name="g" * 63), "c" * 63, TEMPLATE, "scheduling.k8s.io/v1alpha2")
    assert claim["metadata"]["generateName"] == "g" * 28 + "-" + "c" * 28
    assert claim["metadata"]["ownerReferences"][0]["apiVersion"] == "scheduling.k8s.io/v1alpha2"


# --- the PodGroup's plan --------------------------------------------------------------------------

def test_a_template_entry_without_a_claim_is_created_once() -> None:
    plan = plan_podgroup(podgroup(), {}, [], {"gpu": TEMPLATE})
    assert plan == ClaimPlan(create=(CreateClaim("gpu", "gpu"),))


def test_a_recorded_claim_the_group_controls_needs_nothing() -> None:
    claim = group_claim()
    group = podgroup(statuses=[{"name": "gpu", "resourceClaimName": claim["metadata"]["name"]}])
    assert plan_podgroup(group, {claim["metadata"]["name"]: claim}, [claim], {"gpu": TEMPLATE}).idle


def test_a_claim_created_but_not_recorded_is_recorded_not_created_again() -> None:
    older, newer = group_claim("team-gpu-aaaaa"), group_claim("team-gpu-bbbbb", created="2026-01-02T00:00:00Z")
    plan = plan_podgroup(podgroup(), {}, [newer, older], {"gpu": TEMPLATE})
    assert plan == ClaimPlan(record=(RecordClaim("gpu", "team-gpu-aaaaa"),))


def test_a_recorded_claim_that_is_gone_or_owned_by_another_group_is_created_anew() -> None:
    other = group_claim(owner_uid="other-uid")
    group = podgroup(statuses=[{"name": "gpu", "resourceClaimName": other["metadata"]["name"]}])
    assert plan_podgroup(group, {other["metadata"]["name"]: other}, [], {"gpu": TEMPLATE}).create
    assert plan_podgroup(group, {}, [], {"gpu": TEMPLATE}).create


def test_a_missing_template_is_a_problem_with_upstreams_text() -> None:
    plan = plan_podgroup(podgroup(), {}, [], {})
    assert plan == ClaimPlan(problems=(ClaimProblem(
        "gpu", 'resource claim template "gpu": resourceclaimtemplate.resource.k8s.io "gpu" not found'),))


def test_claims_by_name_and_deleting_groups_get_nothing() -> None:
    by_name = podgroup([{"name": "gpu", "resourceClaimName": "shared"}])
    assert plan_podgroup(by_name, {}, [], {}).idle
    assert plan_podgroup(podgroup(deleting=True), {}, [], {"gpu": TEMPLATE}).idle


def test_status_entries_keep_every_entry_of_this_manager() -> None:
    group = podgroup([{"name": "gpu", "resourceClaimTemplateName": "gpu"},
                      {"name": "nic", "resourceClaimTemplateName": "nic"},
                      {"name": "shared", "resourceClaimName": "shared"}],
                     statuses=[{"name": "nic", "resourceClaimName": "team-nic-xxxxx"}])
    assert status_entries(group, {"gpu": "team-gpu-aaaaa"}, {}) == [
        {"name": "gpu", "resourceClaimName": "team-gpu-aaaaa"},
        {"name": "nic", "resourceClaimName": "team-nic-xxxxx"}]


# --- member pods ----------------------------------------------------------------------------------

def test_a_member_pod_never_gets_its_own_claim_and_waits_for_the_groups() -> None:
    view = GroupView("team", podgroup(), ())
    assert plan_pod(member(), {}, [], {"gpu": TEMPLATE}, group=view) == PodPlan()


def test_a_member_pod_records_the_groups_claim_once_it_exists() -> None:
    claim = group_claim()
    view = GroupView("team", podgroup(), (claim,))
    plan = plan_pod(member(), {}, [], {"gpu": TEMPLATE}, group=view)
    assert plan == PodPlan(record=(RecordClaim("gpu", claim["metadata"]["name"]),))


def test_a_member_pod_that_recorded_the_groups_claim_needs_nothing() -> None:
    claim = group_claim()
    pod = member(statuses=[{"name": "gpu", "resourceClaimName": claim["metadata"]["name"]}])
    view = GroupView("team", podgroup(), (claim,))
    assert plan_pod(pod, {claim["metadata"]["name"]: claim}, [], {"gpu": TEMPLATE}, group=view).idle


def test_a_pod_claim_that_does_not_match_the_group_is_generated_per_pod() -> None:
    pod = member([{"name": "scratch", "resourceClaimTemplateName": "gpu"}])
    plan = plan_pod(pod, {}, [], {"gpu": TEMPLATE}, group=GroupView("team", podgroup(), ()))
    assert [c.pod_claim_name for c in plan.create] == ["scratch"]


def test_a_missing_podgroup_holds_back_every_claim_of_the_pod_with_a_problem() -> None:
    pod = member([{"name": "gpu", "resourceClaimTemplateName": "gpu"},
                  {"name": "scratch", "resourceClaimTemplateName": "gpu"}])
    plan = plan_pod(pod, {}, [], {"gpu": TEMPLATE}, group=GroupView("team", None))
    assert not plan.create and not plan.record
    assert [p.pod_claim_name for p in plan.problems] == ["gpu", "scratch"]
    assert plan.problems[0] == ClaimProblem("gpu", 'PodGroup "team" not found; its claims are generated once it exists')


def test_without_podgroups_served_a_member_pod_is_planned_as_before() -> None:
    plan = plan_pod(member(), {}, [], {"gpu": TEMPLATE}, group=None)
    assert [c.pod_claim_name for c in plan.create] == ["gpu"]


def test_a_prebound_member_pod_reserves_the_group_claim_for_the_podgroup_once() -> None:
    claim = group_claim(allocated=True)
    name = claim["metadata"]["name"]
    pod = member(statuses=[{"name": "gpu", "resourceClaimName": name}], node="n1")
    view = GroupView("team", podgroup(), (claim,))
    plan = plan_pod(pod, {name: claim}, [], {"gpu": TEMPLATE}, group=view)
    assert plan.reserve == (ReserveClaim(name, GROUP_ENTRY),)
    reserved = group_claim(allocated=True, reserved=[GROUP_ENTRY])
    assert plan_pod(pod, {name: reserved}, [], {"gpu": TEMPLATE}, group=view).idle


def test_a_claim_by_name_shared_through_the_group_is_reserved_for_the_group() -> None:
    shared = {"metadata": {"name": "shared", "namespace": NS, "uid": "uid-shared"},
              "status": {"allocation": ALLOCATION}}
    entries = [{"name": "gpu", "resourceClaimName": "shared"}]
    pod = member(entries, node="n1")
    view = GroupView("team", podgroup(entries), ())
    assert plan_pod(pod, {"shared": shared}, [], {}, group=view).reserve == (ReserveClaim("shared", GROUP_ENTRY),)


# --- releasing ------------------------------------------------------------------------------------

def test_the_group_reservation_stays_while_the_podgroup_exists_even_without_pods() -> None:
    claim = group_claim(allocated=True, reserved=[GROUP_ENTRY])
    for view in ({"uid": PG_UID, "deleting": False}, {"uid": PG_UID, "deleting": True}):
        plan = plan_claim(claim, {}, None, podgroups={"team": view})
        assert not plan.drop and not plan.deallocate and plan.keep == (GROUP_ENTRY,)


def test_the_group_reservation_goes_with_the_podgroup_and_the_device_is_freed() -> None:
    claim = group_claim(allocated=True, reserved=[GROUP_ENTRY])
    for gone in (None, {"uid": "a-new-podgroup", "deleting": False}):
        plan = plan_claim(claim, {}, None, podgroups={"team": gone})
        assert plan.drop == (GROUP_ENTRY,) and plan.deallocate and plan.remove_finalizer
        # The garbage collector deletes a claim whose PodGroup is gone, as upstream leaves it to.
        assert not plan.delete_claim


def test_a_podgroup_missing_from_the_cache_is_confirmed_before_anything_is_dropped() -> None:
    claim = group_claim(allocated=True, reserved=[GROUP_ENTRY])
    plan = plan_claim(claim, {}, None, podgroups={})
    assert plan.unknown_podgroups == ("team",) and not plan.drop and not plan.deallocate


def test_without_podgroups_served_group_reservations_are_kept_and_pods_still_released() -> None:
    pod_entry = {"resource": "pods", "name": "gone", "uid": "pod-gone"}
    claim = group_claim(allocated=True, reserved=[GROUP_ENTRY, pod_entry])
    plan = plan_claim(claim, {"gone": None}, None, podgroups=None)
    assert plan.drop == (pod_entry,) and plan.keep == (GROUP_ENTRY,) and not plan.deallocate


def test_a_claim_owned_by_a_podgroup_is_not_a_pods_claim() -> None:
    claim = group_claim()
    assert podgroups.controlling_podgroup_uid(claim) == PG_UID
    assert podgroups.is_for_group_of(claim, member())
    assert not podgroups.is_for_group_of(claim, member(group="other"))
    assert podgroups.controlling_podgroup_uid(group_claim(version="v1alpha2")) == PG_UID


# --- what the indices keep ------------------------------------------------------------------------

def test_projections_keep_what_podgroup_claims_need() -> None:
    from claimwarden.objects import trimmed

    pod = trimmed.pod({**member(), "status": {"phase": "Running"}})
    assert pod["spec"]["schedulingGroup"] == {"podGroupName": "team"}
    assert "schedulingGroup" not in trimmed.pod(member(group=None))["spec"]
    group = podgroup(statuses=[{"name": "gpu", "resourceClaimName": "team-gpu-abcde"}])
    group["metadata"]["finalizers"] = [podgroups.PROTECTION_FINALIZER]
    projected = trimmed.podgroup(group)
    assert projected["apiVersion"] == "scheduling.k8s.io/v1beta1"  # staleness.py lists it at this version
    assert projected["spec"] == {"resourceClaims": group["spec"]["resourceClaims"]}
    assert projected["status"] == group["status"]
    assert projected["metadata"]["finalizers"] == [podgroups.PROTECTION_FINALIZER]


def test_claims_owned_by_a_podgroup_are_looked_up_by_its_uid_within_its_namespace() -> None:
    from claimwarden.cache import Cache

    claim = group_claim()
    name = claim["metadata"]["name"]
    names = ("pods_by_name", "pods_by_claim", "pods_by_template", "claims_by_name", "claims_by_owner",
             "claims_by_device", "claims_by_record", "templates_by_name")
    indices: dict[str, Any] = {n: {} for n in names}
    indices["claims_by_name"] = {(NS, name): [claim]}
    indices["claims_by_podgroup"] = {(NS, PG_UID): [name], ("elsewhere", PG_UID): [name]}
    view = Cache(indices)
    assert view.claims_owned_by_podgroup(NS, PG_UID) == [claim]
    assert view.claims_owned_by_podgroup("elsewhere", PG_UID) == []
    assert view.claims_owned_by_podgroup(NS, "another-uid") == []
