"""The claims plan: the claim body, generation, adoption, problems, reservation and duplicates."""

from __future__ import annotations

import copy
from typing import Any

from claimwarden.claims import plan
from claimwarden.claims.generation import status_entries
from claimwarden.claims.plan import (
    ClaimProblem,
    CreateClaim,
    PodPlan,
    RecordClaim,
    ReserveClaim,
    build_claim,
    duplicate_claims,
    plan_pod,
)
from claimwarden.objects.claims import POD_CLAIM_NAME_ANNOTATION, RESERVED_FOR_MAX

from .claim_fixtures import pod_owner_reference

NS = "ns"
POD_UID = "pod-uid-1"
ALLOCATION = {"devices": {"results": [{"request": "gpu", "driver": "gpu.example.com", "pool": "n1",
                                       "device": "gpu-0"}]}}


def make_pod(
    claims: list[dict[str, Any]] | None = None,
    statuses: list[dict[str, Any]] | None = None,
    *,
    node: str | None = None,
    phase: str | None = None,
    deleting: bool = False,
    name: str = "pod1",
    uid: str = POD_UID,
) -> dict[str, Any]:
    pod: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NS, "uid": uid},
        "spec": {"containers": [{"name": "c"}]},
    }
    if claims is not None:
        pod["spec"]["resourceClaims"] = claims
    if node:
        pod["spec"]["nodeName"] = node
    if statuses is not None or phase:
        pod["status"] = {}
    if statuses is not None:
        pod["status"]["resourceClaimStatuses"] = statuses
    if phase:
        pod["status"]["phase"] = phase
    if deleting:
        pod["metadata"]["deletionTimestamp"] = "2025-01-01T00:00:00Z"
    return pod


def template_entry(name: str = "gpu", template: str = "gpu-tmpl") -> dict[str, Any]:
    return {"name": name, "resourceClaimTemplateName": template}


def user_entry(name: str = "shared", claim: str = "big-claim") -> dict[str, Any]:
    return {"name": name, "resourceClaimName": claim}


def make_claim(
    name: str,
    *,
    owner_uid: str | None = None,
    pod_claim: str | None = None,
    allocated: bool = False,
    reserved: int = 0,
    reserved_uid: str | None = None,
    deleting: bool = False,
    created: str | None = "2025-01-01T00:00:00Z",
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": NS}
    if created:
        meta["creationTimestamp"] = created
    if owner_uid:
        meta["ownerReferences"] = [pod_owner_reference(owner_uid, "pod1")]
    if pod_claim:
        meta["annotations"] = {POD_CLAIM_NAME_ANNOTATION: pod_claim}
    if deleting:
        meta["deletionTimestamp"] = "2025-01-02T00:00:00Z"
    claim: dict[str, Any] = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": meta,
                             "spec": {}}
    status: dict[str, Any] = {}
    if allocated:
        status["allocation"] = ALLOCATION
    entries = [{"resource": "pods", "name": f"other-{i}", "uid": f"other-uid-{i}"} for i in range(reserved)]
    if reserved_uid:
        entries.append({"resource": "pods", "name": "pod1", "uid": reserved_uid})
    if entries:
        status["reservedFor"] = entries
    if status:
        claim["status"] = status
    return claim


def make_template(name: str = "gpu-tmpl", *, labels: dict[str, str] | None = None,
                  annotations: dict[str, str] | None = None) -> dict[str, Any]:
    tmeta: dict[str, Any] = {}
    if labels is not None:
        tmeta["labels"] = labels
    if annotations is not None:
        tmeta["annotations"] = annotations
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "namespace": NS, "uid": "tmpl-uid", "labels": {"on-template-object": "x"},
                     "annotations": {"template-object": "y"}, "finalizers": ["example.com/keep"],
                     "resourceVersion": "42"},
        "spec": {
            "metadata": tmeta,
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.example.com",
                                                                           "count": 1}}]}},
        },
    }


