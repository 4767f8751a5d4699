"""What the allocator sees of a claim: its requests as alternatives, and the steps that can block them.

A claim's request is one `Req`, or, with `firstAvailable`, one `Req` per subrequest, tried in order:
`requests_of` returns each request as that list of alternatives. The step names (`STEP_*`) are the
funnel's rows in the order the allocator applies them (`FUNNEL_ORDER`); a verdict names the step that
removed the last candidates, and an `AllocError` names the step of an error that fails the scheduler's
whole attempt (CEL, a missing class, more than 32 devices).
"""

from __future__ import annotations

from dataclasses import dataclass

from .snapshot import Obj, ref_of

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


class AllocError(Exception):
    """An error that fails the scheduler's whole attempt (CEL, missing class, > 32 devices)."""

    def __init__(self, message: str, *, step: str = STEP_ERROR) -> None:
        super().__init__(message)
        self.step = step


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


def class_selectors(cls: Obj) -> list[str]:
    """A DeviceClass's CEL selector expressions, in order."""
    return [str((s.get("cel") or {}).get("expression", "")) for s in (cls.get("spec") or {}).get("selectors") or []]
