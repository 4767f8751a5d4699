"""The shape the pod and PodGroup plans share (claims/generation.py)."""

from __future__ import annotations

from claimwarden.claims import generation, plan, podgroups
from claimwarden.claims.generation import ClaimPlan, CreateClaim, RecordClaim

TEMPLATE = {"metadata": {"name": "gpu"}, "spec": {"metadata": {"labels": {"team": "a"}},
                                                  "spec": {"devices": {"requests": [{"name": "gpu"}]}}}}


def owner(kind: str) -> dict[str, object]:
    return {"kind": kind, "metadata": {"name": "team", "namespace": "ns", "uid": f"{kind}-uid"},
            "spec": {"resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "gpu"},
                                        {"name": "shared", "resourceClaimName": "by-hand"}]},
            "status": {"resourceClaimStatuses": [{"name": "gpu", "resourceClaimName": "team-gpu-old"}]}}


def test_a_pod_and_a_podgroup_generate_the_same_claim_but_for_the_owner() -> None:
    pod, group = owner("Pod"), owner("PodGroup")
    for_pod = plan.build_claim(pod, "gpu", TEMPLATE)
    for_group = podgroups.build_podgroup_claim(group, "gpu", TEMPLATE, "scheduling.k8s.io/v1beta1")
    assert for_pod["metadata"].pop("ownerReferences")[0]["kind"] == "Pod"
    assert for_group["metadata"].pop("ownerReferences")[0]["kind"] == "PodGroup"
    assert for_pod == for_group


def test_the_status_entries_are_the_same_for_both_owners() -> None:
    for kind in ("Pod", "PodGroup"):
        assert generation.status_entries(owner(kind), {}, {}) == [{"name": "gpu", "resourceClaimName": "team-gpu-old"}]
    assert generation.status_entries(owner("Pod"), {"gpu": "new"}, {}) == \
        generation.status_entries(owner("PodGroup"), {"gpu": "new"}, {})


def test_the_podgroup_plan_is_the_shared_plan_and_its_entry_name_is_the_pod_claim_name() -> None:
    group_plan = podgroups.plan_podgroup(owner("PodGroup"), {}, [], {"gpu": TEMPLATE})
    assert type(group_plan) is ClaimPlan
    assert group_plan.create == (CreateClaim("gpu", "gpu"),) and group_plan.create[0].pod_claim_name == "gpu"
    assert CreateClaim("gpu", "tmpl") != RecordClaim("gpu", "tmpl")


def test_a_pod_plan_with_only_reservations_is_not_idle() -> None:
    assert plan.PodPlan().idle and ClaimPlan().idle
    assert not plan.PodPlan(reserve=(plan.ReserveClaim("c"),)).idle
    assert not plan.PodPlan(record=(RecordClaim("gpu", "c"),)).idle
