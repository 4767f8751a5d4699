"""The search: what the scheduler does on one node for all pending claims of a pod.

`k8s.io/dynamic-resource-allocation/structured` (reference/allocator-and-cel.md §2.5-2.9) takes the
requests in order, first fit with backtracking, selectors evaluated lazily in device order. The search
here takes each request's devices as a combination (later slots start after the earlier ones) rather
than Go's permutations: the same answer (a set of devices either satisfies the constraints or not),
far fewer steps.
"""

from __future__ import annotations

from .constraints import constraints_hold, constraints_of, counters_fit
from .requests import MAX_DEVICES_PER_CLAIM, STEP_CONSTRAINTS, STEP_COUNT, AllocError, Req
from .selectors import Context, selectable
from .snapshot import Device, DeviceId, Obj, ref_of


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
        return constraints_hold(self._constraints[alt.claim_index], device, alt, self.chosen)

    def _counters_ok(self, device: Device) -> bool:
        consumes = device.body.get("consumesCounters") or []
        if not consumes or not self.ctx.counters_served:
            return True
        return counters_fit(self.ctx.snapshot, device, [d for _, d in self.chosen])


def preflight(claims: list[Obj], groups: list[list[Req]]) -> None:
    for index, claim in enumerate(claims):
        total = sum(min(r.count if r.mode != "All" else 0 for r in alts) for alts in groups
                    if alts and alts[0].claim_index == index)
        if total > MAX_DEVICES_PER_CLAIM:
            raise AllocError(f"claim {ref_of(claim)}: number of requested devices {total} exceeds the claim limit "
                             f"of {MAX_DEVICES_PER_CLAIM}", step=STEP_COUNT)
