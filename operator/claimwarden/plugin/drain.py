"""`kubectl claimwarden drain NODE`: which of a node's pods go in which order, and what holds the drain up.
Pure functions over the raw JSON of the node, its pods, the cluster's claims and PodDisruptionBudgets;
drainer.py reads and writes.

The order (docs/guides/drain.md):

1. cordon the node;
2. evict its DRA consumers: pods that use ResourceClaims (spec.resourceClaims, an extended-resource
   claim, or a reservation in a claim's status.reservedFor);
3. wait until their claims are released;
4. only then evict the rest, the DRA driver's pod among them.

Why: the kubelet asks the DRA driver to unprepare a pod's devices when the pod stops. A driver pod
evicted before its consumers leaves them hanging in Terminating (KMM#1332); NVIDIA's driver manager
learned to evict DRA pods first for the same reason (k8s-driver-manager#204).

"Released", for a claim a pod of this node used: no reservation names a pod of this node any more; a
claim generated for such a pod is gone; a claim whose allocation is local to this node is reserved for
nobody, and a standalone one seen held during this drain is deallocated. A standalone claim that pods on
other nodes still share (a network-attached device) is released once this node's pods are out of its
reservedFor: it stays allocated for them. A reservation for a PodGroup (or anything but a pod) is not waited
for: it stays while the group exists, whatever its pods on this node do.

The plan is level-based: each call looks at the cluster as it is, so a second run, or a run after a
crash, continues where the first one stopped. The only memory is the caller's: the UIDs of pods seen on
the node and of claims seen held for them, so that a reservation of a pod already gone, or a claim
already unreserved but not yet deallocated, is still waited for.

DaemonSet pods are left alone (kubectl drain --ignore-daemonsets), mirror pods too (the kubelet owns
them). Like kubectl, the drain refuses, before writing anything, pods without a controller unless
`force` (nothing re-creates them) and pods with emptyDir volumes unless `delete_emptydir_data` (the data
goes with the pod).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from claimwarden.health.records import RECORD_LABEL
from claimwarden.objects.claims import (
    DELETE_PROTECTION_FINALIZER,
    controlling_pod_uid,
    is_pod_reservation,
    reserved_for,
)
from claimwarden.objects.meta import is_being_deleted
from claimwarden.objects.pods import TERMINAL_PHASES, has_claims, pod_claim_names
from claimwarden.timestamps import parse_rfc3339

from .snapshot import Obj, name_of, namespace_of, ref_of

MIRROR_ANNOTATION = "kubernetes.io/config.mirror"
STEPS = {1: "cordon", 2: "evict DRA consumers", 3: "wait until their claims are released", 4: "evict the rest",
         5: "done"}


@dataclass(frozen=True)
class Options:
    force: bool = False
    """Evict pods that declare no controller (kubectl drain --force)."""
    delete_emptydir_data: bool = False
    """Evict pods with emptyDir volumes (kubectl drain --delete-emptydir-data)."""


@dataclass(frozen=True)
class PodStep:
    """A pod the drain evicts (or waits for, once it is terminating)."""

    namespace: str
    name: str
    uid: str
    claims: tuple[str, ...]
    grace_seconds: int
    deleting_since: str | None
    """metadata.deletionTimestamp: the pod is terminating (its grace period ends then)."""
    finalizers: tuple[str, ...] = ()

    @property
    def ref(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def terminating(self) -> bool:
        return self.deleting_since is not None


@dataclass(frozen=True)
class Held:
    """A claim not released yet, and why."""

    ref: str
    uid: str
    reason: str


@dataclass(frozen=True)
class Left:
    """A pod the drain leaves on the node (ignored) or may not remove (refused), and why."""

    ref: str
    reason: str


@dataclass(frozen=True)
class Plan:
    node: str
    cordon: bool
    consumers: tuple[PodStep, ...]
    """Step 2: DRA consumers still on the node."""
    claims: tuple[Held, ...]
    """Step 3: claims not released yet."""
    rest: tuple[PodStep, ...]
    """Step 4: every other pod the drain removes."""
    ignored: tuple[Left, ...] = ()
    refused: tuple[Left, ...] = ()
    pod_uids: frozenset[str] = field(default_factory=frozenset)
    """UIDs of the pods on the node now that the drain removes (the caller remembers them)."""

    @property
    def step(self) -> int:
        """The step the drain is at: 2 while DRA consumers are on the node, 3 while their claims are held,
        4 while other pods are, 5 when done (the cordon, step 1, comes first in any case)."""
        if self.consumers:
            return 2
        if self.claims:
            return 3
        return 4 if self.rest else 5

    def evict_now(self) -> tuple[PodStep, ...]:
        """The pods to evict at this step (not those already terminating)."""
        pods = {2: self.consumers, 4: self.rest}.get(self.step, ())
        return tuple(p for p in pods if not p.terminating)

    @property
    def done(self) -> bool:
        return self.step == 5 and not self.cordon


def plan(node: Obj, pods: Iterable[Obj], claims: Iterable[Obj], *, options: Options = Options(),
         seen_pods: frozenset[str] = frozenset(), seen_claims: frozenset[str] = frozenset(),
         claimwarden_namespace: str = "claimwarden-system") -> Plan:
    """The drain of `node` as things are: `pods` bound to it, every claim of the cluster; `seen_pods` and
    `seen_claims` are UIDs that earlier plans of this drain returned (Plan.pod_uids, held claims)."""
    node_name = name_of(node)
    claims = list(claims)
    on_node = [p for p in pods if (p.get("spec") or {}).get("nodeName") == node_name]
    reserved_uids = {str(e.get("uid")) for c in claims for e in reserved_for(c) if is_pod_reservation(e)}
    consumers: list[PodStep] = []
    rest: list[PodStep] = []
    ignored: list[Left] = []
    refused: list[Left] = []
    kept: set[str] = set()  # UIDs of pods left on the node: their claims are not waited for
    for pod in sorted(on_node, key=ref_of):
        uid = str((pod.get("metadata") or {}).get("uid") or "")
        why_left = _left_alone(pod)
        if why_left:
            ignored.append(Left(ref_of(pod), why_left))
            kept.add(uid)
            continue
        terminal = (pod.get("status") or {}).get("phase") in TERMINAL_PHASES
        why_refused = None if terminal or is_being_deleted(pod) else _refused(pod, options)
        if why_refused:
            refused.append(Left(ref_of(pod), why_refused))
        step = _pod_step(pod, uid)
        if not terminal and (has_claims(pod) or uid in reserved_uids):
            consumers.append(step)
        else:
            rest.append(step)
    drained = {p.uid for p in (*consumers, *rest)}
    held = [h for c in sorted(claims, key=ref_of)
            if (h := _held(c, node_name=node_name, node_pods={str((p.get("metadata") or {}).get("uid")): p
                                                               for p in on_node},
                           ours=drained | seen_pods, kept=kept, seen_claims=seen_claims,
                           claimwarden_namespace=claimwarden_namespace))]
    return Plan(node=node_name, cordon=not (node.get("spec") or {}).get("unschedulable"),
                consumers=tuple(consumers), claims=tuple(held), rest=tuple(rest), ignored=tuple(ignored),
                refused=tuple(refused), pod_uids=frozenset(drained))


def claim_namespaces(current: Plan) -> set[str]:
    """The namespaces whose claims later rounds must read: those of the pods the drain removes (a gone pod's claims
    stay in its namespace) and of the claims it waits for. A claim tied to the node only by its allocation, for a pod
    no round saw, is found by the cluster-wide read that drainer.py makes now and then."""
    return {p.namespace for p in (*current.consumers, *current.rest)} | {h.ref.split("/", 1)[0] for h in current.claims}


def _left_alone(pod: Obj) -> str | None:
    meta = pod.get("metadata") or {}
    if MIRROR_ANNOTATION in (meta.get("annotations") or {}):
        return "mirror pod (a static pod: the kubelet owns it)"
    controller = _controller(pod)
    if controller and controller.get("kind") == "DaemonSet":
        return f"DaemonSet-managed ({controller.get('name')}), as kubectl drain --ignore-daemonsets"
    return None


def _refused(pod: Obj, options: Options) -> str | None:
    if not options.force and _controller(pod) is None:
        return "declares no controller, so nothing re-creates it: --force evicts it anyway"
    if not options.delete_emptydir_data:
        volumes = [str(v.get("name")) for v in (pod.get("spec") or {}).get("volumes") or [] if "emptyDir" in v]
        if volumes:
            return (f"uses emptyDir volume(s) {', '.join(volumes)}: --delete-emptydir-data evicts it "
                    "(the data is lost)")
    return None


def _controller(pod: Obj) -> Obj | None:
    return next((r for r in (pod.get("metadata") or {}).get("ownerReferences") or [] if r.get("controller")), None)


def _pod_step(pod: Obj, uid: str) -> PodStep:
    meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
    namespace = namespace_of(pod)
    grace = meta.get("deletionGracePeriodSeconds")
    if grace is None:
        grace = spec.get("terminationGracePeriodSeconds", 30)
    return PodStep(namespace=namespace, name=name_of(pod), uid=uid,
                   claims=tuple(f"{namespace}/{name}" for name in pod_claim_names(pod)),
                   grace_seconds=int(grace or 0), deleting_since=meta.get("deletionTimestamp"),
                   finalizers=tuple(meta.get("finalizers") or ()))


def is_local_to(claim: Obj, node_name: str) -> bool:
    """True when the claim's allocation can only be used on `node_name` (what the scheduler writes for a
    node-local slice: one term, metadata.name In [node])."""
    allocation = (claim.get("status") or {}).get("allocation") or {}
    terms = (allocation.get("nodeSelector") or {}).get("nodeSelectorTerms") or []
    if not terms:
        return False
    for term in terms:
        fields = term.get("matchFields") or []
        if not any(f.get("key") == "metadata.name" and f.get("operator") == "In" and f.get("values") == [node_name]
                   for f in fields):
            return False
    return True


def _held(claim: Obj, *, node_name: str, node_pods: dict[str, Obj], ours: set[str] | frozenset[str],
          kept: set[str], seen_claims: frozenset[str], claimwarden_namespace: str) -> Held | None:
    """Why the claim is not released for this node's drain yet, or None (released, or none of its business)."""
    meta = claim.get("metadata") or {}
    if meta.get("namespace") == claimwarden_namespace and RECORD_LABEL in (meta.get("labels") or {}):
        return None  # claimwarden's quarantine claim parks a broken device: nobody's pod uses it
    uid = str(meta.get("uid") or "")
    local = is_local_to(claim, node_name)

    def is_ours(pod_uid: str | None) -> bool:
        # A node-local allocation can only serve pods of this node: any pod but those the drain leaves is ours.
        return bool(pod_uid) and pod_uid not in kept and (pod_uid in ours or local)

    entries = reserved_for(claim)
    # Only pod reservations: a PodGroup's (or any other consumer's) stays while that consumer exists, whatever its
    # pods on this node do, so waiting for it would hang; the kubelet unprepares once the node's pods are gone.
    holders = [e for e in entries if is_pod_reservation(e) and is_ours(str(e.get("uid")))]
    reasons = []
    if holders:
        described = []
        for entry in holders:
            pod = node_pods.get(str(entry.get("uid")))
            state = "gone, its reservation not removed yet" if pod is None else (
                "terminating" if is_being_deleted(pod) else "on the node")
            described.append(f"{meta.get('namespace')}/{entry.get('name')} ({state})")
        reasons.append("reserved for pod(s) " + ", ".join(described))
    owner = controlling_pod_uid(claim)
    generated_for_ours = owner is not None and is_ours(owner)
    if generated_for_ours and not reasons:
        reasons.append("generated for a pod of this node, not deleted yet")
    elif not entries and owner is None and uid in seen_claims:
        # Seen held for this node's pods earlier in this drain: the last reservation went. The controller that
        # releases it (claimwarden's reservations, or upstream's) deallocates it, then removes its finalizer.
        if (claim.get("status") or {}).get("allocation"):
            reasons.append("reserved for nobody, still allocated (not deallocated yet)")
        elif DELETE_PROTECTION_FINALIZER in (meta.get("finalizers") or []) and not meta.get("deletionTimestamp"):
            reasons.append(f"deallocated, its finalizer {DELETE_PROTECTION_FINALIZER} not removed yet")
    if not reasons:
        return None
    if meta.get("deletionTimestamp"):
        reasons.append("being deleted, held by finalizer(s) " + ", ".join(meta.get("finalizers") or ["none"]))
    return Held(ref_of(claim), uid, "; ".join(reasons))


