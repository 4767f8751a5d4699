"""The funnel: for each request (and each `firstAvailable` subrequest, in order), how many of the
devices the cluster publishes are left after each step of the allocator.

The steps, in order (requests.FUNNEL_ORDER): class selectors, request selectors (selectors.py),
node reachability, device taints, devices already held by other claims (named, quarantine claims
included; taints.py), `count`/`allocationMode: All` per node, constraints (`matchAttribute`) and
partitionable counters where slices publish them (constraints.py). The first step that leaves none
is where the request is blocked, with its detail in words.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from claimwarden.cel import CelError

from . import nodes as nodesel
from .constraints import applies, constraints_of, counters_fit
from .requests import (
    STEP_ALLOCATED,
    STEP_CLASS,
    STEP_CONSTRAINTS,
    STEP_COUNT,
    STEP_COUNTERS,
    STEP_NODES,
    STEP_SELECTORS,
    STEP_TAINTS,
    TITLES,
    AllocError,
    Req,
    class_selectors,
    requests_of,
)
from .search import Search
from .selectors import Context, selectable
from .snapshot import Device, DeviceId, Obj, name_of
from .taints import holder_text, taints_text


@dataclass
class Row:
    step: str
    left: int
    detail: str = ""

    @property
    def title(self) -> str:
        return TITLES.get(self.step, self.step)


@dataclass
class Funnel:
    req: Req
    rows: list[Row] = field(default_factory=list)
    blocked_at: str | None = None
    blocked_detail: str = ""


def funnel(ctx: Context, req: Req, claim: Obj, fit_nodes: list[Obj], held: set[DeviceId]) -> Funnel:
    """The candidate funnel of one request or subrequest over every device the cluster publishes."""
    snapshot = ctx.snapshot
    result = Funnel(req)
    left = list(snapshot.devices)
    result.rows.append(Row("devices", len(left)))

    def step(name: str, keep: Callable[[Device], bool], detail: Callable[[list[Device], list[Device]], str]) -> None:
        nonlocal left
        if not left:
            result.rows.append(Row(name, 0))
            return
        kept: list[Device] = []
        dropped: list[Device] = []
        for device in left:
            (kept if keep(device) else dropped).append(device)
        result.rows.append(Row(name, len(kept), detail(kept, dropped)))
        if not kept and result.blocked_at is None:
            result.blocked_at = name
            result.blocked_detail = detail(kept, dropped)
        left = kept

    cls = snapshot.class_index.get(req.class_name)
    if cls is None:
        result.rows.append(Row(STEP_CLASS, 0, f"device class {req.class_name!r} does not exist"))
        result.blocked_at, result.blocked_detail = STEP_CLASS, f"device class {req.class_name!r} does not exist"
        return result
    errors: dict[str, str] = {}

    def passes(device: Device, expressions: Iterable[str]) -> bool:
        for expression in expressions:
            try:
                if not ctx.matches(device, expression):
                    return False
            except CelError as exc:
                errors.setdefault(expression, str(exc))
                return False
        return True

    class_exprs = class_selectors(cls)
    step(STEP_CLASS, lambda d: passes(d, class_exprs),
         lambda kept, dropped: f"class {req.class_name}: " + (" && ".join(class_exprs) or "(no selectors)")
         + _errors_text(errors, class_exprs)
         + ("" if kept else "; no published device is of this class: is its DRA driver running and publishing "
                            "ResourceSlices?"))
    step(STEP_SELECTORS, lambda d: passes(d, req.selectors),
         lambda kept, dropped: (" && ".join(req.selectors) or "(none)") + _errors_text(errors, req.selectors)
         + _models(kept, "left"))
    fit_names = {name_of(n) for n in fit_nodes}
    reach_cache: dict[DeviceId, bool] = {}

    def reachable(device: Device) -> bool:
        if device.id not in reach_cache:
            if device.node_name:
                reach_cache[device.id] = device.node_name in fit_names
            else:
                reach_cache[device.id] = any(nodesel.reaches(device.node_spec, n) for n in fit_nodes)
        return reach_cache[device.id]

    step(STEP_NODES, reachable, lambda kept, dropped: _nodes_text(kept, dropped, fit_names))
    step(STEP_TAINTS, lambda d: not ctx.untolerated(d, req),
         lambda kept, dropped: taints_text(dropped, untolerated=lambda d: ctx.untolerated(d, req)))
    own = req.claim_ref
    held_here = [d for d in left if d.id in held]
    step(STEP_ALLOCATED, lambda d: d.id not in held,
         lambda kept, dropped: ("held by " + holder_text(snapshot, [d.id for d in dropped], own)) if dropped else "")
    # count / All: per node
    left_ids = {d.id for d in left}
    per_node: dict[str, list[Device]] = {
        name_of(node): [d for d in ctx.node_devices(node) if d.id in left_ids] for node in fit_nodes}

    def on_nodes(names: Iterable[str]) -> set[DeviceId]:
        return {d.id for n in names for d in per_node[n]}

    if req.mode == "All":
        ok_nodes: list[str] = []
        blockers: list[Device] = []
        for node in fit_nodes:
            try:
                every = [d for d in ctx.node_devices(node) if selectable(ctx, d, req)]
            except AllocError:
                continue
            here = {d.id for d in per_node[name_of(node)]}
            if every and all(d.id in here for d in every):
                ok_nodes.append(name_of(node))
            else:
                blockers += [d for d in every if d.id not in here]
        detail = (f"allocationMode All: every matching device of a node must be free and tolerated; "
                  f"fits on {len(ok_nodes)} node(s)")
        if any(d.id in held for d in blockers):
            detail += "; in the way: " + holder_text(snapshot, [d.id for d in blockers], own)
        keep_all = on_nodes(ok_nodes)
        step(STEP_COUNT, lambda d: d.id in keep_all, lambda kept, dropped: detail)
    else:
        ok = [n for n, devices in per_node.items() if len(devices) >= req.count]
        best = max((len(v) for v in per_node.values()), default=0)
        keep_count = on_nodes(ok)
        step(STEP_COUNT, lambda d: d.id in keep_count,
             lambda kept, dropped: f"needs {req.count} on one node; fits on {len(ok)} node(s)"
             + ("" if ok else f" (at most {best} left on any node)")
             + ("" if ok or not held_here else
                f"; {len(held_here)} more are held by " + holder_text(snapshot, [d.id for d in held_here], own)))
    if constraints_of(claim) and any(applies(c, req) for c in constraints_of(claim)):
        ok_nodes2 = []
        for node in fit_nodes:
            if not per_node[name_of(node)]:
                continue
            try:
                if _claim_fits(ctx, claim, req, node, held):
                    ok_nodes2.append(name_of(node))
            except AllocError:
                continue
        names = ", ".join(c["matchAttribute"] for c in constraints_of(claim) if applies(c, req))
        keep_constrained = on_nodes(ok_nodes2)
        step(STEP_CONSTRAINTS, lambda d: d.id in keep_constrained,
             lambda kept, dropped: f"matchAttribute {names}: the claim's requests fit together on "
                                   f"{len(ok_nodes2)} node(s)")
    if ctx.counters_served:
        step(STEP_COUNTERS, lambda d: counters_fit(snapshot, d, []), lambda kept, dropped: "shared counters per slice")
    return result


def _claim_fits(ctx: Context, claim: Obj, req: Req, node: Obj, held: set[DeviceId]) -> bool:
    """The claim's requests with `req` standing for its own request, together on the node."""
    groups = [[r for r in alts if r.key == req.key] or alts for alts in requests_of(claim, req.claim_index)]
    claims: list[Obj] = [{}] * req.claim_index + [claim]
    return Search(ctx, claims, groups, node, held).run()


def _errors_text(errors: dict[str, str], expressions: Iterable[str]) -> str:
    found = [f"error in {e!r}: {errors[e]}" for e in expressions if e in errors]
    return ("; " + "; ".join(found)) if found else ""


def _models(devices: list[Device], word: str) -> str:
    counts: dict[str, int] = defaultdict(int)
    for device in devices:
        counts[device.model or "?"] += 1
    return f" ({word}: " + ", ".join(f"{n} {m}" for m, n in sorted(counts.items())) + ")" if counts else ""


def _nodes_text(kept: list[Device], dropped: list[Device], fit_names: set[str]) -> str:
    nodes = sorted({d.node_name or "*" for d in kept})
    shown = ", ".join(nodes[:5]) + (f" and {len(nodes) - 5} more" if len(nodes) > 5 else "")
    return f"on {len(nodes)} node(s) the pod may use: {shown}" if nodes else (
        f"none of the {len(dropped)} devices is on a node the pod may use ({len(fit_names)} such nodes)")

