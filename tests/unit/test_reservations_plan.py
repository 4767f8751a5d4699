"""The reservations plan: dropping stale reservations, deallocation, finalizer, deletion, headroom."""

from __future__ import annotations

from typing import Any

import pytest

from claimwarden.objects.claims import DELETE_PROTECTION_FINALIZER, POD_CLAIM_NAME_ANNOTATION, RESERVED_FOR_MAX
from claimwarden.reservations.plan import ClaimPlan, plan_claim, pod_view, reserved_for_predecessor

from .claim_fixtures import pod_owner_reference

ALLOCATION = {"devices": {"results": [{"request": "gpu", "driver": "gpu.example.com", "pool": "n1",
                                       "device": "gpu-0"}]}}
PODGROUP = {"apiGroup": "scheduling.k8s.io", "resource": "podgroups", "name": "group", "uid": "group-uid"}


def pod_entry(name: str = "pod1", uid: str = "uid-1") -> dict[str, Any]:
    return {"resource": "pods", "name": name, "uid": uid}


def view(uid: str = "uid-1", phase: str | None = "Running", node: str | None = "n1",
         deleting: bool = False) -> dict[str, Any]:
    return {"uid": uid, "phase": phase, "nodeName": node, "deleting": deleting}


def make_claim(
    reserved: list[dict[str, Any]] | None = None,
    *,
    allocated: bool = True,
    finalizer: bool = True,
    deleting: bool = False,
    owner_uid: str | None = None,
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "claim", "namespace": "ns", "uid": "claim-uid"}
    if finalizer:
        meta["finalizers"] = [DELETE_PROTECTION_FINALIZER]
    if deleting:
        meta["deletionTimestamp"] = "2025-01-01T00:00:00Z"
    if owner_uid:
        meta["ownerReferences"] = [pod_owner_reference(owner_uid)]
        meta["annotations"] = {POD_CLAIM_NAME_ANNOTATION: "gpu"}
    status: dict[str, Any] = {}
    if allocated:
        status["allocation"] = ALLOCATION
    if reserved:
        status["reservedFor"] = reserved
    return {"metadata": meta, "spec": {}, "status": status}


# --- pod_view -----------------------------------------------------------------------------------

def test_pod_view_of_missing_pod_is_none() -> None:
    assert pod_view(None) is None


def test_pod_view_takes_uid_phase_node_and_deletion() -> None:
    pod = {"metadata": {"name": "p", "uid": "u", "deletionTimestamp": "2025-01-01T00:00:00Z"},
           "spec": {"nodeName": "n1"}, "status": {"phase": "Running"}}
    assert pod_view(pod) == {"uid": "u", "phase": "Running", "nodeName": "n1", "deleting": True}


def test_pod_view_tolerates_missing_status_and_spec() -> None:
    assert pod_view({"metadata": {"uid": "u"}}) == {"uid": "u", "phase": None, "nodeName": None, "deleting": False}


# --- dropping reservations ----------------------------------------------------------------------

def test_live_reservation_is_kept() -> None:
    entry = pod_entry()
    assert plan_claim(make_claim([entry]), {"pod1": view()}, None) == ClaimPlan(keep=(entry,))


def test_gone_pod_is_dropped_and_claim_released() -> None:
    entry = pod_entry()
    plan = plan_claim(make_claim([entry]), {"pod1": None}, None)
    assert plan == ClaimPlan(drop=(entry,), deallocate=True, remove_finalizer=True)


def test_replaced_pod_is_dropped() -> None:
    entry = pod_entry(uid="old-uid")
    assert plan_claim(make_claim([entry]), {"pod1": view(uid="new-uid")}, None).drop == (entry,)


@pytest.mark.parametrize("phase", ["Succeeded", "Failed"])
def test_finished_pod_is_dropped(phase: str) -> None:
    entry = pod_entry()
    assert plan_claim(make_claim([entry]), {"pod1": view(phase=phase)}, None).drop == (entry,)


def test_pod_deleted_before_scheduling_is_dropped() -> None:
    entry = pod_entry()
    plan = plan_claim(make_claim([entry]), {"pod1": view(phase="Pending", node=None, deleting=True)}, None)
    assert plan.drop == (entry,)


def test_terminating_scheduled_pod_keeps_its_reservation() -> None:
    entry = pod_entry()
    plan = plan_claim(make_claim([entry]), {"pod1": view(deleting=True)}, None)
    assert plan == ClaimPlan(keep=(entry,))


def test_only_stale_entries_are_dropped_and_claim_stays_allocated() -> None:
    alive, gone = pod_entry("a", "uid-a"), pod_entry("b", "uid-b")
    plan = plan_claim(make_claim([alive, gone]), {"a": view(uid="uid-a"), "b": None}, None)
    assert plan == ClaimPlan(drop=(gone,), keep=(alive,))


