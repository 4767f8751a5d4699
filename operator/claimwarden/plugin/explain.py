"""explain: why a pod's claims can or cannot be allocated, as a funnel per request and a verdict.

Both parts are pure functions over a `Snapshot`:

- **the funnel** (funnel.py), for people: per request, how many devices each allocator step leaves;
- **the verdict**, for the scheduler's answer: per node the pod may run on (nodeSelector, affinity,
  node taints, allocated claims' node selectors), the search (search.py) for all pending claims of
  the pod together. Allocatable on some node, blocked by the funnel step that removed the last
  candidates, or blocked by an error (CEL, a missing class, more than 32 devices) with its message,
  as the scheduler reports it.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from claimwarden.cel import Evaluator
from claimwarden.objects.pods import resolve_claim_names

from . import nodes as nodesel
from .constraints import constraints_of
from .funnel import Funnel, funnel
from .requests import (
    FUNNEL_ORDER,
    STEP_CLAIM,
    STEP_CLASS,
    STEP_CONSTRAINTS,
    STEP_COUNT,
    STEP_NODES,
    TITLES,
    AllocError,
    Req,
    requests_of,
)
from .search import Search, preflight
from .selectors import Context
from .snapshot import Obj, Snapshot, name_of, namespace_of, ref_of


@dataclass
class ClaimReport:
    ref: str
    name: str
    source: str
    allocated: bool
    results: list[Obj] = field(default_factory=list)
    reserved_for: list[str] = field(default_factory=list)
    funnels: list[list[Funnel]] = field(default_factory=list)
    problem: str = ""
    siblings: dict[str, list[str]] = field(default_factory=dict)
    """Allocated device ("driver/pool/device") -> the other devices of its fault domain (a mark of the whole
    device takes them along, docs/concepts/fault-domains.md)."""


@dataclass
class Verdict:
    allocatable: bool
    step: str | None
    reason: str
    nodes: list[str] = field(default_factory=list)
    allocated: bool = False


@dataclass
class Explanation:
    target: str
    claims: list[ClaimReport]
    nodes_total: int
    nodes_fit: list[str]
    nodes_excluded: dict[str, int]
    verdict: Verdict

    def one_line(self) -> str:
        return self.verdict.reason


def claims_of_pod(snapshot: Snapshot, pod: Obj) -> list[tuple[str, Obj | None, str]]:
    """(pod claim name, claim or None, source) for each of the pod's claims."""
    out = []
    for resolved in resolve_claim_names(pod):
        source = "template" if resolved.from_template else "claim"
        claim = snapshot.claim_index.get((namespace_of(pod), resolved.claim_name)) if resolved.claim_name else None
        out.append((resolved.pod_claim_name, claim, source))
    return out


def explain_pod(snapshot: Snapshot, pod: Obj, *, evaluator: Evaluator | None = None) -> Explanation:
    """The funnel and verdict for a pod's claims."""
    return _explain(snapshot, _pod_title(pod), pod, claims_of_pod(snapshot, pod), evaluator)


def _pod_title(pod: Obj) -> str:
    where = (pod.get("spec") or {}).get("nodeName")
    phase = (pod.get("status") or {}).get("phase") or "Pending"
    return f"pod {ref_of(pod)} ({phase}{f' on {where}' if where else ''})"


def explain_claim(snapshot: Snapshot, claim: Obj, *, evaluator: Evaluator | None = None) -> Explanation:
    """The funnel and verdict for one claim: in the context of a pod that waits for it, if any."""
    for pod in snapshot.pods:
        if namespace_of(pod) != namespace_of(claim) or (pod.get("spec") or {}).get("nodeName"):
            continue
        if any(c is claim for _, c, _ in claims_of_pod(snapshot, pod)):
            return _explain(snapshot, f"resourceclaim {ref_of(claim)}, for {_pod_title(pod)}", pod,
                            [("", claim, "claim")], evaluator)
    return _explain(snapshot, f"resourceclaim {ref_of(claim)}", None, [("", claim, "claim")], evaluator)


def _allocation_selector(claim: Obj) -> Obj | None:
    return ((claim.get("status") or {}).get("allocation") or {}).get("nodeSelector")


