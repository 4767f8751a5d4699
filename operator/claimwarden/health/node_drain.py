"""A record with `spec.drain: Node`: empty the record's whole node in the drain order of
`kubectl claimwarden drain` (plugin/drain.py), through claimwarden's own evictions. Pure decisions, no I/O.

The order: the node's DRA consumers first; then wait until their claims are released; then the node's other
pods. The evictions go through the record's eviction queue (health/evictions.py), so the breaker, the budget
and PodDisruptionBudgets apply as for any record. Unlike the plugin, the record does not cordon the node
(README "Drain modes", drain Node): claimwarden is given no write on Nodes, and a cordon would need undoing
when the record clears. The device's quarantine keeps new DRA work off the broken device; a pod that lands on
the node later is evicted while the record stays.

claimwarden's cache holds only pods with claims: the node's other pods are read from the API (a field selector
on spec.nodeName), and only once the DRA consumers are gone and their claims released (`needs_other_pods`).
DaemonSet and mirror pods are left alone, as by the plugin, and so are claimwarden's own pods; the plugin's
refusals (pods without a controller, emptyDir volumes) do not apply: a record evicts, it does not ask.
"""

from __future__ import annotations

from collections.abc import Iterable
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from claimwarden.health.plan import Eviction
from claimwarden.plugin import drain

EVICT_ALL = drain.Options(force=True, delete_emptydir_data=True)


@dataclass(frozen=True)
class NodeDrain:
    """Where the drain of a record's node stands."""

    node: str
    step: int
    """drain.STEPS: 2 evict DRA consumers, 3 wait for their claims, 4 evict the rest, 5 done."""
    evict: tuple[Eviction, ...]
    """The pods to evict now (not those terminating or evicted already)."""
    pending: int
    """Pods still to leave the node at this step (0 while claims are waited for)."""
    held: tuple[str, ...]
    """"namespace/claim: reason" of each claim not released yet (step 3)."""
    seen_pods: frozenset[str] = frozenset()
    seen_claims: frozenset[str] = frozenset()
    """What the next round must be given back (drain.plan's memory: pods gone since, claims seen held)."""

    @property
    def needs_other_pods(self) -> bool:
        """True when the DRA part is done: the node's other pods must be read (from the API) to go on."""
        return self.step >= 4


def plan_node_drain(node: str, pods: Iterable[dict[str, Any]], claims: Iterable[dict[str, Any]],
                    marked_at: datetime, *, evicted: AbstractSet[str] = frozenset(),
                    seen_pods: frozenset[str] = frozenset(), seen_claims: frozenset[str] = frozenset(),
                    claimwarden_namespace: str = "claimwarden-system") -> NodeDrain:
    """The drain of `node` for a record marked at `marked_at`: `pods` are the pods known on the node (with their
    claims; the others too once `needs_other_pods`), `claims` every claim of the cluster, `evicted` the UIDs of
    pods evicted already whose deletion the cache may not show yet, `seen_pods` and `seen_claims` what the last
    round returned."""
    # claimwarden's own pods stay: evicting the leader would cost a fail-over and the drain's memory.
    pods = [p for p in pods if (p.get("metadata") or {}).get("namespace") != claimwarden_namespace]
    current = drain.plan({"metadata": {"name": node}, "spec": {"unschedulable": True}}, pods, claims,
                         options=EVICT_ALL, seen_pods=seen_pods, seen_claims=seen_claims,
                         claimwarden_namespace=claimwarden_namespace)
    evict = tuple(Eviction(p.namespace, p.name, p.uid, p.claims[0].split("/", 1)[1] if p.claims else "", marked_at)
                  for p in current.evict_now() if p.uid not in evicted)
    step = current.step
    pending = {2: len(current.consumers), 4: len(current.rest)}.get(step, 0)
    return NodeDrain(node=node, step=step, evict=evict, pending=pending,
                     held=tuple(f"{h.ref}: {h.reason}" for h in current.claims),
                     seen_pods=seen_pods | current.pod_uids,
                     seen_claims=seen_claims | {h.uid for h in current.claims})