def by_name(*claims: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {claim["metadata"]["name"]: claim for claim in claims}


TEMPLATES = {"gpu-tmpl": make_template()}


# --- build_claim --------------------------------------------------------------------------------

def test_build_claim_has_exactly_the_expected_shape() -> None:
    template = make_template(labels={"team": "ml"}, annotations={"note": "copied"})
    claim = build_claim(make_pod(), "gpu", template)
    assert claim == {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {
            "generateName": "pod1-gpu-",
            "namespace": NS,
            "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": "pod1", "uid": POD_UID,
                                 "controller": True, "blockOwnerDeletion": True}],
            "annotations": {"note": "copied", POD_CLAIM_NAME_ANNOTATION: "gpu"},
            "labels": {"team": "ml"},
        },
        "spec": template["spec"]["spec"],
    }


def test_build_claim_owner_reference_blocks_owner_deletion_like_upstream() -> None:
    (ref,) = build_claim(make_pod(), "gpu", make_template())["metadata"]["ownerReferences"]
    assert ref["blockOwnerDeletion"] is True
    assert ref["controller"] is True


def test_build_claim_without_template_labels_omits_labels() -> None:
    claim = build_claim(make_pod(), "gpu", make_template())
    assert "labels" not in claim["metadata"]
    assert claim["metadata"]["annotations"] == {POD_CLAIM_NAME_ANNOTATION: "gpu"}


def test_build_claim_pod_claim_annotation_wins_over_template() -> None:
    template = make_template(annotations={POD_CLAIM_NAME_ANNOTATION: "wrong"})
    assert build_claim(make_pod(), "gpu", template)["metadata"]["annotations"] == {POD_CLAIM_NAME_ANNOTATION: "gpu"}


def test_build_claim_copies_nothing_from_the_template_object_metadata() -> None:
    meta = build_claim(make_pod(), "gpu", make_template())["metadata"]
    assert set(meta) == {"generateName", "namespace", "ownerReferences", "annotations"}


def test_build_claim_spec_is_a_deep_copy() -> None:
    template = make_template(labels={"team": "ml"}, annotations={"note": "copied"})
    original = copy.deepcopy(template)
    claim = build_claim(make_pod(), "gpu", template)
    claim["spec"]["devices"]["requests"][0]["name"] = "changed"
    claim["metadata"]["labels"]["team"] = "changed"
    claim["metadata"]["annotations"]["note"] = "changed"
    assert template == original


def test_build_claim_truncates_long_generate_names() -> None:
    pod = make_pod(name="p" * 63)
    assert build_claim(pod, "c" * 63, make_template())["metadata"]["generateName"] == "p" * 28 + "-" + "c" * 28


def test_build_claim_tolerates_template_without_inner_metadata_or_spec() -> None:
    claim = build_claim(make_pod(), "gpu", {"metadata": {"name": "t"}, "spec": {}})
    assert claim["spec"] == {}
    assert claim["metadata"]["annotations"] == {POD_CLAIM_NAME_ANNOTATION: "gpu"}


# --- plan_pod: nothing to do --------------------------------------------------------------------

def test_pod_without_claims_is_idle() -> None:
    plan = plan_pod(make_pod(), {}, [], TEMPLATES)
    assert plan == PodPlan()
    assert plan.idle


def test_deleting_pod_does_nothing() -> None:
    pod = make_pod([template_entry()], node="n1", deleting=True)
    assert plan_pod(pod, {}, [], TEMPLATES).idle


def test_deleting_pod_does_not_reserve_either() -> None:
    pod = make_pod([user_entry()], node="n1", deleting=True)
    assert plan_pod(pod, by_name(make_claim("big-claim", allocated=True)), [], {}).idle


def test_succeeded_pod_does_nothing() -> None:
    pod = make_pod([template_entry()], node="n1", phase="Succeeded")
    assert plan_pod(pod, {}, [], TEMPLATES).idle


def test_failed_pod_does_nothing() -> None:
    pod = make_pod([user_entry()], node="n1", phase="Failed")
    assert plan_pod(pod, by_name(make_claim("big-claim", allocated=True)), [], {}).idle


def test_user_claim_is_never_created() -> None:
    assert plan_pod(make_pod([user_entry()]), {}, [], {}).idle


def test_not_needed_entry_does_nothing() -> None:
    pod = make_pod([template_entry()], [{"name": "gpu"}])
    assert plan_pod(pod, {}, [], {}).idle


def test_not_needed_entry_does_not_stop_later_entries() -> None:
    pod = make_pod([template_entry("skip"), template_entry("gpu")], [{"name": "skip"}])
    assert plan_pod(pod, {}, [], TEMPLATES).create == (CreateClaim("gpu", "gpu-tmpl"),)