def _explain(snapshot: Snapshot, target: str, pod: Obj | None, entries: list[tuple[str, Obj | None, str]],
             evaluator: Evaluator | None) -> Explanation:
    ctx = Context(snapshot, evaluator)
    reports: list[ClaimReport] = []
    pending: list[Obj] = []
    missing: list[str] = []
    for pod_claim, claim, source in entries:
        if claim is None:
            missing.append(pod_claim)
            reports.append(ClaimReport("", pod_claim, source, False,
                                       problem=f"pod claim {pod_claim!r}: its ResourceClaim does not exist (yet)"))
            continue
        status = claim.get("status") or {}
        allocation = status.get("allocation")
        report = ClaimReport(ref_of(claim), pod_claim or name_of(claim), source, bool(allocation))
        report.reserved_for = [f"{e.get('resource')}/{e.get('name')}" for e in status.get("reservedFor") or []]
        if allocation:
            report.results = list((allocation.get("devices") or {}).get("results") or [])
            for result in report.results:
                device_id = (str(result.get("driver")), str(result.get("pool")), str(result.get("device")))
                if snapshot.fault_domains.get(device_id):
                    report.siblings["/".join(device_id)] = snapshot.fault_domains[device_id]
        elif (claim.get("metadata") or {}).get("deletionTimestamp"):
            report.problem = "the claim is being deleted"
        else:
            pending.append(claim)
        reports.append(report)
    selectors = [s for _, c, _ in entries if c is not None and (s := _allocation_selector(c))]
    excluded: dict[str, int] = defaultdict(int)
    fit_nodes = []
    for node in snapshot.nodes:
        why = nodesel.why_not(pod, node, selectors)
        if why is None:
            fit_nodes.append(node)
        else:
            excluded[why] += 1
    fit_names = [name_of(n) for n in fit_nodes]

    def done(verdict: Verdict) -> Explanation:
        return Explanation(target, reports, len(snapshot.nodes), fit_names, dict(excluded), verdict)

    if missing:
        return done(Verdict(False, STEP_CLAIM, f"blocked by claim: pod claim {missing[0]!r} has no ResourceClaim "
                                               "yet (it is generated from the pod's template; is a claims "
                                               "controller running?)"))
    deleting = [r for r in reports if r.problem]
    if deleting:
        return done(Verdict(False, STEP_CLAIM, f"blocked by claim: {deleting[0].ref} is being deleted"))
    if not pending:
        devices = ", ".join(f"{r.get('pool')}/{r.get('device')}" for rep in reports for r in rep.results)
        return done(Verdict(True, None, f"allocated: {devices or 'no devices'}", fit_names, allocated=True))
    # what the allocator sees: every device another claim holds
    own = {ref_of(c) for c in pending}
    held = {device_id for device_id, holders in snapshot.holders.items()
            if any(h.ref not in own for h in holders)}
    groups: list[list[Req]] = []
    index = {id(c): i for i, c in enumerate(pending)}
    for claim in pending:
        groups += requests_of(claim, index[id(claim)])
    for claim, report in zip(pending, [r for r in reports if not r.allocated], strict=True):
        for alts in requests_of(claim, index[id(claim)]):
            report.funnels.append([funnel(ctx, req, claim, fit_nodes, held) for req in alts])
    try:
        preflight(pending, groups)
        ok_nodes = [name_of(node) for node in fit_nodes if Search(ctx, pending, groups, node, held).run()]
    except AllocError as exc:
        if exc.step == STEP_CLASS:
            return done(Verdict(False, STEP_CLASS, f"blocked by device class: {exc} (create the DeviceClass or fix "
                                                   "deviceClassName)"))
        return done(Verdict(False, exc.step, f"blocked by error: {exc}"))
    if ok_nodes:
        shown = ", ".join(ok_nodes[:5]) + (f" and {len(ok_nodes) - 5} more" if len(ok_nodes) > 5 else "")
        return done(Verdict(True, None, f"allocatable now on nodes {shown}", ok_nodes))
    if not fit_nodes:
        reasons = ", ".join(f"{why} ({n} nodes)" for why, n in excluded.items()) or "the cluster has no nodes"
        return done(Verdict(False, STEP_NODES, f"blocked by node reachability: no node fits the pod: {reasons}"))
    return done(_blocked(reports, pending))


def _blocked(reports: list[ClaimReport], pending: list[Obj]) -> Verdict:
    """The step that removed the last candidates: the first request whose funnel runs dry."""
    for report in reports:
        for alts in report.funnels:
            if all(f.blocked_at for f in alts):
                furthest = max(alts, key=lambda f: FUNNEL_ORDER.index(f.blocked_at or STEP_CLASS))
                step = furthest.blocked_at or STEP_COUNT
                which = f"request {furthest.req.label}" if len(alts) == 1 else (
                    f"request {alts[0].req.request} (all {len(alts)} subrequests; got furthest: {furthest.req.sub})")
                return Verdict(False, step, f"blocked by {TITLES[step]}: claim {report.ref} {which}: "
                                            f"{furthest.blocked_detail}")
    has_constraints = any(constraints_of(c) for c in pending)
    step = STEP_CONSTRAINTS if has_constraints else STEP_COUNT
    what = ("the requests fit one by one but not together under the claim's matchAttribute constraints"
            if has_constraints else "the requests fit one by one but no node has enough free devices for all of "
                                    "them together")
    return Verdict(False, step, f"blocked by {TITLES[step]}: {what}")