# --- PodDisruptionBudgets -----------------------------------------------------------------------

def selector_matches(selector: Obj | None, labels: dict[str, str]) -> bool:
    """A metav1.LabelSelector: None matches nothing, {} everything (as policy/v1 PodDisruptionBudgets read it)."""
    if selector is None:
        return False
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for requirement in selector.get("matchExpressions") or []:
        key, operator = requirement.get("key", ""), requirement.get("operator", "")
        values = requirement.get("values") or []
        present = key in labels
        if operator == "In" and not (present and labels[key] in values):
            return False
        if operator == "NotIn" and present and labels[key] in values:
            return False
        if operator == "Exists" and not present:
            return False
        if operator == "DoesNotExist" and present:
            return False
    return True


def budgets_of(pod: Obj, pdbs: Iterable[Obj]) -> list[str]:
    """The PodDisruptionBudgets ("namespace/name") that count the pod."""
    labels = {str(k): str(v) for k, v in ((pod.get("metadata") or {}).get("labels") or {}).items()}
    return sorted(ref_of(b) for b in pdbs if namespace_of(b) == namespace_of(pod)
                  and selector_matches((b.get("spec") or {}).get("selector"), labels))


def budget_refusal_causes(answer: object) -> list[str] | None:
    """The messages of an eviction answer's DisruptionBudget causes (upstream's policyv1.DisruptionBudgetCause), or
    None when the refusal is not a budget's: API Priority and Fairness throttling answers 429 too."""
    if not isinstance(answer, dict):
        return None
    # metav1.StatusCause's Type is "reason" in JSON.
    causes = [c for c in (answer.get("details") or {}).get("causes") or [] if c.get("reason") == "DisruptionBudget"]
    return [str(c.get("message") or "") for c in causes] if causes else None


