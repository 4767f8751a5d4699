"""When a rule fires, and when its mark recovers: the per-rule half of ``decide`` (pure).

A *fire* is one rule of the device's policy that fired since the history's floor: ``find_fire`` counts its
matching Unhealthy observations in bursts (within ``threshold.burst`` of a burst's first one they count once)
and fires once ``threshold.count`` bursts fall within one ``threshold.window``. Each source then says on its
own terms whether the mark recovered (``with_recovery``: a driver taint removed, a PodStatus healthy hold
run out; an alert resolving or a node condition going away proves nothing), and the fleet says whether it
is the workload's fault (``with_workload``). ``strongest`` orders fires as ``decide`` does: Enforce before
Shadow, then the strongest effect, then the rule's order. The words of a decision's ``why`` are made here
too, one sentence per fire. The module docstring of ``decide`` tells the whole story.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from claimwarden.health.records import format_duration
from claimwarden.signals.observations import HEALTHY, SOURCE_POD, SOURCE_TAINT, UNHEALTHY, Observation, format_at
from claimwarden.signals.policy import EFFECT_NONE, MODE_ENFORCE, STRENGTH, Rule

WHY_MAX = 1024
"""The longest `why` kept (spec.reason and status.decision.why), in characters."""

Fleet = Callable[[str, str, str, datetime], int]
"""(source, signal, value, since) -> how many different devices have an Unhealthy observation of that
source, signal and value at or after `since` (the device being decided included)."""


@dataclass(frozen=True)
class Fire:
    """A rule that fired since the floor (or holds the mark from the history alone)."""

    rule: Rule
    index: int                  # the rule's place in the policy
    at: datetime | None         # the first observation of the burst that reached the count; None: history only
    bursts: int                 # bursts counted in the firing window
    value: str                  # the value of the observation that fired it
    last_fault: datetime | None  # the newest matching Unhealthy observation
    recovered_at: datetime | None = None
    recheck_at: datetime | None = None
    workload_devices: int = 0   # > 0: a workload fault, seen on that many devices

    @property
    def marks(self) -> bool:
        return self.rule.effect != EFFECT_NONE and not self.workload_devices


def burst_starts(times: Sequence[datetime], burst: timedelta) -> list[datetime]:
    """The first moment of every burst: an observation less than `burst` after its burst's first joins it."""
    starts: list[datetime] = []
    for at in times:
        if not starts or at - starts[-1] >= burst:
            starts.append(at)
    return starts


def find_fire(rule: Rule, index: int, considered: Sequence[Observation]) -> Fire | None:
    """The rule's fire among `considered` (after the floor): the earliest burst that completes
    ``threshold.count`` bursts within one ``threshold.window``; None when it did not fire."""
    faults = [o for o in considered if o.state == UNHEALTHY and rule.matches(o)]
    if not faults:
        return None
    starts = burst_starts([o.at for o in faults], rule.threshold.burst)
    count = rule.threshold.count
    for last in range(count - 1, len(starts)):
        if starts[last] - starts[last - count + 1] < rule.threshold.window:
            at = starts[last]
            value = next(o.value for o in faults if o.at == at)
            return Fire(rule, index, at, count, value, faults[-1].at)
    return None


def with_recovery(fire: Fire, considered: Sequence[Observation], marked_since: datetime | None,
              hold: timedelta, now: datetime) -> Fire:
    """The fire with when it recovered (or when to look again); unchanged when it has not."""
    rule = fire.rule
    after = fire.last_fault or fire.at or marked_since
    later = [o for o in considered if o.source == rule.source and o.signal == rule.signal
             and (after is None or o.at > after)]
    if rule.source == SOURCE_TAINT:
        # The taint key is gone (whatever its value was): the driver says the device is well again.
        removed = next((o.at for o in later if o.state == HEALTHY), None)
        return replace(fire, recovered_at=removed) if removed is not None and removed <= now else fire
    if rule.source == SOURCE_POD:
        healthy_since: datetime | None = None
        for o in later:
            # Unknown (the signal was lost) or Unhealthy again: the hold starts over
            healthy_since = (healthy_since or o.at) if o.state == HEALTHY else None
        if healthy_since is None:
            return fire
        ends = healthy_since + hold
        return replace(fire, recovered_at=ends) if ends <= now else replace(fire, recheck_at=ends)
    # Alertmanager and NodeCondition: an alert resolving or a condition going away proves nothing.
    return fire


def with_workload(fire: Fire, fleet: Fleet) -> Fire:
    fault = fire.rule.workload_fault
    if fault is None or fire.at is None:
        return fire
    devices = fleet(fire.rule.source, fire.rule.signal, fire.value, fire.at - fault.window)
    return replace(fire, workload_devices=devices) if devices >= fault.devices else fire


def strongest(fires: Iterable[Fire]) -> Fire | None:
    """The deciding fire: Enforce first (a Shadow rule never weakens what an enforced one does), then the
    strongest effect, then the rule's order."""
    return min(fires, key=lambda f: (f.rule.mode != MODE_ENFORCE, -STRENGTH[f.rule.effect], f.index), default=None)


def shadow_note(fires: Iterable[Fire], best: Fire) -> str:
    """The strongest Shadow rule that asks for more than the deciding rule does, in words ("" for none)."""
    stronger = strongest(f for f in fires if f.rule.mode != MODE_ENFORCE
                          and STRENGTH[f.rule.effect] > STRENGTH[best.rule.effect])
    return f"; Shadow rule {stronger.rule.name} would {stronger.rule.effect}" if stronger is not None else ""


def stronger(a: str, b: str) -> str:
    return a if STRENGTH[a] >= STRENGTH[b] else b


# --- words ---------------------------------------------------------------------------------------

def at_words(moment: datetime | None) -> str:
    return format_at(moment) if moment is not None else "-"


def describe(fire: Fire) -> str:
    rule = fire.rule
    what = f"{rule.source} {rule.signal}" + (f"={fire.value}" if fire.value else "")
    if fire.at is None:
        return f"rule {rule.name} holds the mark it made earlier ({what})"
    threshold = rule.threshold
    counted = (f"{fire.bursts} bursts within {format_duration(threshold.window)}" if threshold.count > 1
               else "1 observation")
    return f"rule {rule.name}: {what} at {at_words(fire.at)}, {counted}"


def bounded_why(text: str) -> str:
    return text if len(text) <= WHY_MAX else text[:WHY_MAX - 1] + "…"


def workload_words(fire: Fire) -> str:
    fault = fire.rule.workload_fault
    assert fault is not None
    return (f"{describe(fire)}; seen on {fire.workload_devices} devices within "
            f"{format_duration(fault.window)}: a workload fault, not the hardware's, nothing is marked")


def recovered_words(fire: Fire) -> str:
    how = {SOURCE_TAINT: f"the driver removed taint {fire.rule.signal}",
           SOURCE_POD: "only Healthy was reported for the healthy hold"}.get(fire.rule.source, "recovered")
    return f"{describe(fire)}; recovered at {at_words(fire.recovered_at)}: {how}"
