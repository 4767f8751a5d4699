"""A record's `spec.drain: Node` (health/node_drain.py): which of the node's pods the record evicts at each step, on
the projections claimwarden's cache holds (pods without ownerReferences, claims without their allocation's node
selector); plain dicts, no cluster."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from claimwarden.health.node_drain import plan_node_drain
from claimwarden.health.plan import Eviction

NODE = "node-a"
MARKED = datetime(2026, 12, 2, 21, 0, tzinfo=UTC)


def _pod(name: str, *claims: str, owner: str | None = None, volumes: list[dict[str, Any]] | None = None,
         node: str = NODE) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": "ns", "uid": f"uid-{name}"}
    if owner:
        meta["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": owner, "name": "o", "uid": "o-1",
                                    "controller": True}]
    return {"metadata": meta, "spec": {"nodeName": node, "volumes": volumes or [],
                                       "resourceClaims": [{"name": f"c{i}", "resourceClaimName": c}
                                                          for i, c in enumerate(claims)]},
            "status": {"phase": "Running"}}


def _claim(name: str, *reserved: str, allocated: bool = True) -> dict[str, Any]:
    status: dict[str, Any] = {}
    if allocated:  # as the cache projects it: the results, not the node selector
        status["allocation"] = {"devices": {"results": [{"driver": "d", "pool": NODE, "device": "gpu-0"}]}}
    if reserved:
        status["reservedFor"] = [{"resource": "pods", "name": p, "uid": f"uid-{p}"} for p in reserved]
    return {"metadata": {"name": name, "namespace": "ns", "uid": f"claim-{name}"}, "status": status}


def test_the_nodes_dra_consumers_go_first_each_once() -> None:
    pods = [_pod("trainer", "gpu-a"), _pod("helper", "gpu-a"), _pod("other-node", "gpu-b", node="node-b")]
    current = plan_node_drain(NODE, pods, [_claim("gpu-a", "trainer", "helper"), _claim("gpu-b", "other-node")],
                              MARKED)
    assert current.step == 2 and current.pending == 2
    assert current.evict == (Eviction("ns", "helper", "uid-helper", "gpu-a", MARKED),
                             Eviction("ns", "trainer", "uid-trainer", "gpu-a", MARKED))
    again = plan_node_drain(NODE, pods, [_claim("gpu-a", "trainer", "helper")], MARKED,
                            evicted=frozenset({"uid-helper"}), seen_pods=current.seen_pods)
    assert [e.pod for e in again.evict] == ["trainer"] and again.pending == 2  # helper is leaving: still pending


def test_then_it_waits_until_their_claims_are_released_remembering_the_pods_it_saw() -> None:
    first = plan_node_drain(NODE, [_pod("trainer", "gpu-a")], [_claim("gpu-a", "trainer")], MARKED)
    # trainer is gone; its reservation is not removed yet. The cache's claim has no node selector: only the
    # memory of the pods seen says the reservation is this node's.
    waiting = plan_node_drain(NODE, [], [_claim("gpu-a", "trainer")], MARKED, seen_pods=first.seen_pods,
                              seen_claims=first.seen_claims)
    assert waiting.step == 3 and waiting.evict == () and waiting.pending == 0 and not waiting.needs_other_pods
    assert waiting.held == ("ns/gpu-a: reserved for pod(s) ns/trainer (gone, its reservation not removed yet)",)
    deallocating = plan_node_drain(NODE, [], [_claim("gpu-a")], MARKED, seen_pods=waiting.seen_pods,
                                   seen_claims=waiting.seen_claims)
    assert deallocating.step == 3 and "still allocated" in deallocating.held[0]
    released = plan_node_drain(NODE, [], [_claim("gpu-a", allocated=False)], MARKED,
                               seen_pods=waiting.seen_pods, seen_claims=waiting.seen_claims)
    assert released.needs_other_pods and released.evict == ()


def test_then_every_other_pod_goes_without_the_plugins_refusals_and_daemonsets_stay() -> None:
    pods = [_pod("web"), _pod("scratch", owner="ReplicaSet", volumes=[{"name": "tmp", "emptyDir": {}}]),
            _pod("agent", owner="DaemonSet")]
    current = plan_node_drain(NODE, pods, [_claim("gpu-a", allocated=False)], MARKED)
    assert current.step == 4 and current.pending == 2
    assert [(e.pod, e.claim) for e in current.evict] == [("scratch", ""), ("web", "")]
    done = plan_node_drain(NODE, [_pod("agent", owner="DaemonSet")], [], MARKED, seen_pods=current.seen_pods)
    assert done.step == 5 and done.evict == () and done.pending == 0


def test_a_dra_consumer_that_arrives_later_sends_the_drain_back_to_step_2() -> None:
    current = plan_node_drain(NODE, [_pod("web"), _pod("late", "gpu-c")], [_claim("gpu-c", "late")], MARKED)
    assert current.step == 2 and [e.pod for e in current.evict] == ["late"]


def test_claimwardens_own_pods_stay_on_the_node() -> None:
    ours = _pod("claimwarden-7d9f", owner="ReplicaSet")
    ours["metadata"]["namespace"] = "gpu-ops"
    current = plan_node_drain(NODE, [_pod("web"), ours], [], MARKED, claimwarden_namespace="gpu-ops")
    assert [e.pod for e in current.evict] == ["web"] and current.pending == 1
    done = plan_node_drain(NODE, [ours], [], MARKED, seen_pods=current.seen_pods, claimwarden_namespace="gpu-ops")
    assert done.step == 5 and done.evict == ()
