"""explain: why a pod's claims can or cannot be allocated, as a funnel per request and a verdict.

Two parts, both pure functions over a `Snapshot`:

- **the funnel**, for people: for each request (and each `firstAvailable` subrequest, in order)
  the number of devices the cluster publishes that are left after each step of the allocator:
  class selectors, request selectors, node reachability, device taints, devices already held by
  other claims (named, quarantine claims included), `count`/`allocationMode: All`, constraints
  (`matchAttribute`) and partitionable counters where slices publish them;
- **the verdict**, for the scheduler's answer: per node the pod may run on (nodeSelector,
  affinity, node taints, allocated claims' node selectors), the search that
  `k8s.io/dynamic-resource-allocation/structured` runs (reference/allocator-and-cel.md §2.5-2.9):
  all pending claims of the pod together, first fit with backtracking, selectors evaluated lazily
  in device order so that a CEL error surfaces where the scheduler's would. Allocatable on some
  node, blocked by the funnel step that removed the last candidates, or blocked by an error
  (CEL, a missing class, more than 32 devices) with its message, as the scheduler reports it.

The per-node search takes each request's devices as a combination (later slots start after the
earlier ones) rather than Go's permutations: the same answer (a set of devices either satisfies
the constraints or not), far fewer steps.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from claimwarden.objects.pods import resolve_claim_names

from . import nodes as nodesel
from .cel import CelError, DeviceInput, Evaluator, device_input
from .snapshot import Device, DeviceId, Obj, Snapshot, name_of, namespace_of, ref_of

MAX_DEVICES_PER_CLAIM = 32

# Steps, in funnel order; the verdict names one of them.
STEP_CLAIM = "claim"
STEP_CLASS = "class"
STEP_SELECTORS = "selectors"
STEP_NODES = "nodes"
STEP_TAINTS = "taints"
STEP_ALLOCATED = "allocated"
STEP_COUNT = "count"
STEP_CONSTRAINTS = "constraints"
STEP_COUNTERS = "counters"
STEP_ERROR = "error"
FUNNEL_ORDER = (STEP_CLASS, STEP_SELECTORS, STEP_NODES, STEP_TAINTS, STEP_ALLOCATED, STEP_COUNT,
                STEP_CONSTRAINTS, STEP_COUNTERS)
TITLES = {
    "devices": "published devices", STEP_CLASS: "driver and class selectors", STEP_SELECTORS: "request selectors",
    STEP_NODES: "node reachability", STEP_TAINTS: "device taints", STEP_ALLOCATED: "not allocated to others",
    STEP_COUNT: "count", STEP_CONSTRAINTS: "constraints", STEP_COUNTERS: "partitionable counters",
    STEP_CLAIM: "claim", STEP_ERROR: "error",
}


class ExplainError(Exception):
    """Bad input: the message names the fix (a missing object, …)."""


class AllocError(Exception):
    """An error that fails the scheduler's whole attempt (CEL, missing class, > 32 devices)."""

    def __init__(self, message: str, *, step: str = STEP_ERROR) -> None:
        super().__init__(message)
        self.step = step


# --- what the allocator sees ------------------------------------------------------------------

@dataclass(frozen=True)
class Req:
    """One request, or one `firstAvailable` subrequest, of one claim."""

    claim_index: int
    claim_ref: str
    request: str
    sub: str | None
    class_name: str
    selectors: tuple[str, ...]
    mode: str
    count: int
    tolerations: tuple[Obj, ...]

    @property
    def label(self) -> str:
        return f"{self.request}/{self.sub}" if self.sub else self.request

    @property
    def key(self) -> tuple[int, str, str | None]:
        return (self.claim_index, self.request, self.sub)

    @property
    def wants(self) -> str:
        return "all matching devices" if self.mode == "All" else f"exactly {self.count}"