def eviction_forbidden(status: int, answer: object) -> bool:
    """True when an eviction's refusal will not change by retrying: 401/403 (RBAC on pods/eviction, an admission
    webhook), as kubectl drain gives up on them. Not a 403 for a namespace being deleted (cause NamespaceTerminating):
    the namespace's controller deletes the pod soon."""
    if status not in (401, 403):
        return False
    causes = ((answer.get("details") or {}).get("causes") or []) if isinstance(answer, dict) else []
    return not any(c.get("reason") == "NamespaceTerminating" for c in causes)


# --- what holds the drain up ------------------------------------------------------------------

@dataclass(frozen=True)
class Stuck:
    object: str
    """pod/NAMESPACE/NAME or resourceclaim/NAMESPACE/NAME"""
    reason: str


def stuck(current: Plan, refusals: dict[str, str], now: datetime) -> list[Stuck]:
    """Everything the drain waits for at its current step, with why: `refusals` is the last refusal of each
    pod's eviction by UID (a PodDisruptionBudget's, in words)."""
    if current.step == 3:
        return [Stuck(f"resourceclaim/{h.ref}", h.reason) for h in current.claims]
    pods = current.consumers if current.step == 2 else current.rest
    out = []
    for pod in pods:
        if pod.terminating:
            out.append(Stuck(f"pod/{pod.ref}", _terminating(pod, now)))
        else:
            out.append(Stuck(f"pod/{pod.ref}", refusals.get(pod.uid, "not evicted yet")))
    return out