def test_recorded_claim_controlled_by_pod_is_fine() -> None:
    pod = make_pod([template_entry()], [{"name": "gpu", "resourceClaimName": "pod1-gpu-abcde"}])
    claim = make_claim("pod1-gpu-abcde", owner_uid=POD_UID, pod_claim="gpu")
    assert plan_pod(pod, by_name(claim), [claim], TEMPLATES).idle


# --- plan_pod: creation, adoption, problems -----------------------------------------------------

def test_template_entry_without_status_is_created() -> None:
    plan = plan_pod(make_pod([template_entry()]), {}, [], TEMPLATES)
    assert plan == PodPlan(create=(CreateClaim("gpu", "gpu-tmpl"),))
    assert not plan.idle


def test_claim_deleted_while_pod_needs_it_is_recreated() -> None:
    pod = make_pod([template_entry()], [{"name": "gpu", "resourceClaimName": "pod1-gpu-gone1"}])
    assert plan_pod(pod, {}, [], TEMPLATES) == PodPlan(create=(CreateClaim("gpu", "gpu-tmpl"),))


def test_recorded_claim_owned_by_someone_else_is_replaced() -> None:
    pod = make_pod([template_entry()], [{"name": "gpu", "resourceClaimName": "pod1-gpu-abcde"}])
    foreign = make_claim("pod1-gpu-abcde", owner_uid="previous-pod-uid", pod_claim="gpu")
    assert plan_pod(pod, by_name(foreign), [], TEMPLATES) == PodPlan(create=(CreateClaim("gpu", "gpu-tmpl"),))


def test_recorded_claim_without_owner_is_replaced() -> None:
    pod = make_pod([template_entry()], [{"name": "gpu", "resourceClaimName": "pod1-gpu-abcde"}])
    plain = make_claim("pod1-gpu-abcde")
    assert plan_pod(pod, by_name(plain), [], TEMPLATES).create == (CreateClaim("gpu", "gpu-tmpl"),)


def test_owned_claim_with_matching_annotation_is_adopted_instead_of_created() -> None:
    owned = make_claim("pod1-gpu-abcde", owner_uid=POD_UID, pod_claim="gpu")
    plan = plan_pod(make_pod([template_entry()]), by_name(owned), [owned], TEMPLATES)
    assert plan == PodPlan(record=(RecordClaim("gpu", "pod1-gpu-abcde"),))


def test_adoption_works_even_when_the_template_is_gone() -> None:
    owned = make_claim("pod1-gpu-abcde", owner_uid=POD_UID, pod_claim="gpu")
    plan = plan_pod(make_pod([template_entry()]), by_name(owned), [owned], {})
    assert plan == PodPlan(record=(RecordClaim("gpu", "pod1-gpu-abcde"),))


def test_adoption_replaces_a_status_naming_a_deleted_claim() -> None:
    pod = make_pod([template_entry()], [{"name": "gpu", "resourceClaimName": "pod1-gpu-gone1"}])
    owned = make_claim("pod1-gpu-abcde", owner_uid=POD_UID, pod_claim="gpu")
    assert plan_pod(pod, by_name(owned), [owned], TEMPLATES).record == (RecordClaim("gpu", "pod1-gpu-abcde"),)


def test_adoption_prefers_the_oldest_claim() -> None:
    newer = make_claim("pod1-gpu-aaaaa", owner_uid=POD_UID, pod_claim="gpu", created="2025-01-01T00:00:05Z")
    older = make_claim("pod1-gpu-zzzzz", owner_uid=POD_UID, pod_claim="gpu", created="2025-01-01T00:00:01Z")
    plan = plan_pod(make_pod([template_entry()]), by_name(newer, older), [newer, older], TEMPLATES)
    assert plan.record == (RecordClaim("gpu", "pod1-gpu-zzzzz"),)