def test_non_pod_entries_are_always_kept() -> None:
    plan = plan_claim(make_claim([PODGROUP]), {}, None)
    assert plan == ClaimPlan(keep=(PODGROUP,))


def test_non_pod_entry_holds_the_allocation_when_pods_are_dropped() -> None:
    gone = pod_entry()
    plan = plan_claim(make_claim([PODGROUP, gone]), {"pod1": None}, None)
    assert plan == ClaimPlan(drop=(gone,), keep=(PODGROUP,))


def test_core_group_written_explicitly_is_a_pod_entry() -> None:
    entry = {"apiGroup": "", "resource": "pods", "name": "pod1", "uid": "uid-1"}
    assert plan_claim(make_claim([entry]), {"pod1": None}, None).drop == (entry,)


def test_claim_without_status_is_idle() -> None:
    claim = {"metadata": {"name": "claim"}}
    assert plan_claim(claim, {}, None) == ClaimPlan()


# --- unknown pods -------------------------------------------------------------------------------

def test_unknown_pod_blocks_every_destructive_action() -> None:
    unknown, gone = pod_entry("unknown", "uid-u"), pod_entry("gone", "uid-g")
    claim = make_claim([unknown, gone], owner_uid="owner-uid")
    plan = plan_claim(claim, {"gone": None}, view(uid="owner-uid", phase="Succeeded"))
    assert plan == ClaimPlan(keep=(unknown, gone), unknown_pods=("unknown",))


def test_each_unknown_pod_is_named_once() -> None:
    entries = [pod_entry("x", "uid-1"), pod_entry("x", "uid-2"), pod_entry("y", "uid-3")]
    assert plan_claim(make_claim(entries), {}, None).unknown_pods == ("x", "y")


def test_unknown_names_of_non_pod_entries_are_not_looked_up() -> None:
    assert plan_claim(make_claim([PODGROUP]), {}, None).unknown_pods == ()


# --- deallocation and the finalizer -------------------------------------------------------------

def test_without_finalizer_the_allocation_is_kept() -> None:
    entry = pod_entry()
    plan = plan_claim(make_claim([entry], finalizer=False), {"pod1": None}, None)
    assert plan == ClaimPlan(drop=(entry,))


def test_never_reserved_claim_is_not_deallocated() -> None:
    assert plan_claim(make_claim(), {}, None) == ClaimPlan()


def test_unreserved_claim_being_deleted_is_deallocated_and_unblocked() -> None:
    plan = plan_claim(make_claim(deleting=True), {}, None)
    assert plan == ClaimPlan(deallocate=True, remove_finalizer=True)


def test_unallocated_claim_being_deleted_only_loses_its_finalizer() -> None:
    plan = plan_claim(make_claim(allocated=False, deleting=True), {}, None)
    assert plan == ClaimPlan(remove_finalizer=True)


def test_claim_being_deleted_without_finalizer_is_left_alone() -> None:
    assert plan_claim(make_claim(finalizer=False, deleting=True), {}, None) == ClaimPlan()


def test_reserved_claim_being_deleted_keeps_finalizer_while_pod_runs() -> None:
    entry = pod_entry()
    assert plan_claim(make_claim([entry], deleting=True), {"pod1": view()}, None) == ClaimPlan(keep=(entry,))


def test_reserved_claim_being_deleted_is_released_when_its_pod_goes() -> None:
    entry = pod_entry()
    plan = plan_claim(make_claim([entry], deleting=True), {"pod1": None}, None)
    assert plan == ClaimPlan(drop=(entry,), deallocate=True, remove_finalizer=True)


# --- deleting generated claims ------------------------------------------------------------------

def test_generated_claim_of_finished_owner_is_deleted() -> None:
    entry = pod_entry("owner", "owner-uid")
    claim = make_claim([entry], owner_uid="owner-uid")
    owner = view(uid="owner-uid", phase="Succeeded")
    plan = plan_claim(claim, {"owner": owner}, owner)
    assert plan == ClaimPlan(drop=(entry,), deallocate=True, remove_finalizer=True, delete_claim=True)


def test_generated_claim_of_failed_owner_without_reservations_is_deleted() -> None:
    claim = make_claim(owner_uid="owner-uid")
    assert plan_claim(claim, {}, view(uid="owner-uid", phase="Failed")).delete_claim


def test_generated_claim_of_replaced_owner_is_deleted() -> None:
    claim = make_claim(owner_uid="owner-uid")
    assert plan_claim(claim, {}, view(uid="new-uid")).delete_claim


