"""Replaying a trace of observations through ``decide``, as the controller would, with no cluster (pure).

A trace is a list of (time, device, event), an event being an Observation or a person's verified clear.
``replay`` keeps each device's record as the cluster would (its merged observations, its history, its
verified-at annotation) in a ``DeviceState``, routes the device and decides after every event. The state
can be carried from one replay to the next, through JSON even, to show that a restart decides the same.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from claimwarden.health.records import DeviceRef
from claimwarden.signals.decide import Decision, History, decide
from claimwarden.signals.fires import Fleet
from claimwarden.signals.observations import UNHEALTHY, Observation, merge
from claimwarden.signals.policy import Policy, Router


@dataclass(frozen=True)
class Verified:
    """A trace event: a person's `kubectl claimwarden clear --verified` of the device at the event's time."""


@dataclass
class DeviceState:
    """What one device's record holds between events (in the cluster: its status and annotation)."""

    observations: list[Observation] = field(default_factory=list)
    history: History = field(default_factory=History)
    verified_at: datetime | None = None


TraceEvent = tuple[datetime, DeviceRef, "Observation | Verified"]


def fleet_of(state: Mapping[DeviceRef, DeviceState]) -> Fleet:
    """A Fleet over the devices of a replay (or any map of device states)."""
    def fleet(source: str, signal: str, value: str, since: datetime) -> int:
        return sum(1 for device in state.values() if any(
            o.source == source and o.signal == signal and o.value == value and o.state == UNHEALTHY
            and o.at >= since for o in device.observations))
    return fleet


def replay(trace: Iterable[TraceEvent], policies: Router | Iterable[Policy], *,
           devices: Mapping[DeviceRef, Mapping[str, Any]] | None = None,
           state: dict[DeviceRef, DeviceState] | None = None) -> list[tuple[datetime, DeviceRef, Decision]]:
    """Decide after every event of a trace, as the controller would; pure.

    `policies`: a Router, or policies to route with (no DeviceClasses). `devices`: the slice entries
    routing sees (a bare {"name": device} when absent). `state`: carried from an earlier replay (it is
    updated in place), e.g. through JSON to simulate a restart.
    """
    router = policies if isinstance(policies, Router) else Router(policies, {})
    state = {} if state is None else state
    fleet = fleet_of(state)
    decisions: list[tuple[datetime, DeviceRef, Decision]] = []
    for at, ref, event in trace:
        device = state.setdefault(ref, DeviceState())
        if isinstance(event, Verified):
            device.verified_at = at
        else:
            device.observations, _ = merge(device.observations, [event])
        entry = (devices or {}).get(ref) or {"name": ref.device}
        policy = router.route(ref.driver, ref.pool, entry)
        decision = decide(policy, device.observations, device.history, fleet, at, verified_at=device.verified_at)
        device.history = decision.history
        decisions.append((at, ref, decision))
    return decisions