def test_claim_reserved_for_the_pod_wins_over_the_one_the_status_names() -> None:
    """Beside kube-controller-manager the status can name one claim while the scheduler used another."""
    pod = make_pod([template_entry()], [{"name": "gpu", "resourceClaimName": "pod1-gpu-named"}], node="n1")
    named = make_claim("pod1-gpu-named", owner_uid=POD_UID, pod_claim="gpu")
    in_use = make_claim("pod1-gpu-inuse", owner_uid=POD_UID, pod_claim="gpu", allocated=True, reserved_uid=POD_UID)
    plan = plan_pod(pod, by_name(named, in_use), [named, in_use], TEMPLATES)
    assert plan == PodPlan(record=(RecordClaim("gpu", "pod1-gpu-inuse"),))
    recorded = make_pod([template_entry()], [{"name": "gpu", "resourceClaimName": "pod1-gpu-inuse"}], node="n1")
    assert duplicate_claims(recorded, [named, in_use]) == ["pod1-gpu-named"]


def test_claim_reserved_for_another_pod_does_not_win() -> None:
    pod = make_pod([template_entry()], [{"name": "gpu", "resourceClaimName": "pod1-gpu-named"}], node="n1")
    named = make_claim("pod1-gpu-named", owner_uid=POD_UID, pod_claim="gpu")
    other = make_claim("pod1-gpu-other", owner_uid=POD_UID, pod_claim="gpu", allocated=True, reserved=1)
    assert plan_pod(pod, by_name(named, other), [named, other], TEMPLATES).idle


def test_adoption_breaks_timestamp_ties_by_name() -> None:
    second = make_claim("pod1-gpu-bbbbb", owner_uid=POD_UID, pod_claim="gpu")
    first = make_claim("pod1-gpu-aaaaa", owner_uid=POD_UID, pod_claim="gpu")
    plan = plan_pod(make_pod([template_entry()]), by_name(second, first), [second, first], TEMPLATES)
    assert plan.record == (RecordClaim("gpu", "pod1-gpu-aaaaa"),)


def test_adoption_puts_claims_without_timestamp_last() -> None:
    untimed = make_claim("pod1-gpu-aaaaa", owner_uid=POD_UID, pod_claim="gpu", created=None)
    timed = make_claim("pod1-gpu-zzzzz", owner_uid=POD_UID, pod_claim="gpu")
    plan = plan_pod(make_pod([template_entry()]), by_name(untimed, timed), [untimed, timed], TEMPLATES)
    assert plan.record == (RecordClaim("gpu", "pod1-gpu-zzzzz"),)


def test_adoption_skips_claims_being_deleted() -> None:
    dying = make_claim("pod1-gpu-abcde", owner_uid=POD_UID, pod_claim="gpu", deleting=True)
    plan = plan_pod(make_pod([template_entry()]), by_name(dying), [dying], TEMPLATES)
    assert plan == PodPlan(create=(CreateClaim("gpu", "gpu-tmpl"),))


def test_adoption_skips_claims_for_another_pod_claim() -> None:
    other = make_claim("pod1-nic-abcde", owner_uid=POD_UID, pod_claim="nic")
    plan = plan_pod(make_pod([template_entry()]), by_name(other), [other], TEMPLATES)
    assert plan == PodPlan(create=(CreateClaim("gpu", "gpu-tmpl"),))


def test_adoption_skips_claims_controlled_by_another_pod() -> None:
    foreign = make_claim("pod1-gpu-abcde", owner_uid="other-uid", pod_claim="gpu")
    plan = plan_pod(make_pod([template_entry()]), by_name(foreign), [foreign], TEMPLATES)
    assert plan == PodPlan(create=(CreateClaim("gpu", "gpu-tmpl"),))


def test_missing_template_is_a_problem_with_upstreams_message() -> None:
    plan = plan_pod(make_pod([template_entry(template="absent")]), {}, [], TEMPLATES)
    assert plan == PodPlan(problems=(ClaimProblem(
        "gpu", 'resource claim template "absent": resourceclaimtemplate.resource.k8s.io "absent" not found'),))


def test_every_entry_is_handled_even_after_a_problem() -> None:
    pod = make_pod([template_entry("first", "absent"), template_entry("gpu"), template_entry("nic", "nic-tmpl")])
    owned = make_claim("pod1-nic-abcde", owner_uid=POD_UID, pod_claim="nic")
    plan = plan_pod(pod, by_name(owned), [owned], TEMPLATES)
    assert [p.pod_claim_name for p in plan.problems] == ["first"]
    assert plan.create == (CreateClaim("gpu", "gpu-tmpl"),)
    assert plan.record == (RecordClaim("nic", "pod1-nic-abcde"),)


