"""kubectl claimwarden drain's plan (plugin/drain.py): the order of the steps, which claims hold it up and why,
what it leaves alone or refuses, and what --force-after deletes; plain dicts, no cluster."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from claimwarden.plugin import drain

NODE = "node-a"
NOW = datetime(2026, 12, 2, 21, 0, tzinfo=UTC)
OWNER = [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs", "uid": "rs-1", "controller": True}]


def _node(unschedulable: bool = False) -> dict[str, Any]:
    return {"metadata": {"name": NODE}, "spec": {"unschedulable": True} if unschedulable else {}}


def _pod(name: str, *, claims: list[str] = (), template: str | None = None, node: str = NODE,  # type: ignore[assignment]
         owner: list[dict[str, Any]] | None = None, phase: str = "Running", deleting: str | None = None,
         labels: dict[str, str] | None = None, volumes: list[dict[str, Any]] | None = None,
         annotations: dict[str, str] | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": "ns", "uid": f"uid-{name}",
                            "ownerReferences": OWNER if owner is None else owner, "labels": labels or {},
                            "annotations": annotations or {}}
    if deleting:
        meta["deletionTimestamp"] = deleting
    resource_claims = [{"name": f"c{i}", "resourceClaimName": c} for i, c in enumerate(claims)]
    status: dict[str, Any] = {"phase": phase}
    if template:
        resource_claims.append({"name": "t", "resourceClaimTemplateName": "tpl"})
        status["resourceClaimStatuses"] = [{"name": "t", "resourceClaimName": template}]
    return {"metadata": meta, "spec": {"nodeName": node, "resourceClaims": resource_claims,
                                       "terminationGracePeriodSeconds": 10, "volumes": volumes or []},
            "status": status}


def _claim(name: str, *reserved: str, node: str | None = NODE, owner: str | None = None,
           allocated: bool = True, deleting: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": "ns", "uid": f"claim-{name}"}
    if owner:
        meta["ownerReferences"] = [{"apiVersion": "v1", "kind": "Pod", "name": owner, "uid": f"uid-{owner}",
                                    "controller": True}]
        meta["annotations"] = {"resource.kubernetes.io/pod-claim-name": "t"}
    if deleting:
        meta["deletionTimestamp"] = "2026-12-02T20:59:00Z"
        meta["finalizers"] = ["example.com/hold"]
    status: dict[str, Any] = {}
    if allocated:
        selector = ({"nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In",
                                                               "values": [node]}]}]} if node else None)
        status["allocation"] = {"devices": {"results": [{"driver": "d", "pool": NODE, "device": "gpu-0"}]},
                                **({"nodeSelector": selector} if selector else {})}
    if reserved:
        status["reservedFor"] = [{"resource": "pods", "name": p, "uid": f"uid-{p}"} for p in reserved]
    return {"metadata": meta, "status": status}


def test_dra_consumers_come_first_then_their_claims_then_the_rest() -> None:
    pods = [_pod("trainer", claims=["shared"]), _pod("helper", claims=["shared"]),
            _pod("solo", template="solo-t-x"), _pod("web"), _pod("driver")]
    claims = [_claim("shared", "trainer", "helper"), _claim("solo-t-x", "solo", owner="solo")]
    plan = drain.plan(_node(), pods, claims)
    assert plan.cordon and plan.step == 2
    assert [p.ref for p in plan.evict_now()] == ["ns/helper", "ns/solo", "ns/trainer"]
    assert [p.ref for p in plan.rest] == ["ns/driver", "ns/web"]
    assert {h.ref for h in plan.claims} == {"ns/shared", "ns/solo-t-x"}
    assert next(p for p in plan.consumers if p.name == "solo").claims == ("ns/solo-t-x",)


def test_the_rest_waits_while_a_claim_is_still_reserved_for_a_gone_pod() -> None:
    claims = [_claim("shared", "trainer")]  # trainer is gone; its reservation not removed yet
    plan = drain.plan(_node(unschedulable=True), [_pod("web")], claims, seen_pods=frozenset({"uid-trainer"}))
    assert not plan.cordon and plan.step == 3 and plan.evict_now() == ()
    [held] = plan.claims
    assert held.ref == "ns/shared"
    assert "reserved for pod(s) ns/trainer (gone, its reservation not removed yet)" in held.reason
    stuck = drain.stuck(plan, {}, NOW)
    assert [s.object for s in stuck] == ["resourceclaim/ns/shared"]


def test_a_node_local_claim_is_waited_for_even_after_a_restart_forgot_its_pods() -> None:
    plan = drain.plan(_node(True), [_pod("web")], [_claim("shared", "trainer")])
    assert plan.step == 3


def test_generated_claims_must_be_gone_and_standalone_ones_deallocated() -> None:
    generated = _claim("solo-t-x", owner="solo", deleting=True)
    unreserved = _claim("shared")
    seen = frozenset({"claim-shared"})
    plan = drain.plan(_node(True), [_pod("web")], [generated, unreserved], seen_pods=frozenset({"uid-solo"}),
                      seen_claims=seen)
    reasons = {h.ref: h.reason for h in plan.claims}
    assert reasons["ns/solo-t-x"] == ("generated for a pod of this node, not deleted yet; being deleted, held by "
                                      "finalizer(s) example.com/hold")
    assert reasons["ns/shared"] == "reserved for nobody, still allocated (not deallocated yet)"
    finishing = _claim("shared", allocated=False)
    finishing["metadata"]["finalizers"] = ["resource.kubernetes.io/delete-protection"]
    [held] = drain.plan(_node(True), [_pod("web")], [finishing], seen_claims=seen).claims
    assert held.reason == "deallocated, its finalizer resource.kubernetes.io/delete-protection not removed yet"
    released = drain.plan(_node(True), [_pod("web")], [_claim("shared", allocated=False)], seen_claims=seen)
    assert released.claims == () and released.step == 4
    assert [p.ref for p in released.evict_now()] == ["ns/web"]


def test_a_claim_shared_with_pods_elsewhere_is_released_once_this_nodes_pods_are_out() -> None:
    network = _claim("fabric", "here", "elsewhere", node=None)  # not node-local: pods on other nodes use it
    plan = drain.plan(_node(True), [_pod("here", claims=["fabric"])], [network])
    [held] = plan.claims
    assert held.reason == "reserved for pod(s) ns/here (on the node)"
    after = drain.plan(_node(True), [], [_claim("fabric", "elsewhere", node=None)],
                       seen_pods=plan.pod_uids, seen_claims=frozenset({held.uid}))
    assert after.claims == () and after.done


def test_never_reserved_and_quarantine_claims_do_not_hold_the_drain() -> None:
    quarantine = _claim("q")
    quarantine["metadata"].update(namespace="claimwarden-system", labels={"claimwarden.io/record": "x"})
    plan = drain.plan(_node(True), [], [quarantine, _claim("allocated-for-nobody")])
    assert plan.claims == () and plan.done


def test_daemonset_and_mirror_pods_stay_and_their_claims_are_not_waited_for() -> None:
    daemon = _pod("driver-ds", claims=["ds-claim"], owner=[{"kind": "DaemonSet", "name": "ds", "controller": True}])
    mirror = _pod("etcd", annotations={"kubernetes.io/config.mirror": "x"}, owner=[])
    plan = drain.plan(_node(True), [daemon, mirror], [_claim("ds-claim", "driver-ds")])
    assert plan.done and plan.claims == ()
    assert [(left.ref, left.reason.split(" ")[0]) for left in plan.ignored] == [
        ("ns/driver-ds", "DaemonSet-managed"), ("ns/etcd", "mirror")]


def test_pods_without_controller_or_with_emptydir_are_refused_unless_flagged_like_kubectl() -> None:
    bare = _pod("bare", owner=[])
    scratch = _pod("scratch", volumes=[{"name": "tmp", "emptyDir": {}}])
    done = _pod("done", owner=[], phase="Succeeded")
    plan = drain.plan(_node(), [bare, scratch, done], [])
    assert {left.ref: left.reason.split(":")[0] for left in plan.refused} == {
        "ns/bare": "declares no controller, so nothing re-creates it",
        "ns/scratch": "uses emptyDir volume(s) tmp"}
    allowed = drain.plan(_node(), [bare, scratch, done], [],
                         options=drain.Options(force=True, delete_emptydir_data=True))
    assert allowed.refused == () and len(allowed.rest) == 3


def test_terminal_pods_with_claims_go_with_the_rest_and_their_claims_are_waited_for() -> None:
    finished = _pod("finished", template="finished-t-x", phase="Succeeded")
    plan = drain.plan(_node(True), [finished], [_claim("finished-t-x", owner="finished")])
    assert plan.consumers == () and plan.step == 3 and [p.ref for p in plan.rest] == ["ns/finished"]


def test_terminating_pods_are_waited_for_not_evicted_again_and_named_with_their_grace_period() -> None:
    pod = _pod("slow", claims=["c"], deleting="2026-12-02T20:59:30Z")
    pod["metadata"]["deletionGracePeriodSeconds"] = 20
    pod["metadata"]["finalizers"] = ["example.com/keep"]
    plan = drain.plan(_node(True), [pod, _pod("web")], [_claim("c", "slow")])
    assert plan.step == 2 and plan.evict_now() == ()
    [stuck] = drain.stuck(plan, {}, NOW)
    assert stuck.reason == "Terminating (grace period 20s, 30s past its grace period); finalizer(s) example.com/keep"
    assert drain.force_deletions(plan, {}, NOW, after=timedelta(0)) == [(plan.consumers[0], 0)]


def test_force_after_deletes_the_pods_a_budget_refuses_with_their_own_grace_period() -> None:
    plan = drain.plan(_node(True), [_pod("guarded", claims=["c"]), _pod("free", claims=["d"])],
                      [_claim("c", "guarded"), _claim("d", "free")])
    refusals = {"uid-guarded": "eviction refused by PodDisruptionBudget ns/keep-one: needs 1 healthy"}
    stuck = {s.object: s.reason for s in drain.stuck(plan, refusals, NOW)}
    assert stuck == {"pod/ns/guarded": refusals["uid-guarded"], "pod/ns/free": "not evicted yet"}
    since = {"uid-guarded": NOW - timedelta(seconds=30)}
    assert [(p.ref, grace) for p, grace in drain.force_deletions(plan, since, NOW, after=timedelta(seconds=30))] == [
        ("ns/guarded", None)]


def test_pods_of_other_nodes_are_none_of_its_business() -> None:
    plan = drain.plan(_node(True), [_pod("away", claims=["c"], node="node-b")], [_claim("c", "away", node="node-b")])
    assert plan.done


def test_budgets_are_matched_by_selector_in_the_pods_namespace() -> None:
    pod = _pod("p", labels={"app": "train", "tier": "gpu"})
    budgets = [
        {"metadata": {"name": "by-label", "namespace": "ns"}, "spec": {"selector": {"matchLabels": {"app": "train"}}}},
        {"metadata": {"name": "by-expr", "namespace": "ns"}, "spec": {"selector": {"matchExpressions": [
            {"key": "tier", "operator": "In", "values": ["gpu"]}, {"key": "x", "operator": "DoesNotExist"}]}}},
        {"metadata": {"name": "all", "namespace": "ns"}, "spec": {"selector": {}}},
        {"metadata": {"name": "none", "namespace": "ns"}, "spec": {}},
        {"metadata": {"name": "other-ns", "namespace": "other"}, "spec": {"selector": {}}},
        {"metadata": {"name": "miss", "namespace": "ns"}, "spec": {"selector": {"matchExpressions": [
            {"key": "app", "operator": "NotIn", "values": ["train"]}]}}},
    ]
    assert drain.budgets_of(pod, budgets) == ["ns/all", "ns/by-expr", "ns/by-label"]


def test_a_pod_with_an_extended_resource_claim_is_a_dra_consumer() -> None:
    pod = _pod("ext")
    pod["spec"]["resourceClaims"] = []
    pod["status"]["extendedResourceClaimStatus"] = {"resourceClaimName": "ext-extended-resources-x"}
    claim = _claim("ext-extended-resources-x", "ext", owner="ext")
    claim["metadata"]["annotations"] = {"resource.kubernetes.io/extended-resource-claim": "true"}
    plan = drain.plan(_node(True), [pod, _pod("web")], [claim])
    assert [(p.ref, p.claims) for p in plan.consumers] == [("ns/ext", ("ns/ext-extended-resources-x",))]
    assert [h.ref for h in plan.claims] == ["ns/ext-extended-resources-x"]


def test_a_claim_reserved_for_a_podgroup_does_not_hold_the_drain_once_its_pods_left_the_node() -> None:
    # The PodGroup's reservation stays while the group exists, whatever its pods do: waiting for it hangs step 3.
    group = _claim("group-gpu")
    group["status"]["reservedFor"] = [{"apiGroup": "scheduling.k8s.io", "resource": "podgroups", "name": "pg",
                                       "uid": "pg-1"}]
    member = _pod("member", claims=["group-gpu"])
    during = drain.plan(_node(True), [member, _pod("web")], [group])
    assert during.step == 2 and [p.ref for p in during.evict_now()] == ["ns/member"]
    after = drain.plan(_node(True), [_pod("web")], [group], seen_pods=during.pod_uids)
    assert after.claims == () and after.step == 4


def test_force_after_counts_from_each_pods_own_refusal_not_from_the_drains_start() -> None:
    # Step 4 reached long after --force-after: a pod the budget refused a second ago is not deleted yet.
    plan = drain.plan(_node(True), [_pod("guarded")], [])
    since = {"uid-guarded": NOW - timedelta(seconds=1)}
    assert drain.force_deletions(plan, since, NOW, after=timedelta(minutes=5)) == []
    since = {"uid-guarded": NOW - timedelta(minutes=5)}
    assert [(p.ref, grace) for p, grace in drain.force_deletions(plan, since, NOW, after=timedelta(minutes=5))] == [
        ("ns/guarded", None)]


def test_force_after_gives_a_terminating_pod_its_grace_period_plus_the_wait() -> None:
    pod = _pod("slow", deleting="2026-12-02T20:59:30Z")  # its grace period ended 30 s before NOW
    plan = drain.plan(_node(True), [pod], [])
    assert drain.force_deletions(plan, {}, NOW, after=timedelta(minutes=1)) == []
    assert drain.force_deletions(plan, {}, NOW, after=timedelta(seconds=30)) == [(plan.rest[0], 0)]


def test_only_a_disruption_budget_cause_makes_a_429_a_budgets_refusal() -> None:
    cause = "The disruption budget never needs 1 healthy pods and has 1 currently"
    budget = {"kind": "Status", "code": 429, "reason": "TooManyRequests",
              "message": "Cannot evict pod as it would violate the pod's disruption budget.",
              "details": {"causes": [{"reason": "DisruptionBudget", "message": cause}]}}
    assert drain.budget_refusal_causes(budget) == [cause]
    throttled = {"kind": "Status", "code": 429, "reason": "TooManyRequests",
                 "message": "Too many requests, please try again later.", "details": {"retryAfterSeconds": 1}}
    assert drain.budget_refusal_causes(throttled) is None
    assert drain.budget_refusal_causes("not json") is None


def test_a_forbidden_eviction_stops_the_drain_unless_the_namespace_is_being_deleted() -> None:
    rbac = {"code": 403, "reason": "Forbidden", "message": 'pods "p" is forbidden: User "u" cannot create resource '
            '"pods/eviction"', "details": {"name": "p", "kind": "pods"}}
    assert drain.eviction_forbidden(403, rbac)
    terminating = {"code": 403, "reason": "Forbidden", "details": {"causes": [
        {"reason": "NamespaceTerminating", "message": "namespace ns is being terminated"}]}}
    assert not drain.eviction_forbidden(403, terminating)
    assert not drain.eviction_forbidden(429, {}) and not drain.eviction_forbidden(500, {})


def test_later_rounds_read_the_claims_of_the_drained_pods_and_held_claims_namespaces_only() -> None:
    other = _claim("far", "gone")
    other["metadata"]["namespace"] = "batch"  # local to the node, reserved for a pod no round saw
    plan = drain.plan(_node(True), [_pod("web")], [other])
    assert drain.claim_namespaces(plan) == {"ns", "batch"}