def _req(claim_index: int, claim_ref: str, request: str, sub: str | None, body: Obj) -> Req:
    return Req(claim_index, claim_ref, request, sub, str(body.get("deviceClassName") or ""),
               tuple(str((s.get("cel") or {}).get("expression", "")) for s in body.get("selectors") or []),
               str(body.get("allocationMode") or "ExactCount"),
               int(body["count"]) if body.get("count") is not None else 1,
               tuple(body.get("tolerations") or []))


def requests_of(claim: Obj, claim_index: int) -> list[list[Req]]:
    """The claim's requests, each as its alternatives (one, or the firstAvailable subrequests)."""
    out: list[list[Req]] = []
    for request in ((claim.get("spec") or {}).get("devices") or {}).get("requests") or []:
        name = str(request.get("name", ""))
        if request.get("firstAvailable"):
            out.append([_req(claim_index, ref_of(claim), name, str(sub.get("name", "")), sub)
                        for sub in request["firstAvailable"]])
        else:
            out.append([_req(claim_index, ref_of(claim), name, None, request.get("exactly") or request)])
    return out


def constraints_of(claim: Obj) -> list[Obj]:
    return [c for c in ((claim.get("spec") or {}).get("devices") or {}).get("constraints") or []
            if c.get("matchAttribute")]


def _applies(constraint: Obj, req: Req) -> bool:
    names = constraint.get("requests") or []
    return not names or req.request in names or (req.sub is not None and req.label in names)


def _attribute(device: Device, name: str) -> tuple[str, Any] | None:
    """lookupAttribute: the exact key, else the bare id when the domain is the driver's."""
    attributes = device.body.get("attributes") or {}
    entry = attributes.get(name)
    if entry is None:
        domain, _, ident = name.partition("/")
        if ident and domain == device.driver:
            entry = attributes.get(ident)
    if not entry:
        return None
    for kind in ("int", "bool", "string", "version"):
        if entry.get(kind) is not None:
            return (kind, entry[kind])
    return None


def device_tolerates(tolerations: Iterable[Obj], taint: Obj) -> bool:
    """resourceclaim.ToleratesTaint: effect and key when set must be equal; Equal compares values."""
    for toleration in tolerations:
        if toleration.get("effect") and toleration["effect"] != taint.get("effect"):
            continue
        if toleration.get("key") and toleration["key"] != taint.get("key"):
            continue
        operator = toleration.get("operator") or "Equal"
        same_value = (toleration.get("value") or "") == (taint.get("value") or "")
        if operator == "Exists" or (operator == "Equal" and same_value):
            return True
    return False


# --- the context shared by the funnel and the search -------------------------------------------