def test_two_template_entries_create_two_claims_in_order() -> None:
    pod = make_pod([template_entry("a"), template_entry("b")])
    assert plan_pod(pod, {}, [], TEMPLATES).create == (CreateClaim("a", "gpu-tmpl"), CreateClaim("b", "gpu-tmpl"))


def test_pod_without_status_is_tolerated() -> None:
    pod = make_pod([template_entry()])
    assert "status" not in pod
    assert plan_pod(pod, {}, [], TEMPLATES).create == (CreateClaim("gpu", "gpu-tmpl"),)


# --- plan_pod: reservation of pre-bound pods ----------------------------------------------------

def test_unscheduled_pod_never_reserves() -> None:
    claim = make_claim("big-claim", allocated=True)
    assert plan_pod(make_pod([user_entry()]), by_name(claim), [], {}).idle


def test_scheduled_pod_reserves_allocated_user_claim() -> None:
    claim = make_claim("big-claim", allocated=True)
    assert plan_pod(make_pod([user_entry()], node="n1"), by_name(claim), [], {}) == PodPlan(
        reserve=(ReserveClaim("big-claim"),))


def test_scheduled_pod_reserves_its_allocated_generated_claim() -> None:
    pod = make_pod([template_entry()], [{"name": "gpu", "resourceClaimName": "pod1-gpu-abcde"}], node="n1")
    claim = make_claim("pod1-gpu-abcde", owner_uid=POD_UID, pod_claim="gpu", allocated=True)
    assert plan_pod(pod, by_name(claim), [claim], TEMPLATES) == PodPlan(reserve=(ReserveClaim("pod1-gpu-abcde"),))


def test_adopted_allocated_claim_is_recorded_and_reserved() -> None:
    owned = make_claim("pod1-gpu-abcde", owner_uid=POD_UID, pod_claim="gpu", allocated=True)
    plan = plan_pod(make_pod([template_entry()], node="n1"), {}, [owned], TEMPLATES)
    assert plan == PodPlan(record=(RecordClaim("gpu", "pod1-gpu-abcde"),), reserve=(ReserveClaim("pod1-gpu-abcde"),))


def test_claim_to_be_created_is_not_reserved() -> None:
    plan = plan_pod(make_pod([template_entry()], node="n1"), {}, [], TEMPLATES)
    assert plan == PodPlan(create=(CreateClaim("gpu", "gpu-tmpl"),))


def test_unallocated_claim_of_prebound_pod_is_left_alone() -> None:
    claim = make_claim("big-claim")
    assert plan_pod(make_pod([user_entry()], node="n1"), by_name(claim), [], {}).idle


def test_claim_already_reserved_for_the_pod_is_not_reserved_again() -> None:
    claim = make_claim("big-claim", allocated=True, reserved_uid=POD_UID)
    assert plan_pod(make_pod([user_entry()], node="n1"), by_name(claim), [], {}).idle


def test_claim_reserved_for_a_same_name_pod_with_other_uid_is_reserved() -> None:
    claim = make_claim("big-claim", allocated=True, reserved_uid="old-uid")
    plan = plan_pod(make_pod([user_entry()], node="n1"), by_name(claim), [], {})
    assert plan.reserve == (ReserveClaim("big-claim"),)


def test_claim_being_deleted_is_not_reserved() -> None:
    claim = make_claim("big-claim", allocated=True, deleting=True)
    assert plan_pod(make_pod([user_entry()], node="n1"), by_name(claim), [], {}).idle


def test_missing_user_claim_is_skipped_and_later_claims_still_reserved() -> None:
    pod = make_pod([user_entry("missing", "nowhere"), user_entry("shared", "big-claim")], node="n1")
    claim = make_claim("big-claim", allocated=True)
    assert plan_pod(pod, by_name(claim), [], {}).reserve == (ReserveClaim("big-claim"),)


def test_generated_claim_not_controlled_by_pod_is_replaced_not_reserved() -> None:
    pod = make_pod([template_entry()], [{"name": "gpu", "resourceClaimName": "pod1-gpu-abcde"}], node="n1")
    foreign = make_claim("pod1-gpu-abcde", owner_uid="other-uid", pod_claim="gpu", allocated=True)
    assert plan_pod(pod, by_name(foreign), [], TEMPLATES) == PodPlan(create=(CreateClaim("gpu", "gpu-tmpl"),))


