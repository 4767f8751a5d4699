"""From a device's observations and history to its mark: the one pure decision of issue 21.

``decide`` reads the device's observations (its record's status.observations), what the record
remembers (``History``, status.recovery) and the policy routed to the device, and says what the
record's effect is, which rule decided it and why. It reads no clock and draws no random numbers:
the same inputs give the same Decision, so replaying a recorded trace (``replay``) gives the same
decisions across runs and across restarts (the state carried through the record's JSON).

**Firing.** A rule counts its matching Unhealthy observations after the history's floor (the last
verified clear and the last automatic recovery of an Enforce mark; for a Shadow rule, of any mark):
observations within ``threshold.burst`` of a burst's first one count once (the same after less than
``burst``), and the rule fires once ``threshold.count`` bursts fall within one ``threshold.window`` (the
last less than ``window`` after the first). Any window since the floor counts, not only the one ending
now: a driver taint that was already there when claimwarden started, or a burst seen only after a
restart, still fires. Once fired, a rule holds its mark until the mark recovers, however old the burst
gets.

**Several rules.** Enforce before Shadow (a Shadow rule being tried never weakens what an enforced rule
does; the decision's ``why`` names a stronger Shadow rule), then the strongest effect (NoExecute >
NoSchedule > None), then the rule's order in the policy. A Shadow rule decides effect None and records
in ``would`` what it would have done; its mark goes through the same recovery, so a rule's shadow
history shows what enforcing it would have done. A Shadow mark's recovery is kept apart
(``History.shadow_clears``): it is a floor for Shadow rules only and escalates nothing that is enforced;
a Shadow rule re-faulting within ``refaultWindow`` of a recovery says it would escalate (``would``,
``why``) but holds nothing more. A rule with effect None observes only: it never marks.

**Workload faults.** A rule with ``workloadFault`` asks the fleet how many different devices saw
the same signal and value within its window; at ``devices`` or more it is the workload's fault,
not the hardware's: no mark (an Event and a metric, by the controller).

**Recovery** is verified, never inferred (docs/concepts/health-from-signals.md, "Resolved is not recovery"). A mark
held by a DriverTaint rule recovers when the driver removed that taint key after the newest fault; by a PodStatus
rule, when only Healthy was reported for ``recovery.healthyHold`` after the newest Unhealthy (Unknown restarts the
hold: the signal was lost); an Alertmanager or NodeCondition mark never recovers by itself: an alert resolving is not
recovery (a crashed exporter also resolves its alerts). A person's verified clear (``verified_at``) always recovers
and becomes the history's boundary: no observation at or before it counts again. An Enforce rule's fault that fires
within ``recovery.refaultWindow`` of the last automatic recovery of an Enforce mark escalates: the effect becomes at
least ``recovery.escalateTo``, and only a verified clear ends the mark. A device that flaps every 5 minutes is thus
released once, then held.

**Orphaned marks.** Routing changing proves nothing about the device: when the policy or the rule that
made the current mark is gone (a policy edited or deleted, its DeviceClass deleted, a CEL error, another
policy routed), the mark keeps its last effect (``History.held_effect``, status.recovery.effect) and
``Decision.orphaned`` is set, until a verified clear; an Enforce rule of the policy now routed that marks
at least as strongly takes the mark over (and its own recovery then ends it). A Shadow mark holds nothing.

**What the controller must pass.** All observations of the device that the record keeps, including the
Healthy and Unknown PodStatus observations of a device whose mark a PodStatus rule holds, whatever that
rule's ``values``: the healthy hold restarts on Unknown and on Unhealthy, and ends only on Healthy.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from claimwarden.health.records import format_duration
from claimwarden.signals.fires import (
    Fire,
    Fleet,
    at_words,
    bounded_why,
    describe,
    find_fire,
    recovered_words,
    shadow_note,
    stronger,
    strongest,
    with_recovery,
    with_workload,
    workload_words,
)
from claimwarden.signals.observations import Observation, format_at
from claimwarden.signals.policy import EFFECT_NONE, MODE_ENFORCE, STRENGTH, Policy, Rule
from claimwarden.timestamps import parse_rfc3339

CLEARS_MAX = 16
"""Automatic recoveries kept in the history (the newest)."""


@dataclass(frozen=True)
class History:
    """What a record remembers beyond its observations (status.recovery)."""

    boundary: datetime | None = None       # a person's verified clear: observations at or before never count
    clears: tuple[datetime, ...] = ()      # Enforce marks' automatic recoveries, oldest first (the last CLEARS_MAX)
    shadow_clears: tuple[datetime, ...] = ()  # Shadow marks' automatic recoveries: only Shadow rules read them
    escalated: bool = False
    marked_since: datetime | None = None   # when the current mark began; None: not marked
    rule: str | None = None                # the rule holding the current mark
    held_effect: str | None = None         # the current mark's effect (JSON "effect"): held when its rule is gone


@dataclass(frozen=True)
class Decision:
    effect: str            # the record's spec.effect: NoExecute | NoSchedule | None
    would: str             # what the deciding rule asks (== effect unless Shadow or a workload fault)
    policy: str | None
    rule: str | None
    mode: str              # Enforce | Shadow ("" when no rule)
    why: str               # one sentence: spec.reason and status.decision.why
    escalated: bool
    recovered: bool        # this decision ended a mark (automatically or by a verified clear)
    workload_fault: bool
    drain: str | None      # the deciding rule's drain (None: the record's default)
    history: History       # what to store next
    recheck_at: datetime | None = None
    """When the decision may change with no new observation (a PodStatus healthy hold ending): decide again then."""
    scope: str | None = None
    """The deciding rule's scope (None: the record's default, health/siblings.py)."""
    orphaned: bool = False
    """The policy or rule that made the current mark is gone (policy edited or deleted, another policy
    routed, a CEL error, no policy at all): the mark holds its last effect until a verified clear."""


# --- JSON (status.recovery, status.decision) ----------------------------------------------------

def history_to_json(history: History) -> dict[str, Any]:
    body: dict[str, Any] = {"clears": [format_at(at) for at in history.clears], "escalated": history.escalated}
    if history.shadow_clears:
        body["shadowClears"] = [format_at(at) for at in history.shadow_clears]
    if history.boundary is not None:
        body["boundary"] = format_at(history.boundary)
    if history.marked_since is not None:
        body["markedSince"] = format_at(history.marked_since)
    if history.rule is not None:
        body["rule"] = history.rule
    if history.held_effect is not None:
        body["effect"] = history.held_effect
    return body


def history_from_json(body: object) -> History:
    """The history stored in status.recovery; what is malformed is left out (an empty history for none)."""
    if not isinstance(body, Mapping):
        return History()
    rule, effect = body.get("rule"), body.get("effect")
    marked_since = parse_rfc3339(body.get("markedSince"))
    return History(boundary=parse_rfc3339(body.get("boundary")), clears=_times(body.get("clears")),
                   shadow_clears=_times(body.get("shadowClears")),
                   escalated=body.get("escalated") is True, marked_since=marked_since,
                   rule=rule if isinstance(rule, str) and rule and marked_since is not None else None,
                   held_effect=effect if effect in STRENGTH and marked_since is not None else None)


def _times(entries: object) -> tuple[datetime, ...]:
    parsed = sorted(at for at in (parse_rfc3339(c) for c in (entries if isinstance(entries, list) else []))
                    if at is not None)
    return tuple(parsed[-CLEARS_MAX:])


def decision_to_json(decision: Decision, at: datetime | None = None) -> dict[str, Any]:
    """status.decision. `at`: when this decision was first made (keep the stored one while the rest is
    unchanged, so that deciding again writes nothing); left out when None."""
    body: dict[str, Any] = {"mode": decision.mode, "effect": decision.effect, "would": decision.would,
                            "why": decision.why, "escalated": decision.escalated,
                            "workloadFault": decision.workload_fault}
    if at is not None:
        body["at"] = format_at(at)
    if decision.policy is not None:
        body["policy"] = decision.policy
    if decision.rule is not None:
        body["rule"] = decision.rule
    return body

# --- the decision ---------------------------------------------------------------------------------

def decide(policy: Policy | None, observations: Sequence[Observation], history: History,
           fleet: Fleet, now: datetime, *, verified_at: datetime | None = None) -> Decision:
    """The device's mark: see the module docstring. `verified_at`: the record's claimwarden.io/verified-at
    (a person's `kubectl claimwarden clear --verified`); one in the future is ignored."""
    recovered = False
    verified_note = ""
    if (verified_at is not None and verified_at <= now
            and (history.boundary is None or verified_at > history.boundary)):
        recovered = history.marked_since is not None
        verified_note = f"verified healthy at {at_words(verified_at)}; "
        history = replace(history, boundary=verified_at, escalated=False, marked_since=None, rule=None,
                          held_effect=None)
    if history.marked_since is not None and (policy is None or policy.rule(history.rule) is None):
        orphan = _orphaned(policy, observations, history, fleet, now)
        if orphan is not None:
            return orphan
        history = replace(history, marked_since=None, rule=None, held_effect=None)
    if policy is None:
        return Decision(effect=EFFECT_NONE, would=EFFECT_NONE, policy=None, rule=None, mode="",
                        why=bounded_why(verified_note + "no HealthPolicy applies to this device: its observations are "
                                 "kept, nothing is marked"),
                        escalated=False, recovered=recovered, workload_fault=False, drain=None, history=history)

    # Only an Enforce mark's recovery is a floor for Enforce rules: a Shadow rule being tried must not
    # change what enforced rules do. Shadow rules start after either (their own "would" history).
    considered = _after(observations, _latest(history.boundary, *history.clears))
    shadow_considered = _after(considered, _latest(*history.shadow_clears))

    def seen(rule: Rule) -> list[Observation]:
        return considered if rule.mode == MODE_ENFORCE else shadow_considered

    fires = [f for f in (find_fire(rule, i, seen(rule)) for i, rule in enumerate(policy.rules)) if f is not None]
    held = policy.rule(history.rule) if history.marked_since is not None else None
    if held is not None and all(f.rule.name != held.name for f in fires):
        # Its observations fell off the record (only the newest are kept): the history still knows.
        fires.append(Fire(held, policy.rules.index(held), None, 0, "", None))
    fires = [with_recovery(with_workload(f, fleet), seen(f.rule), history.marked_since, policy.recovery.healthy_hold,
                           now)
             for f in fires]
    recheck = min((f.recheck_at for f in fires if f.recheck_at is not None), default=None)

    def decision(fire: Fire | None, history: History, why: str, *, escalated: bool = False,
                 recovered: bool = recovered, workload: bool = False) -> Decision:
        assert policy is not None
        if fire is None:
            history = replace(history, marked_since=None, rule=None, held_effect=None)
            return Decision(effect=EFFECT_NONE, would=EFFECT_NONE, policy=policy.name, rule=None, mode="",
                            why=bounded_why(verified_note + why), escalated=False, recovered=recovered,
                            workload_fault=False, drain=None, history=history, recheck_at=recheck)
        rule = fire.rule
        would = stronger(rule.effect, policy.recovery.escalate_to) if escalated else rule.effect
        effect = would if rule.mode == MODE_ENFORCE and not workload else EFFECT_NONE
        if workload:
            would = EFFECT_NONE
        history = replace(history, held_effect=effect if history.marked_since is not None else None)
        # Decision.escalated: the effect escalated; a Shadow rule's escalation is only in `would` and words.
        return Decision(effect=effect, would=would, policy=policy.name, rule=rule.name, mode=rule.mode,
                        why=bounded_why(verified_note + why), escalated=escalated and rule.mode == MODE_ENFORCE,
                        recovered=recovered,
                        workload_fault=workload, drain=rule.drain, history=history, recheck_at=recheck,
                        scope=rule.scope)

    def mode_words(fire: Fire, effect: str) -> str:
        return f"{effect}" if fire.rule.mode == MODE_ENFORCE else f"Shadow: would {effect}, does nothing"

    marking = [f for f in fires if f.marks]
    if history.marked_since is not None and not history.escalated:
        held_fire = next((f for f in marking if f.rule.name == history.rule), None)
        if held_fire is not None and held_fire.recovered_at is not None:
            # The mark ends where the rule that made it recovered: a clear, from which a re-fault
            # escalates. A rule that fired meanwhile and has not recovered starts a mark of its own
            # (and keeps it through the history, its observations being older than the clear).
            history = _cleared(history, held_fire)
            words = recovered_words(held_fire)
            rest = strongest(f for f in marking if f is not held_fire and f.recovered_at is None)
            if rest is None:
                return decision(None, history, words, recovered=True)
            history = replace(history, marked_since=now, rule=rest.rule.name)
            return decision(rest, history, f"{words}; {describe(rest)}; {mode_words(rest, rest.rule.effect)}",
                            recovered=True)

    def refault(fires: Iterable[Fire], clears: Iterable[datetime]) -> tuple[Fire, datetime] | None:
        """The strongest of `fires` that fired within refaultWindow after the last of `clears` (after the boundary)."""
        assert policy is not None
        last = _latest(*clears)
        if last is None or (history.boundary is not None and last <= history.boundary):
            return None
        window = policy.recovery.refault_window
        found = strongest(f for f in fires if f.at is not None and last < f.at <= last + window)
        return (found, last) if found is not None else None

    def refault_words(found: tuple[Fire, datetime], what: str) -> str:
        fire, last = found
        assert fire.at is not None
        return (f"{describe(fire)}, {format_duration(fire.at - last)} after the automatic recovery at "
                f"{at_words(last)}: {what}; ")

    escalation = ""
    if not history.escalated:
        # Only an Enforce rule's re-fault after an Enforce mark's recovery escalates the mark.
        enforced = refault((f for f in marking if f.rule.mode == MODE_ENFORCE), history.clears)
        if enforced is not None:
            history = replace(history, escalated=True)
            escalation = refault_words(enforced, "escalated, only a verified clear ends it")
    if history.escalated:
        holding = [f for f in fires if f.rule.effect != EFFECT_NONE]  # recovery and workload no longer count
    else:
        holding = [f for f in marking if f.recovered_at is None]
    best = strongest(holding)
    if best is not None:
        history = replace(history, marked_since=history.marked_since or now, rule=best.rule.name)
        escalated = history.escalated
        if best.rule.mode != MODE_ENFORCE and not escalated:
            # A Shadow mark re-faulting after a recovery says it would escalate; it holds nothing.
            shadow = refault([best], (*history.clears, *history.shadow_clears))
            if shadow is not None:
                escalated = True
                escalation = refault_words(shadow, "Shadow: would escalate")
        effect = stronger(best.rule.effect, policy.recovery.escalate_to) if escalated else best.rule.effect
        earlier = "escalated earlier, only a verified clear ends it; " if history.escalated and not escalation else ""
        return decision(best, history, f"{escalation}{earlier}{describe(best)}; {mode_words(best, effect)}"
                        f"{shadow_note(holding, best)}", escalated=escalated)

    workload = strongest(f for f in fires if f.workload_devices)
    if history.marked_since is not None:
        # Its rule fires no more as a mark (now seen on enough devices to be the workload's fault).
        history = replace(history, marked_since=None, rule=None)
    elif marking:
        # Fired and recovered between two decisions (both seen at once, after a restart say): still a clear
        # (an Enforce one's if any fired: Shadow recoveries never floor Enforce rules).
        last = max(marking, key=lambda f: (f.rule.mode == MODE_ENFORCE, f.recovered_at or now))
        assert last.recovered_at is not None
        history = _cleared(history, last)
        return decision(None, history, f"fired and recovered between two decisions: {recovered_words(last)}",
                        recovered=True)
    if workload is not None:
        return decision(workload, history, workload_words(workload), workload=True)
    observing = strongest(fires)
    if observing is not None:
        return decision(observing, history, f"{describe(observing)}; effect None: observed only")
    return decision(None, history, f"no rule of policy {policy.name} fired "
                    f"({len(considered)} observations since the last clear)")


def _cleared(history: History, fire: Fire) -> History:
    """The history once `fire`'s mark recovered: an Enforce rule's recovery is a clear, a Shadow rule's a
    shadow clear (read by Shadow rules only)."""
    at = fire.recovered_at
    assert at is not None
    if fire.rule.mode == MODE_ENFORCE:
        history = replace(history, clears=(*history.clears, at)[-CLEARS_MAX:])
    else:
        history = replace(history, shadow_clears=(*history.shadow_clears, at)[-CLEARS_MAX:])
    return replace(history, marked_since=None, rule=None, held_effect=None)


def _orphaned(policy: Policy | None, observations: Sequence[Observation], history: History, fleet: Fleet,
              now: datetime) -> Decision | None:
    """The decision for a mark whose policy or rule is gone (None: nothing to hold, decide as usual).

    Routing changing (a policy edited or deleted, a DeviceClass gone, a CEL error) is no sign that the
    device is well: the mark keeps its last effect until a verified clear. An Enforce rule of the policy
    that applies now and marks at least as strongly takes the mark over (its own recovery then ends it).
    """
    held = history.held_effect
    if held is None:  # a record written before the effect was kept
        held = (policy.recovery.escalate_to if policy else "NoExecute") if history.escalated else EFFECT_NONE
    if held == EFFECT_NONE:
        return None  # a Shadow mark: nothing is held
    if policy is not None:
        fresh = decide(policy, observations, replace(history, marked_since=None, rule=None, held_effect=None),
                       fleet, now)
        if (fresh.history.marked_since is not None and fresh.mode == MODE_ENFORCE
                and STRENGTH[fresh.effect] >= STRENGTH[held]):
            return replace(fresh, why=bounded_why(f"{fresh.why} (takes over the mark of rule {history.rule})"),
                           history=replace(fresh.history, marked_since=history.marked_since))
    where = f"policy {policy.name} has no rule {history.rule}" if policy else "no HealthPolicy applies to this device"
    return Decision(effect=held, would=held, policy=policy.name if policy else None, rule=history.rule,
                    mode=MODE_ENFORCE,
                    why=bounded_why(f"{where}: the policy/rule that made this mark is gone; the mark "
                                    f"holds ({held}) until a verified clear"),
                    escalated=history.escalated, recovered=False, workload_fault=False, drain=None,
                    history=replace(history, held_effect=held), orphaned=True)


def _latest(*moments: datetime | None) -> datetime | None:
    return max((at for at in moments if at is not None), default=None)


def _after(observations: Iterable[Observation], floor: datetime | None) -> list[Observation]:
    """The observations later than `floor` (all for None), by (at, key)."""
    return sorted((o for o in observations if floor is None or o.at > floor), key=lambda o: (o.at, o.key))
