"""Pods holding a marked device through their PodGroup's reservation: who is evicted, who is not."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from claimwarden.health.breaker import holding_pods
from claimwarden.health.groups import group_pods, holds_through_group, members_of, uses_group_claim
from claimwarden.health.plan import Eviction, plan_record
from claimwarden.health.records import TAINT_KEY
from claimwarden.objects.claims import POD_CLAIM_NAME_ANNOTATION

MARKED = datetime(2025, 6, 1, 12, 0, 0, tzinfo=UTC)
DRIVER = "gpu.example.com"
OWN_NAMESPACE = "claimwarden"
CLAIM = "team-gpu-abcde"

Pods = dict[tuple[str, str], dict[str, Any]]


def record(effect: str = "NoExecute") -> dict[str, Any]:
    return {"metadata": {"name": "node-1.gpu-0.0123abcd", "uid": "record-uid"},
            "spec": {"driver": DRIVER, "pool": "node-1", "device": "gpu-0", "reason": "ECC", "effect": effect}}


def group_claim(name: str = CLAIM, namespace: str = "ns", group: str = "team", *, generated: bool = True,
                pods: tuple[str, ...] = (), tolerations: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """A claim allocated gpu-0 and reserved for PodGroup `group` (generated: owned by it), plus pod entries."""
    meta: dict[str, Any] = {"name": name, "namespace": namespace, "uid": f"{name}-uid"}
    if generated:
        meta["ownerReferences"] = [{"apiVersion": "scheduling.k8s.io/v1beta1", "kind": "PodGroup", "name": group,
                                    "uid": f"{group}-uid", "controller": True}]
        meta["annotations"] = {POD_CLAIM_NAME_ANNOTATION: "gpu"}
    result: dict[str, Any] = {"request": "gpu", "driver": DRIVER, "pool": "node-1", "device": "gpu-0"}
    if tolerations is not None:
        result["tolerations"] = tolerations
    reserved = [{"apiGroup": "scheduling.k8s.io", "resource": "podgroups", "name": group, "uid": f"{group}-uid"}]
    reserved += [{"resource": "pods", "name": pod, "uid": f"{pod}-uid"} for pod in pods]
    return {"metadata": meta, "status": {"allocation": {"devices": {"results": [result]}}, "reservedFor": reserved}}


def member(name: str, group: str | None = "team", namespace: str = "ns", *, claim: str | None = CLAIM,
           by_name: bool = False, phase: str = "Running", node: str | None = "node-1",
           deleting: bool = False) -> dict[str, Any]:
    """A pod of `group` whose entry "gpu" uses `claim`: from the template "gpu" (recorded in its status),
    or by name."""
    meta: dict[str, Any] = {"name": name, "namespace": namespace, "uid": f"{name}-uid"}
    if deleting:
        meta["deletionTimestamp"] = "2025-06-01T11:59:00Z"
    pod_spec: dict[str, Any] = {"nodeName": node}
    if group:
        pod_spec["schedulingGroup"] = {"podGroupName": group}
    statuses = []
    if by_name:
        pod_spec["resourceClaims"] = [{"name": "gpu", "resourceClaimName": claim}]
    else:
        pod_spec["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": "gpu"}]
        statuses = [{"name": "gpu", "resourceClaimName": claim}] if claim else []
    return {"metadata": meta, "spec": pod_spec, "status": {"phase": phase, "resourceClaimStatuses": statuses}}


def pods_of(*pods: dict[str, Any]) -> Pods:
    return {(p["metadata"]["namespace"], p["metadata"]["name"]): p for p in pods}


def plan(claims: list[dict[str, Any]], pods: Pods, effect: str = "NoExecute") -> Any:
    return plan_record(record(effect), claims, pods, MARKED, OWN_NAMESPACE,
                       podgroup_members=members_of(pods.values()))


def names(evictions: tuple[Eviction, ...]) -> list[str]:
    return [f"{e.namespace}/{e.pod}" for e in evictions]


def test_a_podgroup_claim_on_a_marked_device_evicts_every_member_using_it() -> None:
    pods = pods_of(*(member(f"pod-{i}") for i in range(5)))
    decided = plan([group_claim()], pods)
    assert decided.evict == tuple(Eviction("ns", f"pod-{i}", f"pod-{i}-uid", CLAIM, MARKED) for i in range(5))
    assert decided.pending == 5 and decided.would_evict == 5 and decided.tolerated == 0
    assert decided.would_evict_names == tuple(f"ns/pod-{i}" for i in range(5))
    assert decided.holders == (f"ns/{CLAIM}",) and decided.quarantine_needed


def test_only_members_of_that_group_in_that_namespace_that_use_the_claim_are_affected() -> None:
    pods = pods_of(
        member("in-group"),
        member("other-group", group="other"),  # its status even names the claim
        member("other-namespace", namespace="elsewhere"),  # same group name, another namespace
        member("no-group", group=None),
        member("own-claim", claim="in-group-gpu-xyz12"),  # in the group, but another claim
        member("no-claim-yet", claim=None),
    )
    decided = plan([group_claim()], pods)
    assert names(decided.evict) == ["ns/in-group"]
    assert decided.pending == 1 and decided.tolerated == 0


def test_done_deleting_and_unscheduled_members_are_not_evicted() -> None:
    pods = pods_of(member("running"), member("succeeded", phase="Succeeded"), member("failed", phase="Failed"),
                   member("deleting", deleting=True), member("pending", node=None, phase="Pending"))
    decided = plan([group_claim()], pods)
    assert names(decided.evict) == ["ns/running"]
    assert decided.pending == 1 and decided.would_evict == 1


def test_a_claim_by_name_reserved_for_the_group_affects_members_that_name_it() -> None:
    pods = pods_of(member("a", claim="shared", by_name=True), member("b", claim="shared", by_name=True),
                   member("c", claim="unrelated", by_name=True))
    decided = plan([group_claim("shared", generated=False)], pods)
    assert names(decided.evict) == ["ns/a", "ns/b"]


def test_a_template_claim_not_controlled_by_the_pods_group_is_not_used_through_it() -> None:
    # The status names the claim, but it was generated for another PodGroup "rival" and reserved for "team".
    claim = group_claim()
    claim["metadata"]["ownerReferences"][0]["name"] = "rival"
    assert not uses_group_claim(member("a"), claim)
    assert plan([claim], pods_of(member("a"))).evict == ()


def test_a_member_also_reserved_by_its_own_entry_is_evicted_once() -> None:
    pods = pods_of(member("a", claim="shared", by_name=True), member("b", claim="shared", by_name=True))
    decided = plan([group_claim("shared", generated=False, pods=("a",))], pods)
    assert names(decided.evict) == ["ns/a", "ns/b"] and decided.pending == 2


def test_without_the_member_look_up_only_pod_entries_count() -> None:
    pods = pods_of(member("a"), member("b"))
    decided = plan_record(record(), [group_claim()], pods, MARKED, OWN_NAMESPACE)
    assert decided.evict == () and decided.holders == (f"ns/{CLAIM}",)


def test_a_stale_member_index_is_checked_against_the_pods() -> None:
    pods = pods_of(member("moved", group="other"), member("stays"))
    stale = {("ns", "team"): ["moved", "stays", "gone"]}
    found = group_pods(group_claim(), pods, lambda namespace, group: stale.get((namespace, group), []))
    assert [p["metadata"]["name"] for p in found] == ["stays"]


def test_tolerations_of_the_group_claim_apply_to_all_its_members() -> None:
    pods = pods_of(member("a"), member("b"))
    after = group_claim(tolerations=[{"key": TAINT_KEY, "operator": "Exists", "effect": "NoExecute",
                                      "tolerationSeconds": 60}])
    decided = plan([after], pods)
    assert [(e.pod, e.due) for e in decided.evict] == [("a", MARKED + timedelta(seconds=60)),
                                                       ("b", MARKED + timedelta(seconds=60))]
    forever = group_claim(tolerations=[{"key": TAINT_KEY, "operator": "Exists", "effect": "NoExecute"}])
    decided = plan([forever], pods)
    assert decided.evict == () and decided.pending == 0 and decided.tolerated == 2


def test_no_schedule_evicts_nobody_but_counts_the_members_it_would_evict() -> None:
    decided = plan([group_claim()], pods_of(member("a"), member("b")), effect="NoSchedule")
    assert decided.evict == () and decided.pending == 0
    assert decided.would_evict == 2 and decided.would_evict_names == ("ns/a", "ns/b")


def test_the_eviction_recheck_accepts_the_group_path_only_while_it_holds() -> None:
    claim = group_claim()
    assert holds_through_group(claim, member("a"))
    assert not holds_through_group(claim, member("a", group="other"))
    assert not holds_through_group(claim, member("a", namespace="elsewhere"))
    assert not holds_through_group(claim, member("a", phase="Succeeded"))
    released = group_claim()
    released["status"]["reservedFor"] = []
    assert not holds_through_group(released, member("a"))


def test_the_breaker_counts_members_holding_through_their_group() -> None:
    pods = pods_of(member("a"), member("b"), member("done", phase="Succeeded"), member("c", claim="x", by_name=True))
    lookup = members_of(pods.values())
    claims = [group_claim(pods=("c",))]
    results = claims[0]["status"]["allocation"]["devices"]["results"]
    results += [{**results[0], "device": f"gpu-{i}"} for i in (1, 2, 3)]  # 4 devices: up to 4 pods count

    def by_group(claim: dict[str, Any]) -> list[str]:
        return [p["metadata"]["name"] for p in group_pods(claim, pods, lookup)]

    assert holding_pods(claims, OWN_NAMESPACE, by_group) == {DRIVER: {"ns/a", "ns/b", "ns/c"}}
    assert holding_pods(claims, OWN_NAMESPACE) == {DRIVER: {"ns/c"}}
    del results[1:]  # one device: the group weighs one pod (breaker.CLAIM_PODS_PER_DEVICE)
    assert holding_pods(claims, OWN_NAMESPACE, by_group) == {DRIVER: {"ns/a"}}