def test_not_needed_entry_is_not_reserved() -> None:
    pod = make_pod([template_entry()], [{"name": "gpu"}], node="n1")
    claim = make_claim("pod1-gpu-abcde", owner_uid=POD_UID, pod_claim="gpu", allocated=True)
    assert plan_pod(pod, by_name(claim), [claim], TEMPLATES).idle


def test_claim_with_255_reservations_is_reserved() -> None:
    claim = make_claim("big-claim", allocated=True, reserved=RESERVED_FOR_MAX - 1)
    plan = plan_pod(make_pod([user_entry()], node="n1"), by_name(claim), [], {})
    assert plan.reserve == (ReserveClaim("big-claim"),)


def test_claim_with_256_reservations_is_not_reserved() -> None:
    claim = make_claim("big-claim", allocated=True, reserved=RESERVED_FOR_MAX)
    assert plan_pod(make_pod([user_entry()], node="n1"), by_name(claim), [], {}).idle


def test_same_claim_named_twice_is_reserved_once() -> None:
    pod = make_pod([user_entry("a", "big-claim"), user_entry("b", "big-claim")], node="n1")
    claim = make_claim("big-claim", allocated=True)
    assert plan_pod(pod, by_name(claim), [], {}).reserve == (ReserveClaim("big-claim"),)


# --- duplicate_claims ---------------------------------------------------------------------------

def test_unrecorded_idle_sibling_is_a_duplicate() -> None:
    pod = make_pod([template_entry()], [{"name": "gpu", "resourceClaimName": "pod1-gpu-keep1"}])
    kept = make_claim("pod1-gpu-keep1", owner_uid=POD_UID, pod_claim="gpu")
    loser = make_claim("pod1-gpu-lose1", owner_uid=POD_UID, pod_claim="gpu")
    assert duplicate_claims(pod, [kept, loser]) == ["pod1-gpu-lose1"]


def test_duplicates_are_sorted_by_name() -> None:
    pod = make_pod([template_entry()], [{"name": "gpu", "resourceClaimName": "pod1-gpu-keep1"}])
    losers = [make_claim(f"pod1-gpu-lose{i}", owner_uid=POD_UID, pod_claim="gpu") for i in (3, 1, 2)]
    assert duplicate_claims(pod, losers) == ["pod1-gpu-lose1", "pod1-gpu-lose2", "pod1-gpu-lose3"]


def test_no_duplicates_while_status_names_nothing() -> None:
    owned = make_claim("pod1-gpu-abcde", owner_uid=POD_UID, pod_claim="gpu")
    assert duplicate_claims(make_pod([template_entry()]), [owned]) == []
    assert duplicate_claims(make_pod([template_entry()], [{"name": "gpu"}]), [owned]) == []


def test_recorded_claim_is_not_a_duplicate() -> None:
    pod = make_pod([template_entry()], [{"name": "gpu", "resourceClaimName": "pod1-gpu-keep1"}])
    assert duplicate_claims(pod, [make_claim("pod1-gpu-keep1", owner_uid=POD_UID, pod_claim="gpu")]) == []


def test_allocated_reserved_or_deleting_siblings_are_not_duplicates() -> None:
    pod = make_pod([template_entry()], [{"name": "gpu", "resourceClaimName": "pod1-gpu-keep1"}])
    siblings = [
        make_claim("pod1-gpu-alloc", owner_uid=POD_UID, pod_claim="gpu", allocated=True),
        make_claim("pod1-gpu-resvd", owner_uid=POD_UID, pod_claim="gpu", reserved_uid=POD_UID),
        make_claim("pod1-gpu-dying", owner_uid=POD_UID, pod_claim="gpu", deleting=True),
    ]
    assert duplicate_claims(pod, siblings) == []


def test_claims_without_annotation_or_other_owner_are_not_duplicates() -> None:
    pod = make_pod([template_entry()], [{"name": "gpu", "resourceClaimName": "pod1-gpu-keep1"}])
    others = [
        make_claim("pod1-gpu-noann", owner_uid=POD_UID),
        make_claim("pod1-gpu-other", owner_uid="other-uid", pod_claim="gpu"),
        make_claim("pod1-nic-abcde", owner_uid=POD_UID, pod_claim="nic"),
    ]
    assert duplicate_claims(pod, others) == []