def _terminating(pod: PodStep, now: datetime) -> str:
    since = parse_rfc3339(pod.deleting_since)
    # deletionTimestamp is when the grace period ends (the deletion time plus the grace period).
    late = f", {(now - since).total_seconds():.0f}s past its grace period" if since and now > since else ""
    finalizers = f"; finalizer(s) {', '.join(pod.finalizers)}" if pod.finalizers else ""
    return f"Terminating (grace period {pod.grace_seconds}s{late}){finalizers}"


def force_deletions(current: Plan, budget_refused_since: Mapping[str, datetime], now: datetime, *,
                    after: timedelta) -> list[tuple[PodStep, int | None]]:
    """--force-after: the stuck pods of the current step to delete instead of evicting, with the grace period to
    delete them with. `after` counts for each pod on its own, never from the drain's start (a step reached late must
    not delete a pod at its first refusal): a pod a PodDisruptionBudget has refused since `budget_refused_since[uid]`
    for `after` goes with its own grace period (None); a pod still Terminating `after` past the end of its grace
    period is deleted with 0, which removes it from the API without the kubelet's confirmation."""
    pods = {2: current.consumers, 4: current.rest}.get(current.step, ())
    out: list[tuple[PodStep, int | None]] = []
    for pod in pods:
        if pod.terminating:
            grace_ended = parse_rfc3339(pod.deleting_since)
            if grace_ended is not None and now - grace_ended >= after:
                out.append((pod, 0))
        elif pod.uid in budget_refused_since and now - budget_refused_since[pod.uid] >= after:
            out.append((pod, None))
    return out