def test_generated_claim_of_owner_deleted_before_scheduling_is_deleted() -> None:
    claim = make_claim(allocated=False, finalizer=False, owner_uid="owner-uid")
    assert plan_claim(claim, {}, view(uid="owner-uid", phase="Pending", node=None, deleting=True)).delete_claim


def test_generated_claim_of_running_owner_is_kept() -> None:
    claim = make_claim(owner_uid="owner-uid")
    assert plan_claim(claim, {}, view(uid="owner-uid")) == ClaimPlan()


def test_generated_claim_of_owner_missing_from_cache_is_left_to_the_garbage_collector() -> None:
    entry = pod_entry("owner", "owner-uid")
    plan = plan_claim(make_claim([entry], owner_uid="owner-uid"), {"owner": None}, None)
    assert plan == ClaimPlan(drop=(entry,), deallocate=True, remove_finalizer=True)


def test_generated_claim_still_reserved_is_not_deleted() -> None:
    other = pod_entry("other", "other-uid")
    claim = make_claim([other], owner_uid="owner-uid")
    plan = plan_claim(claim, {"other": view(uid="other-uid")}, view(uid="owner-uid", phase="Succeeded"))
    assert not plan.delete_claim


def test_generated_claim_held_by_a_podgroup_is_not_deleted() -> None:
    claim = make_claim([PODGROUP], owner_uid="owner-uid")
    assert not plan_claim(claim, {}, view(uid="owner-uid", phase="Succeeded")).delete_claim


def test_generated_claim_already_being_deleted_is_not_deleted_again() -> None:
    claim = make_claim(allocated=False, deleting=True, owner_uid="owner-uid")
    plan = plan_claim(claim, {}, view(uid="owner-uid", phase="Succeeded"))
    assert plan == ClaimPlan(remove_finalizer=True)


def test_user_claim_is_never_deleted() -> None:
    entry = pod_entry()
    plan = plan_claim(make_claim([entry]), {"pod1": view(phase="Succeeded")}, view(phase="Succeeded"))
    assert not plan.delete_claim


def test_claim_whose_controller_is_not_a_pod_is_never_deleted() -> None:
    claim = make_claim()
    claim["metadata"]["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs",
                                             "uid": "owner-uid", "controller": True}]
    assert not plan_claim(claim, {}, view(uid="other", phase="Succeeded")).delete_claim


def test_claim_with_a_forged_pod_owner_but_no_pod_claim_annotation_is_never_deleted() -> None:
    claim = make_claim(owner_uid="owner-uid")
    del claim["metadata"]["annotations"]
    assert not plan_claim(claim, {}, view(uid="owner-uid", phase="Succeeded")).delete_claim


# --- headroom -----------------------------------------------------------------------------------

def _many(count: int) -> tuple[list[dict[str, Any]], dict[str, dict[str, Any] | None]]:
    entries = [pod_entry(f"p{i}", f"uid-{i}") for i in range(count)]
    pods: dict[str, dict[str, Any] | None] = {f"p{i}": view(uid=f"uid-{i}") for i in range(count)}
    return entries, pods


def test_claim_at_ninety_percent_is_near_the_limit() -> None:
    entries, pods = _many(231)  # 0.9 * 256 = 230.4
    assert plan_claim(make_claim(entries), pods, None).near_limit


def test_claim_below_ninety_percent_is_not_near_the_limit() -> None:
    entries, pods = _many(230)
    assert not plan_claim(make_claim(entries), pods, None).near_limit


def test_near_limit_counts_what_remains_after_drops() -> None:
    entries, pods = _many(RESERVED_FOR_MAX)
    for i in range(100):
        pods[f"p{i}"] = None
    plan = plan_claim(make_claim(entries), pods, None)
    assert len(plan.keep) == RESERVED_FOR_MAX - 100
    assert not plan.near_limit


def test_limit_ratio_is_configurable() -> None:
    entries, pods = _many(128)
    assert plan_claim(make_claim(entries), pods, None, limit_ratio=0.5).near_limit
    assert not plan_claim(make_claim(entries), pods, None).near_limit


def test_a_claim_reserved_for_a_replaced_pod_of_the_same_name_is_looked_at_again() -> None:
    """A replacement whose predecessor's DELETED event was missed (a watch gap) is the only event left."""
    claim = {"metadata": {"namespace": "ns", "name": "c"}, "status": {"reservedFor": [
        {"resource": "pods", "name": "web-0", "uid": "old-uid"}]}}
    assert reserved_for_predecessor(claim, "web-0", "new-uid")
    assert not reserved_for_predecessor(claim, "web-0", "old-uid")
    assert not reserved_for_predecessor(claim, "web-1", "new-uid")
    assert not reserved_for_predecessor(None, "web-0", "new-uid")