# --- the pod's status entries -------------------------------------------------------------------

def test_status_entries_carry_every_template_claim_not_only_this_syncs() -> None:
    # Server-side apply removes what the manager applied before and leaves out: a pod whose second
    # template appears late must keep its first entry when the second is recorded.
    pod = make_pod([template_entry("a", "ta"), template_entry("b", "tb")],
                   [{"name": "a", "resourceClaimName": "pod1-a-xxxxx"}])
    entries = status_entries(pod, {"b": "pod1-b-yyyyy"}, {})
    assert entries == [{"name": "a", "resourceClaimName": "pod1-a-xxxxx"},
                       {"name": "b", "resourceClaimName": "pod1-b-yyyyy"}]


def test_status_entries_keep_what_was_applied_before_the_cache_shows_it() -> None:
    pod = make_pod([template_entry("a", "ta"), template_entry("b", "tb")], [])
    entries = status_entries(pod, {"b": "pod1-b-yyyyy"}, {"a": "pod1-a-xxxxx"})
    assert [e["name"] for e in entries] == ["a", "b"]


def test_status_entries_prefer_this_syncs_claim_over_older_ones() -> None:
    pod = make_pod([template_entry("a", "ta")], [{"name": "a", "resourceClaimName": "old"}])
    assert status_entries(pod, {"a": "new"}, {"a": "older"}) == [{"name": "a", "resourceClaimName": "new"}]


def test_status_entries_leave_out_claims_by_name_and_unknown_ones() -> None:
    pod = make_pod([user_entry("shared", "big-claim"), template_entry("a", "ta"), template_entry("b", "tb")],
                   [{"name": "b"}])
    assert status_entries(pod, {}, {}) == []


# --- when the pod's claim statuses are applied again ----------------------------------------------

def test_status_apply_is_due_when_the_entries_differ_from_the_last_apply() -> None:
    assert plan.status_apply_due({"gpu": "c-1"}, {}, "", "", 0.0)
    assert plan.status_apply_due({"gpu": "c-2"}, {"gpu": "c-1"}, "100", "50", 0.0)


def test_the_same_apply_waits_while_the_cache_lags_behind_it() -> None:
    # The apply returned version 120; the cache still shows 110 (the watch lags, e.g. under load).
    assert not plan.status_apply_due({"gpu": "c-1"}, {"gpu": "c-1"}, "120", "110", 60.0)
    # Past the lagging limit it is applied again anyway.
    assert plan.status_apply_due({"gpu": "c-1"}, {"gpu": "c-1"}, "120", "110", 301.0)


def test_the_same_apply_again_once_the_cache_has_seen_it_and_still_lacks_the_entries() -> None:
    assert plan.status_apply_due({"gpu": "c-1"}, {"gpu": "c-1"}, "120", "120", 0.5)
    assert plan.status_apply_due({"gpu": "c-1"}, {"gpu": "c-1"}, "120", "135", 0.5)


def test_versions_that_are_not_numbers_fall_back_to_a_fixed_freshness() -> None:
    assert not plan.status_apply_due({"gpu": "c-1"}, {"gpu": "c-1"}, "abc", "abd", 5.0, fresh=10.0)
    assert plan.status_apply_due({"gpu": "c-1"}, {"gpu": "c-1"}, "abc", "abd", 11.0, fresh=10.0)


def test_a_claim_created_again_is_one_the_status_already_names() -> None:
    pod = {"metadata": {"name": "p", "namespace": "ns", "uid": "pod-uid"},
           "spec": {"resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "t"},
                                       {"name": "nic", "resourceClaimTemplateName": "t2"}]},
           "status": {"resourceClaimStatuses": [{"name": "gpu", "resourceClaimName": "p-gpu-gone"}]}}
    assert plan.recreates(pod, plan.PodPlan(create=(plan.CreateClaim("gpu", "t"),)))
    assert not plan.recreates(pod, plan.PodPlan(create=(plan.CreateClaim("nic", "t2"),)))
    assert not plan.recreates(pod, plan.PodPlan())