class Context:
    """Caches over one snapshot: CEL results per (device, expression), taints per device, node lists."""

    def __init__(self, snapshot: Snapshot, evaluator: Evaluator | None = None) -> None:
        self.snapshot = snapshot
        self.evaluator = evaluator or Evaluator()
        self._inputs: dict[DeviceId, DeviceInput] = {}
        self._results: dict[tuple[DeviceId, str], bool | CelError] = {}
        self._taints: dict[DeviceId, list[Obj]] | None = None
        by_node: dict[str, list[Device]] = defaultdict(list)
        self._elsewhere: list[Device] = []
        for device in snapshot.devices:
            if device.node_name:
                by_node[device.node_name].append(device)
            else:
                self._elsewhere.append(device)
        self._by_node = by_node
        self.counters_served = any((s.get("spec") or {}).get("sharedCounters") for s in snapshot.slices)

    def input(self, device: Device) -> DeviceInput:
        cached = self._inputs.get(device.id)
        if cached is None:
            cached = device_input(device.driver, device.body,
                                  allow_multiple=bool(device.body.get("allowMultipleAllocations")))
            self._inputs[device.id] = cached
        return cached

    def matches(self, device: Device, expression: str) -> bool:
        """The selector's result on the device; CelError when it does not compile or errors."""
        key = (device.id, expression)
        cached = self._results.get(key)
        if cached is None:
            try:
                cached = self.evaluator.compile(expression).matches(self.input(device))
            except CelError as exc:
                cached = exc
            self._results[key] = cached
        if isinstance(cached, CelError):
            raise cached
        return cached

    def node_devices(self, node: Obj) -> list[Device]:
        here = list(self._by_node.get(name_of(node), []))
        if self._elsewhere:
            here += [d for d in self._elsewhere if nodesel.reaches(d.node_spec, node)]
            here.sort(key=lambda d: d.order)
        return here

    def taints(self, device: Device) -> list[Obj]:
        """The device's own taints plus those of every DeviceTaintRule that selects it."""
        if self._taints is None:
            self._taints = {}
            for rule in self.snapshot.taint_rules or []:
                spec = rule.get("spec") or {}
                taint = dict(spec.get("taint") or {}, rule=name_of(rule))
                for candidate in self._rule_devices(spec.get("deviceSelector")):
                    self._taints.setdefault(candidate.id, []).append(taint)
        own = [dict(t, rule=None) for t in device.body.get("taints") or []]
        return own + self._taints.get(device.id, [])

    def _rule_devices(self, selector: Obj | None) -> list[Device]:
        selector = selector or {}
        out = []
        for device in self.snapshot.devices:
            if any(selector.get(k) and selector[k] != v for k, v in
                   (("driver", device.driver), ("pool", device.pool), ("device", device.name))):
                continue
            try:
                if selector.get("deviceClassName"):
                    cls = self.snapshot.class_index.get(selector["deviceClassName"])
                    if cls is None or not all(self.matches(device, e) for e in _class_selectors(cls)):
                        continue
                if not all(self.matches(device, str((s.get("cel") or {}).get("expression", "")))
                           for s in selector.get("selectors") or []):
                    continue
            except CelError:
                continue  # upstream reports it on the rule and leaves the device untainted
            out.append(device)
        return out

    def untolerated(self, device: Device, req: Req) -> list[Obj]:
        # 1.34: every taint must be tolerated, whatever its effect
        return [t for t in self.taints(device) if not device_tolerates(req.tolerations, t)]


def _class_selectors(cls: Obj) -> list[str]:
    return [str((s.get("cel") or {}).get("expression", "")) for s in (cls.get("spec") or {}).get("selectors") or []]


# --- the search: what the scheduler does on one node -------------------------------------------

