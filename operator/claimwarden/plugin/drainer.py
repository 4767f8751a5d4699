"""`kubectl claimwarden drain NODE`: the loop that reads the node, plans (drain.py) and acts, once a second,
until the node is drained or --timeout passes.

Each round reads the node, its pods (a field selector on spec.nodeName) and the ResourceClaims (read_plan), asks
drain.plan what to do now, and does it: cordon (a merge patch of spec.unschedulable), evictions through
the Eviction API (policy/v1, pinned to the pod's UID), and, with --force-after, deletions of the pods a
PodDisruptionBudget has refused for that long or that stay Terminating that long past their grace period
(counted per pod, drain.force_deletions). A refusal is retried with back-off, 1 s doubling to 30 s, like
claimwarden's own evictions (health/evictions.py), and reported: a budget's (HTTP 429 with a DisruptionBudget
cause) with the budget, read only then; any other (API throttling, 403, 500) as it is, and never forced.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import quote

from . import drain
from .read import Cluster, ClusterError

RETRY_FIRST, RETRY_MAX = 1.0, 30.0
POLL_SECONDS = 1.0
FULL_LIST_EVERY = 30
CLAIMS_PATH = "/apis/resource.k8s.io/v1/resourceclaims"
PDB_PATH = "/apis/policy/v1/poddisruptionbudgets"
EXIT_DRAINED, EXIT_NOT_DRAINED = 0, 1

Say = Callable[[str], None]


class NodeNotFound(Exception):
    """The node does not exist."""


@dataclass
class Memory:
    """What the loop remembers between rounds (drain.py: the only state outside the cluster)."""

    pods: set[str] = field(default_factory=set)
    claims: set[str] = field(default_factory=set)
    refusals: dict[str, str] = field(default_factory=dict)
    """pod UID -> the last refusal of its eviction, in words"""
    budget_refused_since: dict[str, datetime] = field(default_factory=dict)
    """pod UID -> when a PodDisruptionBudget first refused its eviction (what --force-after counts from)"""
    attempts: dict[str, int] = field(default_factory=dict)
    next_try: dict[str, float] = field(default_factory=dict)
    evicted: int = 0
    forced: set[str] = field(default_factory=set)
    namespaces: set[str] = field(default_factory=set)
    """namespaces of the pods and held claims seen so far: where a round reads claims (drain.claim_namespaces)"""
    rounds: int = 0


@dataclass(frozen=True)
class Settings:
    node: str
    timeout: timedelta | None = None
    force_after: timedelta | None = None
    options: drain.Options = field(default_factory=drain.Options)
    claimwarden_namespace: str = "claimwarden-system"


def read_plan(cluster: Cluster, settings: Settings, memory: Memory) -> drain.Plan:
    node = cluster.get(f"/api/v1/nodes/{quote(settings.node)}")
    if node is None:
        raise NodeNotFound(settings.node)
    pods = cluster.list(f"/api/v1/pods?fieldSelector=spec.nodeName%3D{quote(settings.node)}") or []
    # Every claim of the cluster only every FULL_LIST_EVERY rounds (the first included: claims tied to the node by
    # their allocation alone, for pods a crashed run saw); in between, only the namespaces that matter, so that a
    # cluster of 100,000 claims is not read in full once a second.
    full = memory.rounds % FULL_LIST_EVERY == 0
    memory.rounds += 1
    namespaces = sorted(memory.namespaces | {str((p.get("metadata") or {}).get("namespace") or "") for p in pods})
    if full:
        claims = cluster.list(CLAIMS_PATH) or []
    else:
        claims = [c for ns in namespaces if ns
                  for c in cluster.list(f"/apis/resource.k8s.io/v1/namespaces/{quote(ns)}/resourceclaims") or []]
    current = drain.plan(node, pods, claims, options=settings.options, seen_pods=frozenset(memory.pods),
                         seen_claims=frozenset(memory.claims), claimwarden_namespace=settings.claimwarden_namespace)
    memory.namespaces |= drain.claim_namespaces(current)
    return current


def dry_run(cluster: Cluster, settings: Settings, say: Say) -> int:
    """Print every step and object the drain would act on now; write nothing."""
    plan = read_plan(cluster, settings, Memory())
    say(f"drain {settings.node}: dry run, nothing written")
    if plan.refused:
        _refusal(plan, say)
        return EXIT_NOT_DRAINED
    say(f"step 1: would cordon node {plan.node}" if plan.cordon else f"step 1: node {plan.node} is cordoned already")
    say(f"step 2: would evict {len(plan.consumers)} DRA consumer pod(s)")
    for pod in plan.consumers:
        say(f"  pod {pod.ref}" + (" (Terminating already: would wait)" if pod.terminating else "")
            + (f" (claims {', '.join(pod.claims)})" if pod.claims else ""))
    say(f"step 3: would wait until {len(plan.claims)} claim(s) are released")
    for held in plan.claims:
        say(f"  resourceclaim {held.ref}: {held.reason}")
    say(f"step 4: would then evict {len(plan.rest)} other pod(s)")
    for pod in plan.rest:
        say(f"  pod {pod.ref}" + (" (Terminating already: would wait)" if pod.terminating else ""))
    _ignored(plan, say)
    return EXIT_DRAINED


def plan_data(plan: drain.Plan) -> dict[str, Any]:
    """What dry_run prints, as a document (-o json|yaml): the steps, each with the objects it acts on."""
    return {
        "node": plan.node, "cordon": plan.cordon,
        "consumers": [{"pod": p.ref, "claims": list(p.claims), "terminating": p.terminating} for p in plan.consumers],
        "claims": [{"claim": h.ref, "reason": h.reason} for h in plan.claims],
        "rest": [{"pod": p.ref, "terminating": p.terminating} for p in plan.rest],
        "ignored": [{"pod": left.ref, "reason": left.reason} for left in plan.ignored],
        "refused": [{"pod": left.ref, "reason": left.reason} for left in plan.refused],
    }


def run(cluster: Cluster, settings: Settings, say: Say, *, clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep) -> int:
    """Drain the node; EXIT_DRAINED when done, EXIT_NOT_DRAINED (with the stuck list) at --timeout or when
    pods need --force / --delete-emptydir-data."""
    start = clock()
    memory = Memory()
    step = 0
    while True:
        plan = read_plan(cluster, settings, memory)
        if plan.refused:
            _refusal(plan, say, written=bool(memory.pods))
            return EXIT_NOT_DRAINED
        memory.pods |= plan.pod_uids
        memory.claims |= {h.uid for h in plan.claims}
        if plan.cordon:
            cluster.request("PATCH", f"/api/v1/nodes/{quote(plan.node)}", {"spec": {"unschedulable": True}},
                            content_type="application/merge-patch+json")
            say(f"node/{plan.node} cordoned" if step == 0 else f"node/{plan.node} uncordoned meanwhile: cordoned again")
            # On with the round: something that keeps uncordoning the node must not make a busy loop past --timeout.
        if plan.step != step:
            step = plan.step
            _announce(plan, say)
        if plan.done:
            _ignored(plan, say)
            say(f"node/{plan.node} drained in {clock() - start:.1f}s ({memory.evicted} pod(s) evicted"
                + (f", {len(memory.forced)} deleted past --force-after" if memory.forced else "") + ")")
            return EXIT_DRAINED
        elapsed = clock() - start
        for pod in plan.evict_now():
            if memory.next_try.get(pod.uid, 0.0) <= clock():
                _evict(cluster, pod, memory, say, clock)
        if settings.force_after is not None:
            _force(cluster, plan, memory, say, settings.force_after)
        if settings.timeout is not None and elapsed >= settings.timeout.total_seconds():
            say(f"drain of {plan.node} timed out after {elapsed:.0f}s at step {plan.step} "
                f"({drain.STEPS[plan.step]}); stuck:")
            for item in drain.stuck(plan, memory.refusals, datetime.now(UTC)):
                say(f"  {item.object}: {item.reason}")
            if plan.step < 4 and plan.rest:
                say(f"  and {len(plan.rest)} other pod(s) waiting for step 4")
            return EXIT_NOT_DRAINED
        sleep(POLL_SECONDS)


def _announce(plan: drain.Plan, say: Say) -> None:
    if plan.step == 2:
        say(f"step 2: evicting {len(plan.consumers)} DRA consumer pod(s) first")
    elif plan.step == 3:
        say(f"step 3: waiting until {len(plan.claims)} claim(s) are released")
    elif plan.step == 4:
        say(f"step 4: evicting {len(plan.rest)} other pod(s)")


def _ignored(plan: drain.Plan, say: Say) -> None:
    for left in plan.ignored:
        say(f"left alone: pod {left.ref}: {left.reason}")


def _refusal(plan: drain.Plan, say: Say, *, written: bool = False) -> None:
    done = "stopped (a new pod came)" if written else "nothing written"
    say(f"cannot drain {plan.node}: {done}; these pods need a flag:")
    for left in plan.refused:
        say(f"  pod {left.ref}: {left.reason}")


def _evict(cluster: Cluster, pod: drain.PodStep, memory: Memory, say: Say, clock: Callable[[], float]) -> None:
    path = f"/api/v1/namespaces/{quote(pod.namespace)}/pods/{quote(pod.name)}/eviction"
    body = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": pod.name, "namespace": pod.namespace},
            "deleteOptions": {"preconditions": {"uid": pod.uid}}}
    status, answer = cluster.call("POST", path, body)
    if 200 <= status <= 299:
        memory.evicted += 1
        memory.refusals.pop(pod.uid, None)
        memory.budget_refused_since.pop(pod.uid, None)
        say(f"evicted pod {pod.ref}")
        return
    if status in (404, 409):
        return  # gone, or replaced by a pod of the same name: the next round sees which
    if drain.eviction_forbidden(status, answer):
        message = answer.get("message") if isinstance(answer, dict) else None
        raise ClusterError(f"eviction of pod {pod.ref} refused: {status} {message or 'forbidden'}; may you create "
                           "pods/eviction in its namespace, or which admission webhook denies it?")
    attempts = memory.attempts.get(pod.uid, 0) + 1
    memory.attempts[pod.uid] = attempts
    delay = min(RETRY_FIRST * 2 ** (attempts - 1), RETRY_MAX)
    memory.next_try[pod.uid] = clock() + delay
    by_budget = status == 429 and drain.budget_refusal_causes(answer) is not None
    if by_budget:
        memory.budget_refused_since.setdefault(pod.uid, datetime.now(UTC))
    reason = _refusal_reason(cluster, pod, status, answer)
    if memory.refusals.get(pod.uid) != reason:
        say(f"pod {pod.ref}: {reason}; retrying with back-off")
    memory.refusals[pod.uid] = reason


def _refusal_reason(cluster: Cluster, pod: drain.PodStep, status: int, answer: Any) -> str:
    message = str(answer.get("message") or f"HTTP {status}") if isinstance(answer, dict) else f"HTTP {status}"
    causes = drain.budget_refusal_causes(answer) if status == 429 else None
    if causes is None:
        return f"eviction {'throttled by the API server' if status == 429 else 'failed'}: {message}"
    # The cause names the budget ("The disruption budget X needs ..."), not its namespace: name them here. A
    # refusal to read budgets (RBAC) must not stop the drain, only the naming.
    try:
        pdbs = cluster.list(f"/apis/policy/v1/namespaces/{quote(pod.namespace)}/poddisruptionbudgets") or []
        body = cluster.get(f"/api/v1/namespaces/{quote(pod.namespace)}/pods/{quote(pod.name)}") or {}
    except ClusterError:
        pdbs, body = [], {}
    names = drain.budgets_of(body, pdbs) if body else []
    budget = f"PodDisruptionBudget {', '.join(names)}" if names else "a PodDisruptionBudget"
    return f"eviction refused by {budget}: " + "; ".join([c for c in causes if c] or [message])


def _force(cluster: Cluster, plan: drain.Plan, memory: Memory, say: Say, after: timedelta) -> None:
    for pod, grace in drain.force_deletions(plan, memory.budget_refused_since, datetime.now(UTC), after=after):
        key = f"{pod.uid}/{grace}"
        if key in memory.forced:
            continue
        memory.forced.add(key)
        query = "" if grace is None else f"?gracePeriodSeconds={grace}"
        body = {"apiVersion": "v1", "kind": "DeleteOptions", "preconditions": {"uid": pod.uid}}
        status, answer = cluster.call(
            "DELETE", f"/api/v1/namespaces/{quote(pod.namespace)}/pods/{quote(pod.name)}{query}", body)
        if status in (404, 409):
            continue  # gone, or a new pod of the same name (a StatefulSet's) that the UID precondition spares
        if not 200 <= status <= 299:
            message = answer.get("message") if isinstance(answer, dict) else None
            raise ClusterError(f"--force-after: DELETE pod {pod.ref}: {status} {message or 'refused'}")
        what = ("deleted past its PodDisruptionBudget" if grace is None
                else "deleted with grace period 0 (removed from the API; its containers may still run)")
        say(f"--force-after: pod {pod.ref} {what}")
