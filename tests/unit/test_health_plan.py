"""The health plan for one record: who is evicted and when, holders, and the quarantine bodies."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from claimwarden.health.plan import (
    Eviction,
    RecordPlan,
    device_label,
    device_taint_rule_body,
    plan_record,
    quarantine_allocation,
    quarantine_claim_body,
    scheduler_retries_on_claim_deletion,
    slice_node,
    taint_for,
)
from claimwarden.health.records import RECORD_LABEL, TAINT_KEY, DeviceRef, label_value, record_name
from claimwarden.objects.claims import POD_CLAIM_NAME_ANNOTATION

from .claim_fixtures import pod_owner_reference

MARKED = datetime(2025, 6, 1, 12, 0, 0, tzinfo=UTC)
DRIVER = "gpu.example.com"
POOL = "node-1"
REF = DeviceRef(DRIVER, POOL, "gpu-0")
RECORD_NAME = "node-1.gpu-0.0123abcd"
OWN_NAMESPACE = "claimwarden"

Pods = dict[tuple[str, str], dict[str, Any]]


def plan_for(record: dict[str, Any], claims: list[dict[str, Any]], pods: Pods) -> RecordPlan:
    return plan_record(record, claims, pods, MARKED, OWN_NAMESPACE)


def make_record(effect: str | None = "NoExecute", device: str = "gpu-0") -> dict[str, Any]:
    record_spec: dict[str, Any] = {"driver": DRIVER, "pool": POOL, "device": device, "reason": "ECC errors"}
    if effect is not None:
        record_spec["effect"] = effect
    return {"apiVersion": "claimwarden.io/v1alpha1", "kind": "UnhealthyDevice",
            "metadata": {"name": RECORD_NAME, "uid": "record-uid"}, "spec": record_spec}


def make_claim(name: str = "claim", namespace: str = "ns", *, device: str = "gpu-0",
               reserved: list[tuple[str, str]] | None = None, tolerations: list[dict[str, Any]] | None = None,
               owner_uid: str | None = None, labels: dict[str, str] | None = None,
               allocated: bool = True) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": namespace, "uid": f"{name}-uid", "labels": labels or {}}
    if owner_uid:
        meta["ownerReferences"] = [pod_owner_reference(owner_uid)]
        meta["annotations"] = {POD_CLAIM_NAME_ANNOTATION: "gpu"}
    status: dict[str, Any] = {}
    if allocated:
        result: dict[str, Any] = {"request": "gpu", "driver": DRIVER, "pool": POOL, "device": device}
        if tolerations is not None:
            result["tolerations"] = tolerations
        status["allocation"] = {"devices": {"results": [result]}}
    if reserved:
        status["reservedFor"] = [{"resource": "pods", "name": pod, "uid": uid} for pod, uid in reserved]
    return {"metadata": meta, "status": status}


def make_pod(name: str = "pod", namespace: str = "ns", uid: str = "pod-uid", *, node: str | None = "node-1",
             claims: dict[str, str] | None = None, templates: dict[str, str | None] | None = None,
             deleting: bool = False, phase: str = "Running") -> dict[str, Any]:
    """`claims` maps pod claim name → claim name; `templates` maps pod claim name → generated name (or None)."""
    meta: dict[str, Any] = {"name": name, "namespace": namespace, "uid": uid}
    if deleting:
        meta["deletionTimestamp"] = "2025-06-01T12:00:00Z"
    entries = [{"name": key, "resourceClaimName": value} for key, value in (claims or {"gpu": "claim"}).items()]
    statuses = []
    for key, generated in (templates or {}).items():
        entries.append({"name": key, "resourceClaimTemplateName": "tmpl"})
        statuses.append({"name": key, "resourceClaimName": generated})
    return {"metadata": meta, "spec": {"nodeName": node, "resourceClaims": entries},
            "status": {"phase": phase, "resourceClaimStatuses": statuses}}


def pods_of(*pods: dict[str, Any]) -> Pods:
    return {(pod["metadata"]["namespace"], pod["metadata"]["name"]): pod for pod in pods}


def tol(seconds: int | None = None, effect: str = "NoExecute") -> dict[str, Any]:
    toleration: dict[str, Any] = {"key": TAINT_KEY, "operator": "Exists", "effect": effect}
    if seconds is not None:
        toleration["tolerationSeconds"] = seconds
    return toleration


def eviction(pod: str = "pod", uid: str = "pod-uid", claim: str = "claim", namespace: str = "ns",
             due: datetime = MARKED) -> Eviction:
    return Eviction(namespace, pod, uid, claim, due)


# --- taint_for ----------------------------------------------------------------------------------

@pytest.mark.parametrize("effect", ["NoExecute", "NoSchedule", "None"])
def test_taint_for_uses_record_effect(effect: str) -> None:
    taint = taint_for(make_record(effect))
    assert taint["key"] == TAINT_KEY and taint["effect"] == effect
    assert set(taint) == {"key", "value", "effect"}


def test_taint_for_defaults_to_no_execute() -> None:
    assert taint_for(make_record(None))["effect"] == "NoExecute"


def test_taint_value_is_the_rules_value() -> None:
    record = make_record()
    assert taint_for(record)["value"] == device_taint_rule_body(record, "resource.k8s.io/v1alpha3")["spec"][
        "taint"]["value"]


# --- plan_record: who is evicted ----------------------------------------------------------------

def test_evicts_reserved_scheduled_pod() -> None:
    plan = plan_for(make_record(), [make_claim(reserved=[("pod", "pod-uid")])], pods_of(make_pod()))
    assert plan == RecordPlan(evict=(eviction(),), pending=1, would_evict=1, would_evict_names=("ns/pod",),
                              tolerated=0, holders=("ns/claim",), exclusive_holders=("ns/claim",),
                              quarantine_needed=True)


def test_default_effect_evicts() -> None:
    plan = plan_for(make_record(None), [make_claim(reserved=[("pod", "pod-uid")])], pods_of(make_pod()))
    assert plan.evict == (eviction(),)


def test_unreserved_holder_evicts_nobody() -> None:
    plan = plan_for(make_record(), [make_claim()], pods_of(make_pod()))
    assert plan == RecordPlan(holders=("ns/claim",), exclusive_holders=("ns/claim",), quarantine_needed=True)


def test_unscheduled_pod_is_skipped() -> None:
    plan = plan_for(make_record(), [make_claim(reserved=[("pod", "pod-uid")])], pods_of(make_pod(node=None)))
    assert plan.evict == () and plan.would_evict == 0


def test_deleting_pod_is_skipped() -> None:
    plan = plan_for(make_record(), [make_claim(reserved=[("pod", "pod-uid")])], pods_of(make_pod(deleting=True)))
    assert plan.evict == () and plan.would_evict == 0 and plan.tolerated == 0


@pytest.mark.parametrize("phase", ["Succeeded", "Failed"])
def test_finished_pod_is_skipped(phase: str) -> None:
    plan = plan_for(make_record(), [make_claim(reserved=[("pod", "pod-uid")])], pods_of(make_pod(phase=phase)))
    assert plan.evict == ()


def test_pod_with_other_uid_is_skipped() -> None:
    plan = plan_for(make_record(), [make_claim(reserved=[("pod", "old-uid")])], pods_of(make_pod()))
    assert plan.evict == () and plan.would_evict == 0


def test_missing_pod_is_skipped() -> None:
    plan = plan_for(make_record(), [make_claim(reserved=[("gone", "gone-uid")])], pods_of(make_pod()))
    assert plan.evict == () and plan.holders == ("ns/claim",)


def test_pod_in_other_namespace_is_not_matched() -> None:
    plan = plan_for(make_record(), [make_claim(reserved=[("pod", "pod-uid")])],
                       pods_of(make_pod(namespace="other")))
    assert plan.evict == ()


def test_pod_not_using_the_claim_is_skipped() -> None:
    pod = make_pod(claims={"gpu": "another-claim"})
    plan = plan_for(make_record(), [make_claim(reserved=[("pod", "pod-uid")])], pods_of(pod))
    assert plan.evict == ()


def test_non_pod_reservation_is_skipped() -> None:
    claim = make_claim()
    claim["status"]["reservedFor"] = [{"apiGroup": "scheduling.k8s.io", "resource": "podgroups", "name": "pod",
                                       "uid": "pod-uid"}]
    plan = plan_for(make_record(), [claim], pods_of(make_pod()))
    assert plan.evict == ()


def test_generated_claim_resolved_through_pod_status() -> None:
    pod = make_pod(claims={}, templates={"gpu": "pod-gpu-abcde"})
    claim = make_claim("pod-gpu-abcde", reserved=[("pod", "pod-uid")], owner_uid="pod-uid")
    plan = plan_for(make_record(), [claim], pods_of(pod))
    assert plan.evict == (eviction(claim="pod-gpu-abcde"),)


def test_generated_claim_not_controlled_by_pod_is_skipped() -> None:
    pod = make_pod(claims={}, templates={"gpu": "pod-gpu-abcde"})
    claim = make_claim("pod-gpu-abcde", reserved=[("pod", "pod-uid")], owner_uid="someone-else")
    assert plan_for(make_record(), [claim], pods_of(pod)).evict == ()


def test_generated_claim_not_yet_recorded_is_skipped() -> None:
    pod = make_pod(claims={}, templates={"gpu": None})
    claim = make_claim("pod-gpu-abcde", reserved=[("pod", "pod-uid")], owner_uid="pod-uid")
    assert plan_for(make_record(), [claim], pods_of(pod)).evict == ()


def test_quarantine_claims_are_never_holders_nor_evicted() -> None:
    quarantine = make_claim("q-xyz", namespace="claimwarden", labels={RECORD_LABEL: RECORD_NAME},
                            reserved=[("pod", "pod-uid")])
    pod = make_pod(namespace="claimwarden", claims={"gpu": "q-xyz"})
    plan = plan_for(make_record(), [quarantine], pods_of(pod))
    assert plan == RecordPlan(quarantine_needed=True)


def test_a_user_claim_labelled_as_quarantine_is_still_a_holder_and_its_pod_is_evicted() -> None:
    forged = make_claim("mine", labels={RECORD_LABEL: RECORD_NAME}, reserved=[("pod", "pod-uid")])
    pod = make_pod(claims={"gpu": "mine"})
    plan = plan_for(make_record(), [forged], pods_of(pod))
    assert plan.holders == ("ns/mine",)
    assert [(e.pod, e.uid) for e in plan.evict] == [("pod", "pod-uid")]


def test_two_pods_sharing_a_claim_are_both_evicted_sorted() -> None:
    claim = make_claim(reserved=[("zeta", "z-uid"), ("alpha", "a-uid")])
    pods = pods_of(make_pod("zeta", uid="z-uid"), make_pod("alpha", uid="a-uid"))
    plan = plan_for(make_record(), [claim], pods)
    assert plan.evict == (eviction("alpha", "a-uid"), eviction("zeta", "z-uid"))
    assert plan.would_evict == 2 and plan.would_evict_names == ("ns/alpha", "ns/zeta")


def test_evictions_sorted_by_namespace_then_pod() -> None:
    claims = [make_claim("c1", "b-ns", reserved=[("a", "u1")]), make_claim("c2", "a-ns", reserved=[("z", "u2")])]
    pods = pods_of(make_pod("a", "b-ns", "u1", claims={"gpu": "c1"}), make_pod("z", "a-ns", "u2", claims={"gpu": "c2"}))
    plan = plan_for(make_record(), claims, pods)
    assert [(e.namespace, e.pod) for e in plan.evict] == [("a-ns", "z"), ("b-ns", "a")]
    assert plan.holders == ("a-ns/c2", "b-ns/c1")


def test_pod_on_another_device_is_untouched() -> None:
    claims = [make_claim(reserved=[("pod", "pod-uid")]),
              make_claim("other", device="gpu-1", reserved=[("other-pod", "other-uid")])]
    pods = pods_of(make_pod(), make_pod("other-pod", uid="other-uid", claims={"gpu": "other"}))
    plan = plan_for(make_record(), claims, pods)
    assert plan.evict == (eviction(),)
    assert plan.holders == ("ns/claim",)


def test_unallocated_claim_is_not_a_holder() -> None:
    plan = plan_for(make_record(), [make_claim(allocated=False, reserved=[("pod", "pod-uid")])],
                       pods_of(make_pod()))
    assert plan == RecordPlan(quarantine_needed=True)


def test_pod_with_two_claims_on_the_device_is_evicted_once_at_the_earliest() -> None:
    claims = [make_claim("slow", reserved=[("pod", "pod-uid")], tolerations=[tol(600)]),
              make_claim("fast", reserved=[("pod", "pod-uid")], tolerations=[tol(60)])]
    pod = make_pod(claims={"a": "slow", "b": "fast"})
    plan = plan_for(make_record(), claims, pods_of(pod))
    assert plan.evict == (eviction(claim="fast", due=MARKED + timedelta(seconds=60)),)
    assert plan.would_evict == 1 and plan.tolerated == 0


def test_pod_with_one_tolerating_and_one_evicting_claim_is_evicted() -> None:
    claims = [make_claim("forever", reserved=[("pod", "pod-uid")], tolerations=[tol()]),
              make_claim("plain", reserved=[("pod", "pod-uid")])]
    pod = make_pod(claims={"a": "forever", "b": "plain"})
    plan = plan_for(make_record(), claims, pods_of(pod))
    assert plan.evict == (eviction(claim="plain"),)
    assert plan.tolerated == 0


# --- plan_record: admin access (diagnostics pods) ------------------------------------------------

def admin_claim(name: str = "diag", *, reserved: list[tuple[str, str]] | None = None) -> dict[str, Any]:
    claim = make_claim(name, reserved=reserved)
    claim["status"]["allocation"]["devices"]["results"][0]["adminAccess"] = True
    return claim


def test_a_pod_on_the_device_only_through_admin_access_is_never_evicted_but_listed() -> None:
    claims = [make_claim(reserved=[("pod", "pod-uid")]), admin_claim(reserved=[("diag", "diag-uid")])]
    pods = pods_of(make_pod(), make_pod("diag", uid="diag-uid", claims={"gpu": "diag"}))
    for effect in ("NoExecute", "NoSchedule", "None"):
        plan = plan_for(make_record(effect), claims, pods)
        assert plan.would_evict_names == ("ns/pod",) and plan.admin_access == ("ns/diag",)
        assert plan.evict == ((eviction(),) if effect == "NoExecute" else ())
        assert plan.pending == (1 if effect == "NoExecute" else 0) and plan.tolerated == 0
        assert plan.holders == ("ns/claim", "ns/diag") and plan.exclusive_holders == ("ns/claim",)


def test_a_pod_with_an_admin_access_claim_and_a_plain_claim_on_the_device_is_evicted() -> None:
    claims = [make_claim(reserved=[("pod", "pod-uid")]), admin_claim(reserved=[("pod", "pod-uid")])]
    pod = make_pod(claims={"gpu": "claim", "look": "diag"})
    plan = plan_for(make_record(), claims, pods_of(pod))
    assert plan.evict == (eviction(),) and plan.admin_access == ()


def test_an_admin_access_result_for_another_device_does_not_spare_the_pod() -> None:
    claim = make_claim(reserved=[("pod", "pod-uid")])
    claim["status"]["allocation"]["devices"]["results"].append(
        {"request": "look", "driver": DRIVER, "pool": POOL, "device": "gpu-1", "adminAccess": True})
    plan = plan_for(make_record(), [claim], pods_of(make_pod()))
    assert plan.evict == (eviction(),) and plan.admin_access == ()


# --- plan_record: tolerations -------------------------------------------------------------------

def test_toleration_seconds_delay_due() -> None:
    claim = make_claim(reserved=[("pod", "pod-uid")], tolerations=[tol(300)])
    plan = plan_for(make_record(), [claim], pods_of(make_pod()))
    assert plan.evict == (eviction(due=MARKED + timedelta(seconds=300)),)


def test_tolerated_forever_is_counted_not_evicted() -> None:
    claim = make_claim(reserved=[("pod", "pod-uid")], tolerations=[tol()])
    plan = plan_for(make_record(), [claim], pods_of(make_pod()))
    assert plan == RecordPlan(tolerated=1, holders=("ns/claim",), exclusive_holders=("ns/claim",),
                              quarantine_needed=True)


def test_empty_effect_toleration_does_not_prevent_eviction() -> None:
    claim = make_claim(reserved=[("pod", "pod-uid")], tolerations=[{"operator": "Exists"}])
    plan = plan_for(make_record(), [claim], pods_of(make_pod()))
    assert plan.evict == (eviction(),)


# --- plan_record: effects -----------------------------------------------------------------------

def test_none_effect_evicts_nobody_but_counts_would_evict() -> None:
    claims = [make_claim(reserved=[("pod", "pod-uid"), ("tol", "tol-uid")])]
    forever = make_claim("forever", reserved=[("tol", "tol-uid")], tolerations=[tol()])
    pods = pods_of(make_pod(), make_pod("tol", uid="tol-uid", claims={"gpu": "forever"}))
    plan = plan_for(make_record("None"), [*claims, forever], pods)
    assert plan.evict == ()
    assert plan.would_evict == 1
    assert plan.would_evict_names == ("ns/pod",)  # the tolerating pod is not previewed
    assert plan.tolerated == 1
    assert plan.quarantine_needed is False
    assert plan.holders == ("ns/claim", "ns/forever")


def test_no_schedule_evicts_nobody_but_needs_quarantine() -> None:
    plan = plan_for(make_record("NoSchedule"), [make_claim(reserved=[("pod", "pod-uid")])], pods_of(make_pod()))
    assert plan == RecordPlan(would_evict=1, would_evict_names=("ns/pod",), holders=("ns/claim",),
                              exclusive_holders=("ns/claim",), quarantine_needed=True)


def test_record_without_device_plans_nothing() -> None:
    record = make_record()
    del record["spec"]["device"]
    plan = plan_for(record, [make_claim(reserved=[("pod", "pod-uid")])], pods_of(make_pod()))
    assert plan == RecordPlan()


def test_plan_with_no_claims() -> None:
    assert plan_for(make_record(), [], {}) == RecordPlan(quarantine_needed=True)


# --- bodies -------------------------------------------------------------------------------------

def test_quarantine_claim_body() -> None:
    body = quarantine_claim_body(REF, "claimwarden", "node-1")
    assert body["apiVersion"] == "resource.k8s.io/v1"
    assert body["kind"] == "ResourceClaim"
    meta = body["metadata"]
    assert meta["generateName"] == f"{record_name(REF)}-"
    assert meta["namespace"] == "claimwarden"
    # The device's label, whichever record asked: one quarantine claim per device.
    assert meta["labels"] == {RECORD_LABEL: label_value(record_name(REF))} == {RECORD_LABEL: device_label(REF)}
    assert "ownerReferences" not in meta  # released by claimwarden, never by the garbage collector
    assert meta["annotations"] == {"claimwarden.io/device": "gpu.example.com/node-1/gpu-0",
                                   "claimwarden.io/node": "node-1"}
    assert body["spec"] == {"devices": {"requests": [{"name": "quarantine", "exactly": {
        "deviceClassName": "claimwarden.io-quarantine", "allocationMode": "ExactCount", "count": 1}}]}}


def test_quarantine_claim_body_without_node() -> None:
    body = quarantine_claim_body(REF, "claimwarden", None)
    assert "claimwarden.io/node" not in body["metadata"]["annotations"]


def test_quarantine_claim_body_truncates_long_names() -> None:
    ref = DeviceRef(DRIVER, "p" * 60, "d" * 63)
    meta = quarantine_claim_body(ref, "claimwarden", None)["metadata"]
    assert len(meta["generateName"]) <= 51 and meta["generateName"].endswith("-")
    assert meta["labels"][RECORD_LABEL] == label_value(record_name(ref))
    assert len(meta["labels"][RECORD_LABEL]) <= 63


def test_device_label_is_the_same_for_every_record_of_the_device() -> None:
    assert device_label(REF) == device_label(DeviceRef(DRIVER, POOL, "gpu-0"))
    assert device_label(REF) != device_label(DeviceRef(DRIVER, POOL, "gpu-1"))
    assert device_label(REF) != device_label(DeviceRef("other.example.com", POOL, "gpu-0"))


def test_quarantine_allocation_with_node() -> None:
    assert quarantine_allocation(REF, "node-1") == {
        "devices": {"results": [{"request": "quarantine", "driver": DRIVER, "pool": POOL, "device": "gpu-0"}]},
        "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
            {"key": "metadata.name", "operator": "In", "values": ["node-1"]}]}]},
    }


def test_quarantine_allocation_without_node() -> None:
    assert quarantine_allocation(REF, None) == {
        "devices": {"results": [{"request": "quarantine", "driver": DRIVER, "pool": POOL, "device": "gpu-0"}]},
    }


@pytest.mark.parametrize("effect", ["NoExecute", "NoSchedule", "None"])
def test_device_taint_rule_is_always_no_schedule(effect: str) -> None:
    body = device_taint_rule_body(make_record(effect), "resource.k8s.io/v1alpha3")
    assert body == {
        "apiVersion": "resource.k8s.io/v1alpha3",
        "kind": "DeviceTaintRule",
        "metadata": {"name": f"claimwarden-{RECORD_NAME}", "labels": {RECORD_LABEL: RECORD_NAME}},
        "spec": {"deviceSelector": {"driver": DRIVER, "pool": POOL, "device": "gpu-0"},
                 "taint": {"key": TAINT_KEY, "value": "unhealthy", "effect": "NoSchedule"}},
    }


def test_device_taint_rule_name_is_truncated() -> None:
    record = make_record()
    record["metadata"]["name"] = "a" * 240 + "." + "b" * 12
    body = device_taint_rule_body(record, "resource.k8s.io/v1beta2")
    assert body["apiVersion"] == "resource.k8s.io/v1beta2"
    assert body["metadata"]["name"] == "claimwarden-" + "a" * 240
    assert len(body["metadata"]["labels"][RECORD_LABEL]) <= 63


# --- slice_node ---------------------------------------------------------------------------------

def make_slice(name: str, generation: int, devices: tuple[str, ...] = ("gpu-0",), *, node: str | None = "node-1",
               driver: str = DRIVER, pool: str = POOL) -> dict[str, Any]:
    slice_spec: dict[str, Any] = {"driver": driver, "pool": {"name": pool, "generation": generation},
                                  "devices": [{"name": device} for device in devices]}
    if node:
        slice_spec["nodeName"] = node
    return {"metadata": {"name": name}, "spec": slice_spec}


def test_slice_node_of_listing_slice() -> None:
    assert slice_node([make_slice("s", 1)], REF) == "node-1"


def test_slice_node_prefers_newest_generation() -> None:
    slices = [make_slice("new", 3, node="node-3"), make_slice("old", 2, node="node-2")]
    assert slice_node(slices, REF) == "node-3"
    assert slice_node(list(reversed(slices)), REF) == "node-3"


def test_slice_node_only_counts_slices_listing_the_device() -> None:
    slices = [make_slice("new", 3, ("gpu-1",), node="node-3"), make_slice("old", 2, node="node-2")]
    assert slice_node(slices, REF) == "node-2"


def test_slice_node_ignores_other_drivers_and_pools() -> None:
    slices = [make_slice("a", 9, driver="other.example.com", node="x"), make_slice("b", 9, pool="node-2", node="y")]
    assert slice_node(slices, REF) is None


def test_slice_node_unknown_or_without_node() -> None:
    assert slice_node([], REF) is None
    assert slice_node([make_slice("s", 1, node=None)], REF) is None


def test_slice_node_uses_per_device_node() -> None:
    slice_ = make_slice("s", 1, node=None)
    slice_["spec"]["perDeviceNodeSelection"] = True
    slice_["spec"]["devices"][0]["nodeName"] = "node-7"
    assert slice_node([slice_], REF) == "node-7"


# --- plan_record: drain modes -------------------------------------------------------------------

def with_drain(drain: str, effect: str = "NoExecute") -> dict[str, Any]:
    record = make_record(effect)
    record["spec"]["drain"] = drain
    return record


def test_allow_completion_evicts_nobody_but_counts_the_pods_as_pending_and_quarantines() -> None:
    plan = plan_for(with_drain("AllowCompletion"), [make_claim(reserved=[("pod", "pod-uid")])], pods_of(make_pod()))
    assert plan.evict == () and plan.pending == 1 and plan.quarantine_needed and plan.would_evict == 1


def test_evict_after_evicts_at_the_deadline_or_at_a_later_toleration() -> None:
    plan = plan_for(with_drain("EvictAfter=30m"), [make_claim(reserved=[("pod", "pod-uid")])], pods_of(make_pod()))
    assert plan.evict == (eviction(due=MARKED + timedelta(minutes=30)),)
    assert plan.drain_deadline == MARKED + timedelta(minutes=30) and plan.pending == 1
    late = make_claim(reserved=[("pod", "pod-uid")], tolerations=[tol(seconds=3600)])
    assert plan_for(with_drain("EvictAfter=30m"), [late], pods_of(make_pod())).evict[0].due == \
        MARKED + timedelta(hours=1)


def test_a_finished_pod_is_no_longer_pending() -> None:
    pod = make_pod()
    pod["status"]["phase"] = "Succeeded"
    plan = plan_for(with_drain("AllowCompletion"), [make_claim(reserved=[("pod", "pod-uid")])], pods_of(pod))
    assert plan.pending == 0


def test_drain_changes_nothing_for_other_effects() -> None:
    plan = plan_for(with_drain("EvictAfter=1m", "NoSchedule"), [make_claim(reserved=[("pod", "pod-uid")])],
                    pods_of(make_pod()))
    assert plan.evict == () and plan.pending == 0 and plan.drain_deadline is None


def test_pods_evicted_already_are_neither_evicted_again_nor_pending_before_the_cache_shows_it() -> None:
    claim = make_claim(reserved=[("a", "a-uid"), ("b", "b-uid")])
    pods = pods_of(make_pod("a", uid="a-uid"), make_pod("b", uid="b-uid"))
    decided = plan_record(make_record(), [claim], pods, MARKED, OWN_NAMESPACE, evicted=frozenset({"a-uid"}))
    assert decided.evict == (eviction("b", "b-uid"),)
    assert decided.pending == 1 and decided.would_evict_names == ("ns/b",)
    assert decided.holders == ("ns/claim",), "its claim still holds the device until it is released"
    assert plan_for(make_record(), [claim], pods).pending == 2, "without it, both are pending"


@pytest.mark.parametrize(("version", "retries"), [
    ("v1.34.4", False), ("v1.35.4", False), ("v1.36.3", False), ("v1.37.2", True), ("v1.38.0-alpha.1", True),
    ("v2.0.0", True), ("1.36.3", False), ("unknown", True), ("", True),
])
def test_the_scheduler_retries_pending_pods_on_a_claim_deletion_from_1_37(version: str, retries: bool) -> None:
    """kube-scheduler 1.37 registers claim deletions for its DRA plugin (1.34-1.36: additions and updates only):
    rule 4 of the quarantine trap then keeps generated claims on a quarantined device."""
    assert scheduler_retries_on_claim_deletion(version) is retries


def test_every_consumer_of_a_device_that_allows_multiple_allocations_is_evicted() -> None:
    # KEP-5075: several claims hold one device, each result with its shareID and consumed capacity.
    claims = [make_claim(f"share-{n}", reserved=[(f"pod-{n}", f"u{n}")]) for n in range(3)]
    for n, claim in enumerate(claims):
        result = claim["status"]["allocation"]["devices"]["results"][0]
        result.update(shareID=f"00000000-0000-0000-0000-00000000000{n}", consumedCapacity={"memory": "10Gi"})
    pods = pods_of(*(make_pod(f"pod-{n}", uid=f"u{n}", claims={"gpu": f"share-{n}"}) for n in range(3)))
    plan = plan_for(make_record(), claims, pods)
    assert [(e.pod, e.claim) for e in plan.evict] == [("pod-0", "share-0"), ("pod-1", "share-1"), ("pod-2", "share-2")]
    assert plan.holders == ("ns/share-0", "ns/share-1", "ns/share-2")