class Search:
    """The structured allocator's search for all pending claims of a pod on one node."""

    def __init__(self, ctx: Context, claims: list[Obj], groups: list[list[Req]], node: Obj,
                 held: set[DeviceId]) -> None:
        self.ctx = ctx
        self.claims = claims
        self.groups = groups
        self.devices = ctx.node_devices(node)
        self.in_use = set(held)
        self.chosen: list[tuple[Req, Device]] = []
        self._selectable: dict[tuple[DeviceId, tuple[int, str, str | None]], bool] = {}
        self._constraints = [constraints_of(c) for c in claims]

    def selectable(self, device: Device, req: Req) -> bool:
        key = (device.id, req.key)
        cached = self._selectable.get(key)
        if cached is None:
            cached = selectable(self.ctx, device, req)
            self._selectable[key] = cached
        return cached

    def run(self) -> bool:
        return self._group(0)

    def _group(self, index: int) -> bool:
        if index == len(self.groups):
            return True
        for alt in self.groups[index]:
            if alt.mode == "All":
                if self._all(alt, index):
                    return True
            elif self._pick(alt, alt.count, 0, index):
                return True
        return False

    def _all(self, alt: Req, index: int) -> bool:
        every = [d for d in self.devices if self.selectable(d, alt)]
        if not every:
            return False
        if len(every) > MAX_DEVICES_PER_CLAIM:
            raise AllocError(f"claim {alt.claim_ref}: number of requested devices {len(every)} exceeds the "
                             f"claim limit of {MAX_DEVICES_PER_CLAIM}", step=STEP_COUNT)
        mark = len(self.chosen)
        for device in every:
            if device.id in self.in_use or self.ctx.untolerated(device, alt) or not self._counters_ok(device):
                self._undo(mark)
                return False
            if not self._constraints_ok(device, alt):
                self._undo(mark)
                raise AllocError(f"claim {alt.claim_ref}: cannot add device {device.pool}/{device.name} because "
                                 "a claim constraint would not be satisfied", step=STEP_CONSTRAINTS)
            self._take(alt, device)
        if self._group(index + 1):
            return True
        self._undo(mark)
        return False

    def _pick(self, alt: Req, remaining: int, start: int, index: int) -> bool:
        if remaining == 0:
            return self._group(index + 1)
        for position in range(start, len(self.devices)):
            device = self.devices[position]
            if device.id in self.in_use or not self.selectable(device, alt):
                continue
            if self.ctx.untolerated(device, alt) or not self._counters_ok(device):
                continue
            if not self._constraints_ok(device, alt):
                continue
            self._take(alt, device)
            if self._pick(alt, remaining - 1, position + 1, index):
                return True
            self._undo(len(self.chosen) - 1)
        return False

    def _take(self, alt: Req, device: Device) -> None:
        self.in_use.add(device.id)
        self.chosen.append((alt, device))

    def _undo(self, mark: int) -> None:
        for _, device in self.chosen[mark:]:
            self.in_use.discard(device.id)
        del self.chosen[mark:]

    def _constraints_ok(self, device: Device, alt: Req) -> bool:
        for constraint in self._constraints[alt.claim_index]:
            if not _applies(constraint, alt):
                continue
            value = _attribute(device, constraint["matchAttribute"])
            if value is None:
                return False
            for other_req, other in self.chosen:
                if other_req.claim_index == alt.claim_index and _applies(constraint, other_req):
                    if _attribute(other, constraint["matchAttribute"]) != value:
                        return False
                    break
        return True

    def _counters_ok(self, device: Device) -> bool:
        consumes = device.body.get("consumesCounters") or []
        if not consumes or not self.ctx.counters_served:
            return True
        return counters_fit(self.ctx.snapshot, device, [d for _, d in self.chosen])


def selectable(ctx: Context, device: Device, req: Req) -> bool:
    """Class selectors, then request selectors, stopping at the first false; errors raise AllocError."""
    cls = ctx.snapshot.class_index.get(req.class_name)
    if cls is None:
        raise AllocError(f"claim {req.claim_ref}: device class {req.class_name} does not exist", step=STEP_CLASS)
    for number, expression in enumerate(_class_selectors(cls)):
        try:
            if not ctx.matches(device, expression):
                return False
        except CelError as exc:
            raise AllocError(f"class {req.class_name}: selector #{number}: {_cel_kind(exc)}", step=STEP_ERROR) from None
    for number, expression in enumerate(req.selectors):
        try:
            if not ctx.matches(device, expression):
                return False
        except CelError as exc:
            raise AllocError(f"claim {req.claim_ref}: selector #{number}: {_cel_kind(exc)}", step=STEP_ERROR) from None
    return True


def _cel_kind(exc: CelError) -> str:
    text = str(exc)
    if text.startswith("compile error: "):
        return "CEL compile error: " + text.removeprefix("compile error: ")
    return f"CEL runtime error: {text}"


