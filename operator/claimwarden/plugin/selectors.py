"""Selectors and CEL: which devices a request may take, as the allocator evaluates them.

A `Context` holds the caches over one snapshot that the funnel and the search share: a selector's
result per (device, expression), each node's devices, and the taints per device (taints.py).
`selectable` runs a request's class selectors, then its own, stopping at the first false as the
scheduler does, so that a CEL error surfaces where the scheduler's would: as an `AllocError` that
fails the whole attempt.
"""

from __future__ import annotations

from collections import defaultdict

from claimwarden.cel import CelError, DeviceInput, Evaluator, device_input

from . import nodes as nodesel
from .requests import STEP_CLASS, STEP_ERROR, AllocError, Req, class_selectors
from .snapshot import Device, DeviceId, Obj, Snapshot, name_of
from .taints import device_tolerates, rule_taints


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
            self._taints = rule_taints(self.snapshot, matches=self.matches)
        own = [dict(t, rule=None) for t in device.body.get("taints") or []]
        return own + self._taints.get(device.id, [])

    def untolerated(self, device: Device, req: Req) -> list[Obj]:
        # 1.34: every taint must be tolerated, whatever its effect
        return [t for t in self.taints(device) if not device_tolerates(req.tolerations, t)]


def selectable(ctx: Context, device: Device, req: Req) -> bool:
    """Class selectors, then request selectors, stopping at the first false; errors raise AllocError."""
    cls = ctx.snapshot.class_index.get(req.class_name)
    if cls is None:
        raise AllocError(f"claim {req.claim_ref}: device class {req.class_name} does not exist", step=STEP_CLASS)
    for number, expression in enumerate(class_selectors(cls)):
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