def counters_fit(snapshot: Snapshot, device: Device, chosen: list[Device]) -> bool:
    """Partitionable devices: the counter sets of the device's pool, which 1.35+ may publish in other slices of
    the pool than the device's, minus what the pool's allocated and chosen devices consume."""
    from .cel import parse_quantity
    pool = (device.driver, device.pool)
    available: dict[tuple[str, str], float] = {}
    for slice_ in snapshot.pool_slices(*pool):
        for counter_set in (slice_.get("spec") or {}).get("sharedCounters") or []:
            for name, counter in (counter_set.get("counters") or {}).items():
                available[(counter_set.get("name", ""), name)] = float(parse_quantity(str(counter.get("value", "0"))))
    users = [d for d in snapshot.devices if (d.driver, d.pool) == pool and d.id in snapshot.holders]
    users += [d for d in chosen if (d.driver, d.pool) == pool]
    for user in [*users, device]:
        for consumption in user.body.get("consumesCounters") or []:
            for name, counter in (consumption.get("counters") or {}).items():
                key = (consumption.get("counterSet", ""), name)
                available[key] = available.get(key, 0.0) - float(parse_quantity(str(counter.get("value", "0"))))
    return all(value >= 0 for value in available.values())


# --- the report --------------------------------------------------------------------------------

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


def _holder_text(snapshot: Snapshot, ids: Iterable[DeviceId], exclude: str, limit: int = 4) -> str:
    claims: dict[str, list[str]] = {}
    quarantine: set[str] = set()
    for device_id in ids:
        for holder in snapshot.holders.get(device_id, []):
            if holder.ref == exclude:
                continue
            claims.setdefault(holder.ref, holder.pods)
            if holder.quarantine:
                quarantine.add(holder.ref)
    parts = []
    for ref, pods in list(claims.items())[:limit]:
        if ref in quarantine:
            parts.append(f"{ref} (quarantine claim)")
        else:
            parts.append(f"{ref} (pods {', '.join(pods)})" if pods else f"{ref} (no pod)")
    more = len(claims) - limit
    return "; ".join(parts) + (f"; and {more} more claims" if more > 0 else "")


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

    class_exprs = _class_selectors(cls)
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
    step(STEP_TAINTS, lambda d: not ctx.untolerated(d, req), lambda kept, dropped: _taints_text(ctx, dropped, req))
    own = req.claim_ref
    held_here = [d for d in left if d.id in held]
    step(STEP_ALLOCATED, lambda d: d.id not in held,
         lambda kept, dropped: ("held by " + _holder_text(snapshot, [d.id for d in dropped], own)) if dropped else "")
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
            detail += "; in the way: " + _holder_text(snapshot, [d.id for d in blockers], own)
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
                f"; {len(held_here)} more are held by " + _holder_text(snapshot, [d.id for d in held_here], own)))
    if constraints_of(claim) and any(_applies(c, req) for c in constraints_of(claim)):
        ok_nodes2 = []
        for node in fit_nodes:
            if not per_node[name_of(node)]:
                continue
            try:
                if _claim_fits(ctx, claim, req, node, held):
                    ok_nodes2.append(name_of(node))
            except AllocError:
                continue
        names = ", ".join(c["matchAttribute"] for c in constraints_of(claim) if _applies(c, req))
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


def _taints_text(ctx: Context, dropped: list[Device], req: Req) -> str:
    if not dropped:
        return ""
    taints = sorted({f"{t.get('key') or '(any key)'}" + (f"={t['value']}" if t.get("value") else "")
                     + f":{t.get('effect')}"
                     + (f" (DeviceTaintRule {t['rule']})" if t.get("rule") else "")
                     for d in dropped for t in ctx.untolerated(d, req)})
    return f"{len(dropped)} tainted without a toleration: " + ", ".join(taints[:3])


# --- explain ------------------------------------------------------------------------------------

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
        _preflight(pending, groups)
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


def _preflight(claims: list[Obj], groups: list[list[Req]]) -> None:
    for index, claim in enumerate(claims):
        total = sum(min(r.count if r.mode != "All" else 0 for r in alts) for alts in groups
                    if alts and alts[0].claim_index == index)
        if total > MAX_DEVICES_PER_CLAIM:
            raise AllocError(f"claim {ref_of(claim)}: number of requested devices {total} exceeds the claim limit "
                             f"of {MAX_DEVICES_PER_CLAIM}", step=STEP_COUNT)


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
