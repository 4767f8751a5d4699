"""decide and replay (issue 21): thresholds, shadow, workload faults, recovery, escalation, determinism."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from claimwarden.health.records import DeviceRef
from claimwarden.signals import observations as obs
from claimwarden.signals.decide import (
    CLEARS_MAX,
    Decision,
    History,
    decide,
    decision_to_json,
    history_from_json,
    history_to_json,
)
from claimwarden.signals.observations import Observation
from claimwarden.signals.policy import Policy, Recovery, Router, Rule, Threshold, WorkloadFault
from claimwarden.signals.replay import DeviceState, TraceEvent, Verified, replay

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
XID = "gpu.nvidia.com/xid"
REF = DeviceRef("gpu.nvidia.com", "node-1", "gpu-0")


def minutes(n: float) -> datetime:
    return T0 + timedelta(minutes=n)


def taint(at: datetime, value: str = "79") -> Observation:
    return Observation(obs.SOURCE_TAINT, XID, value, obs.UNHEALTHY, at, f"{XID}={value}@{obs.format_at(at)}")


def removed(at: datetime) -> Observation:
    return Observation(obs.SOURCE_TAINT, XID, "", obs.HEALTHY, at, f"{XID} removed@{obs.format_at(at)}")


def pod(at: datetime, health: str, key: str = "uid-1/main/gpu.nvidia.com/node-1/gpu-0") -> Observation:
    return Observation(obs.SOURCE_POD, "allocatedResourcesStatus", health, health, at, key)


def alert(at: datetime, value: str = "79", fingerprint: str = "f1") -> Observation:
    return Observation(obs.SOURCE_ALERT, "GPUXidError", value, obs.UNHEALTHY, at,
                       f"{fingerprint}@{obs.format_at(at)}")


def condition(at: datetime, status: str = "True") -> Observation:
    return Observation(obs.SOURCE_NODE, "GpuFailure", status, obs.UNHEALTHY, at, f"node-1/GpuFailure@{at}")


def rule(name: str = "xid", source: str = obs.SOURCE_TAINT, signal: str = XID, effect: str = "NoExecute",
         mode: str = "Enforce", values: Sequence[str] = (), count: int = 1, window: float = 10, burst: float = 0,
         workload: WorkloadFault | None = None, drain: str | None = None) -> Rule:
    return Rule(name, source, signal, tuple(values), effect, mode,
                Threshold(count, timedelta(minutes=window), timedelta(minutes=burst)), workload, drain)


def policy(*rules: Rule, hold: float = 5, refault: float = 60, escalate_to: str = "NoExecute") -> Policy:
    return Policy("p", rules=rules or (rule(),),
                  recovery=Recovery(timedelta(minutes=hold), timedelta(minutes=refault), escalate_to))


def no_fleet(source: str, signal: str, value: str, since: datetime) -> int:
    return 1


def run(p: Policy | None, observations: Sequence[Observation], now: datetime, history: History | None = None,
        **kwargs: Any) -> Decision:
    return decide(p, sorted(observations, key=lambda o: o.at), history or History(), kwargs.pop("fleet", no_fleet),
                  now, **kwargs)


# --- firing --------------------------------------------------------------------------------------

def test_no_policy_marks_nothing() -> None:
    decision = run(None, [taint(T0)], T0)
    assert (decision.effect, decision.policy, decision.rule, decision.mode) == ("None", None, None, "")
    assert "no HealthPolicy" in decision.why


def test_one_fatal_taint_marks_with_the_rules_effect() -> None:
    decision = run(policy(rule(drain="AllowCompletion")), [taint(T0)], minutes(1))
    assert (decision.effect, decision.would, decision.rule, decision.mode) == ("NoExecute", "NoExecute", "xid",
                                                                               "Enforce")
    assert decision.drain == "AllowCompletion"
    assert decision.history == History(marked_since=minutes(1), rule="xid", held_effect="NoExecute")
    assert "rule xid" in decision.why and "79" in decision.why


def test_values_filter_the_observations() -> None:
    p = policy(rule(values=("48", "79")))
    assert run(p, [taint(T0, "13")], T0).effect == "None"
    assert run(p, [taint(T0, "48")], T0).effect == "NoExecute"


def test_shadow_does_nothing_but_says_what_it_would_do() -> None:
    decision = run(policy(rule(mode="Shadow")), [taint(T0)], T0)
    assert (decision.effect, decision.would, decision.mode, decision.rule) == ("None", "NoExecute", "Shadow", "xid")
    assert "would NoExecute" in decision.why


def test_thresholds_count_bursts_once() -> None:
    p = policy(rule(count=3, window=10, burst=1))
    one_burst = [taint(minutes(0), "79"), taint(minutes(0.5), "48"), taint(minutes(0.9), "94")]
    assert run(p, one_burst, minutes(1)).effect == "None"
    # a burst ends `burst` after its first observation: 1 minute later is a new one
    two = [*one_burst, taint(minutes(1), "95")]
    assert run(p, two, minutes(2)).effect == "None"
    three = [*two, taint(minutes(4), "48")]
    decision = run(p, three, minutes(5))
    assert decision.effect == "NoExecute"
    assert "3 bursts within 10m" in decision.why


def test_without_a_burst_every_observation_counts() -> None:
    p = policy(rule(count=2, window=10))
    assert run(p, [taint(T0, "79"), taint(T0, "48")], T0).effect == "NoExecute"


def test_the_window_edges() -> None:
    p = policy(rule(count=2, window=10))
    # the last less than `window` after the first: exactly 10 minutes apart is two windows
    assert run(p, [taint(minutes(0)), taint(minutes(10), "48")], minutes(10)).effect == "None"
    assert run(p, [taint(minutes(0)), taint(minutes(9.99), "48")], minutes(10)).effect == "NoExecute"
    # any window since the floor counts, also one that ended long ago (seen late, after a restart)
    assert run(p, [taint(minutes(0)), taint(minutes(5), "48")], minutes(300)).effect == "NoExecute"


def test_a_taint_present_before_claimwarden_started_marks() -> None:
    assert run(policy(), [taint(T0 - timedelta(days=2))], T0).effect == "NoExecute"


def test_observations_at_or_before_the_boundary_never_count() -> None:
    p = policy()
    assert run(p, [taint(T0)], minutes(5), History(boundary=T0)).effect == "None"
    assert run(p, [taint(T0), taint(minutes(1), "48")], minutes(5), History(boundary=T0)).effect == "NoExecute"


def test_the_strongest_enforced_rule_decides() -> None:
    p = policy(rule("schedule", effect="NoSchedule"), rule("alerts", obs.SOURCE_ALERT, "GPUXidError"),
               rule("shadow-pod", obs.SOURCE_POD, "allocatedResourcesStatus", mode="Shadow"))
    assert run(p, [taint(T0)], T0).effect == "NoSchedule"
    decision = run(p, [taint(T0), alert(minutes(1))], minutes(1))
    assert (decision.effect, decision.rule) == ("NoExecute", "alerts")


def test_a_shadow_rule_never_weakens_an_enforced_one() -> None:
    p = policy(rule("try-evict", mode="Shadow"), rule("schedule", effect="NoSchedule"))
    decision = run(p, [taint(T0)], T0)
    assert (decision.effect, decision.would, decision.rule, decision.mode) == ("NoSchedule", "NoSchedule",
                                                                               "schedule", "Enforce")
    assert "Shadow rule try-evict would NoExecute" in decision.why


def test_the_rule_order_breaks_ties() -> None:
    p = policy(rule("first"), rule("second"))
    assert run(p, [taint(T0)], T0).rule == "first"


def test_an_effect_none_rule_observes_and_never_marks() -> None:
    decision = run(policy(rule(effect="None")), [taint(T0)], T0)
    assert (decision.effect, decision.rule, decision.history) == ("None", "xid", History())
    assert "observed only" in decision.why


def test_a_workload_fault_marks_nothing() -> None:
    asked: list[tuple[str, str, str, datetime]] = []

    def fleet(source: str, signal: str, value: str, since: datetime) -> int:
        asked.append((source, signal, value, since))
        return 3

    p = policy(rule(workload=WorkloadFault(3, timedelta(minutes=10))))
    decision = run(p, [taint(minutes(20))], minutes(21), fleet=fleet)
    assert asked == [(obs.SOURCE_TAINT, XID, "79", minutes(10))]
    assert (decision.effect, decision.would, decision.workload_fault, decision.rule) == ("None", "None", True, "xid")
    assert decision.history == History()
    assert "workload fault" in decision.why
    # two devices are not enough
    decision = run(p, [taint(minutes(20))], minutes(21), fleet=lambda *_: 2)
    assert (decision.effect, decision.workload_fault) == ("NoExecute", False)


# --- recovery ------------------------------------------------------------------------------------

def test_a_taint_mark_recovers_when_the_driver_removes_the_taint() -> None:
    p = policy()
    marked = run(p, [taint(T0)], T0)
    assert marked.effect == "NoExecute"
    decision = run(p, [taint(T0), removed(minutes(3))], minutes(4), marked.history)
    assert (decision.effect, decision.recovered, decision.rule) == ("None", True, None)
    assert decision.history == History(clears=(minutes(3),))
    assert "the driver removed taint gpu.nvidia.com/xid" in decision.why
    # the recovered fault does not mark again; a new one after the clear does
    assert run(p, [taint(T0), removed(minutes(3))], minutes(90), decision.history).effect == "None"
    again = run(p, [taint(T0), removed(minutes(3)), taint(minutes(90), "48")], minutes(90), decision.history)
    assert again.effect == "NoExecute"


def test_a_removal_older_than_the_newest_fault_does_not_recover() -> None:
    p = policy()
    seen = [taint(T0), removed(minutes(1)), taint(minutes(2), "48")]
    marked = run(p, seen[:1], T0)
    assert run(p, seen, minutes(3), marked.history).effect == "NoExecute"


def test_a_pod_status_mark_recovers_after_the_healthy_hold() -> None:
    p = policy(rule("pod", obs.SOURCE_POD, "allocatedResourcesStatus", values=("Unhealthy",)), hold=5)
    marked = run(p, [pod(T0, obs.UNHEALTHY)], T0)
    assert marked.effect == "NoExecute"
    seen = [pod(T0, obs.UNHEALTHY), pod(minutes(1), obs.HEALTHY)]
    waiting = run(p, seen, minutes(3), marked.history)
    assert (waiting.effect, waiting.recovered, waiting.recheck_at) == ("NoExecute", False, minutes(6))
    done = run(p, seen, minutes(6), marked.history)
    assert (done.effect, done.recovered, done.history.clears) == ("None", True, (minutes(6),))


def test_unknown_restarts_the_healthy_hold() -> None:
    p = policy(rule("pod", obs.SOURCE_POD, "allocatedResourcesStatus", values=("Unhealthy",)), hold=5)
    marked = run(p, [pod(T0, obs.UNHEALTHY)], T0)
    seen = [pod(T0, obs.UNHEALTHY), pod(minutes(1), obs.HEALTHY), pod(minutes(3), obs.UNKNOWN),
            pod(minutes(4), obs.HEALTHY)]
    assert run(p, seen, minutes(8), marked.history).effect == "NoExecute"
    assert run(p, seen, minutes(9), marked.history).recovered


def test_unknown_ends_a_healthy_hold_whatever_the_rules_values() -> None:
    """The shipped rules list values ["Unhealthy"]; the hold still reads every PodStatus observation the
    controller passes: after Unknown (the signal lost) nothing recovers until Healthy again for the hold."""
    p = policy(rule("pod", obs.SOURCE_POD, "allocatedResourcesStatus", values=("Unhealthy",),
                    effect="NoSchedule"), hold=5)
    marked = run(p, [pod(T0, obs.UNHEALTHY)], T0)
    seen = [pod(T0, obs.UNHEALTHY), pod(minutes(1), obs.HEALTHY), pod(minutes(3), obs.UNKNOWN)]
    lost = run(p, seen, minutes(20), marked.history)
    assert (lost.effect, lost.recovered, lost.recheck_at) == ("NoSchedule", False, None)
    seen.append(pod(minutes(21), obs.HEALTHY))
    waiting = run(p, seen, minutes(22), marked.history)
    assert (waiting.effect, waiting.recheck_at) == ("NoSchedule", minutes(26))
    assert run(p, seen, minutes(26), marked.history).recovered


def test_unknown_alone_never_marks() -> None:
    p = policy(rule("pod", obs.SOURCE_POD, "allocatedResourcesStatus"))
    assert run(p, [pod(T0, obs.UNKNOWN)], T0).effect == "None"


def test_a_resolved_alert_is_not_recovery() -> None:
    p = policy(rule("alerts", obs.SOURCE_ALERT, "GPUXidError"))
    marked = run(p, [alert(T0)], T0)
    assert marked.effect == "NoExecute"
    # the alert resolved (nothing is recorded for that), the exporter went quiet: a day later it holds
    later = run(p, [alert(T0)], T0 + timedelta(days=1), marked.history)
    assert (later.effect, later.recovered) == ("NoExecute", False)
    # a taint removal or a healthy pod is no word on the alert's fault either
    seen = [alert(T0), removed(minutes(5)), pod(minutes(5), obs.HEALTHY)]
    assert run(p, seen, T0 + timedelta(days=1), marked.history).effect == "NoExecute"


def test_a_node_condition_mark_never_recovers_by_itself() -> None:
    p = policy(rule("node", obs.SOURCE_NODE, "GpuFailure", values=("True",), effect="NoSchedule"))
    assert run(p, [condition(T0, "False")], T0).effect == "None"
    marked = run(p, [condition(T0)], T0)
    assert marked.effect == "NoSchedule"
    held = run(p, [condition(T0), condition(minutes(5), "False")], minutes(600), marked.history)
    assert (held.effect, held.recovered) == ("NoSchedule", False)


def test_a_verified_clear_recovers_and_sets_the_boundary() -> None:
    p = policy(rule("alerts", obs.SOURCE_ALERT, "GPUXidError"))
    marked = run(p, [alert(T0)], T0)
    cleared = run(p, [alert(T0)], minutes(10), marked.history, verified_at=minutes(9))
    assert (cleared.effect, cleared.recovered) == ("None", True)
    assert cleared.history == History(boundary=minutes(9))
    assert "verified healthy at 2026-12-01T12:09:00Z" in cleared.why
    # deciding again with the same annotation changes nothing
    assert run(p, [alert(T0)], minutes(11), cleared.history, verified_at=minutes(9)).history == cleared.history
    # an alert re-sent with the old startsAt does not re-mark; a new fault does
    assert run(p, [alert(T0), alert(T0, fingerprint="f2")], minutes(12), cleared.history).effect == "None"
    assert run(p, [alert(T0), alert(minutes(12))], minutes(12), cleared.history).effect == "NoExecute"


def test_a_verified_clear_in_the_future_is_ignored() -> None:
    p = policy(rule("alerts", obs.SOURCE_ALERT, "GPUXidError"))
    marked = run(p, [alert(T0)], T0)
    decision = run(p, [alert(T0)], minutes(10), marked.history, verified_at=minutes(60))
    assert (decision.effect, decision.recovered, decision.history.boundary) == ("NoExecute", False, None)


# --- escalation ----------------------------------------------------------------------------------

def test_a_refault_within_the_window_escalates_and_holds() -> None:
    p = policy(rule(effect="NoSchedule"), refault=60)
    seen = [taint(T0)]
    history = run(p, seen, T0).history
    seen.append(removed(minutes(5)))
    recovered = run(p, seen, minutes(5), history)
    assert recovered.recovered
    seen.append(taint(minutes(30), "48"))
    escalated = run(p, seen, minutes(30), recovered.history)
    assert (escalated.effect, escalated.would, escalated.escalated) == ("NoExecute", "NoExecute", True)
    assert escalated.history.escalated
    assert "25m after the automatic recovery at 2026-12-01T12:05:00Z: escalated" in escalated.why
    seen.append(removed(minutes(35)))
    held = run(p, seen, minutes(35), escalated.history)
    assert (held.effect, held.recovered, held.escalated) == ("NoExecute", False, True)
    verified = run(p, seen, minutes(40), held.history, verified_at=minutes(40))
    assert (verified.effect, verified.recovered, verified.escalated) == ("None", True, False)
    assert verified.history.escalated is False
    # the clears before the person's verification do not escalate a later fault
    seen.append(taint(minutes(45), "94"))
    after = run(p, seen, minutes(45), verified.history)
    assert (after.effect, after.escalated) == ("NoSchedule", False)


def test_a_refault_after_the_window_does_not_escalate() -> None:
    p = policy(refault=60)
    seen = [taint(T0), removed(minutes(5))]
    recovered = run(p, seen, minutes(5), run(p, seen[:1], T0).history)
    later = run(p, [*seen, taint(minutes(66), "48")], minutes(66), recovered.history)
    assert (later.effect, later.escalated) == ("NoExecute", False)


def test_escalate_to_no_schedule_keeps_a_stronger_rule_effect() -> None:
    p = policy(refault=60, escalate_to="NoSchedule")
    seen = [taint(T0), removed(minutes(5)), taint(minutes(6), "48")]
    recovered = run(p, seen[:2], minutes(5), run(p, seen[:1], T0).history)
    assert run(p, seen, minutes(6), recovered.history).effect == "NoExecute"


def test_a_shadow_mark_escalates_only_in_words() -> None:
    p = policy(rule(mode="Shadow", effect="NoSchedule"))
    seen = [taint(T0), removed(minutes(5)), taint(minutes(10), "48")]
    recovered = run(p, seen[:2], minutes(5), run(p, seen[:1], T0).history)
    decision = run(p, seen, minutes(10), recovered.history)
    assert (decision.effect, decision.would, decision.escalated) == ("None", "NoExecute", False)
    assert "Shadow: would escalate" in decision.why


def test_a_shadow_marks_recovery_does_not_escalate_an_enforced_rule() -> None:
    """Review finding: a Shadow PodStatus mark's recovery was a clear for every rule, so an Enforce
    NoSchedule taint rule firing soon after became NoExecute."""
    p = policy(rule("pod", obs.SOURCE_POD, "allocatedResourcesStatus", values=("Unhealthy",), mode="Shadow"),
               rule("xid", effect="NoSchedule"), hold=5)
    seen = [pod(T0, obs.UNHEALTHY), pod(minutes(1), obs.HEALTHY)]
    shadowed = run(p, seen[:1], T0)
    assert (shadowed.effect, shadowed.would, shadowed.rule) == ("None", "NoExecute", "pod")
    recovered = run(p, seen, minutes(7), shadowed.history)
    assert recovered.recovered and recovered.history.clears == ()
    assert recovered.history.shadow_clears == (minutes(6),)
    seen.append(taint(minutes(10)))
    decision = run(p, seen, minutes(10), recovered.history)
    assert (decision.effect, decision.escalated, decision.rule) == ("NoSchedule", False, "xid")
    assert not decision.history.escalated


def test_a_shadow_marks_recovery_is_no_floor_for_an_enforced_rule() -> None:
    """An Enforce rule counts the observations before a Shadow mark's recovery (2 taints in 10m: one before)."""
    p = policy(rule("pod", obs.SOURCE_POD, "allocatedResourcesStatus", values=("Unhealthy",), mode="Shadow"),
               rule("xid", count=2, effect="NoSchedule"), hold=1)
    seen = [pod(T0, obs.UNHEALTHY), taint(minutes(0.5)), pod(minutes(1), obs.HEALTHY)]
    recovered = run(p, seen, minutes(3), run(p, seen[:2], minutes(0.5)).history)
    assert recovered.history.shadow_clears == (minutes(2),)
    seen.append(taint(minutes(4), "48"))
    assert run(p, seen, minutes(4), recovered.history).effect == "NoSchedule"


def test_shadow_clears_still_floor_and_escalate_shadow_rules_in_words() -> None:
    p = policy(rule("pod", obs.SOURCE_POD, "allocatedResourcesStatus", values=("Unhealthy",), mode="Shadow",
                    effect="NoSchedule"), hold=1)
    seen = [pod(T0, obs.UNHEALTHY), pod(minutes(1), obs.HEALTHY)]
    recovered = run(p, seen, minutes(3), run(p, seen[:1], T0).history)
    assert run(p, seen, minutes(4), recovered.history).rule is None  # its own clear is its floor
    seen.append(pod(minutes(5), obs.UNHEALTHY))
    again = run(p, seen, minutes(5), recovered.history)
    assert (again.effect, again.would, again.escalated, again.history.escalated) == ("None", "NoExecute", False, False)
    assert "Shadow: would escalate" in again.why


def test_a_fault_that_fired_and_recovered_between_two_decisions_counts_as_a_recovery() -> None:
    p = policy()
    decision = run(p, [taint(T0), removed(minutes(1))], minutes(2))
    assert (decision.effect, decision.recovered, decision.history.clears) == ("None", True, (minutes(1),))
    assert "fired and recovered between two decisions" in decision.why
    # and so the next fault within the window escalates
    seen = [taint(T0), removed(minutes(1)), taint(minutes(3), "48"), removed(minutes(4))]
    assert run(p, seen, minutes(5), decision.history).escalated


def test_a_recovery_under_a_lasting_shadow_mark_still_counts_for_escalation() -> None:
    """An enforced taint rule beside a Shadow alert rule (the alert never recovers by itself): each time the
    taint recovers it is a clear, so the device flapping under the standing alert escalates."""
    p = policy(rule("xid", effect="NoSchedule"), rule("alerts", obs.SOURCE_ALERT, "GPUXidError", mode="Shadow"))
    seen = [taint(T0), alert(T0)]
    marked = run(p, seen, T0)
    assert (marked.effect, marked.rule) == ("NoSchedule", "xid")
    seen.append(removed(minutes(5)))
    handed = run(p, seen, minutes(5), marked.history)
    assert (handed.effect, handed.would, handed.rule, handed.recovered) == ("None", "NoExecute", "alerts", True)
    assert handed.history.clears == (minutes(5),)
    seen.append(taint(minutes(10), "48"))
    again = run(p, seen, minutes(10), handed.history)
    assert (again.effect, again.rule, again.escalated) == ("NoExecute", "xid", True)


def test_a_mark_holds_when_its_observations_fell_off_the_record() -> None:
    p = policy(rule("alerts", obs.SOURCE_ALERT, "GPUXidError"),
               rule("pod", obs.SOURCE_POD, "allocatedResourcesStatus", values=("Unhealthy",), mode="Shadow"))
    marked = run(p, [alert(T0)], T0)
    churn = [pod(minutes(i), obs.HEALTHY if i % 2 else obs.UNKNOWN, key=f"p{i}") for i in range(1, 40)]
    kept = obs.merge([alert(T0)], churn)[0]
    assert alert(T0) not in kept
    decision = run(p, kept, minutes(41), marked.history)
    assert (decision.effect, decision.rule) == ("NoExecute", "alerts")
    assert "holds the mark it made earlier" in decision.why


def test_a_mark_whose_rule_left_the_policy_holds_until_a_verified_clear() -> None:
    """Review finding: a policy edit (the holding rule renamed or removed) lifted the mark with no healthy signal."""
    marked = run(policy(rule("old", effect="NoSchedule")), [taint(T0)], T0)
    other = policy(rule("alerts", obs.SOURCE_ALERT, "GPUXidError"))
    held = run(other, [taint(T0)], minutes(1), marked.history)
    assert (held.effect, held.rule, held.mode, held.recovered, held.orphaned) == (
        "NoSchedule", "old", "Enforce", False, True)
    assert held.history == marked.history
    assert "the policy/rule that made this mark is gone; the mark holds (NoSchedule) until a verified clear" in held.why
    assert history_from_json(json.loads(json.dumps(history_to_json(held.history)))) == held.history
    cleared = run(other, [taint(T0)], minutes(2), held.history, verified_at=minutes(2))
    assert (cleared.effect, cleared.recovered, cleared.orphaned, cleared.history.marked_since) == (
        "None", True, False, None)


def test_a_mark_holds_when_no_policy_applies_any_more() -> None:
    """A policy deleted, its DeviceClass gone or its CEL failing: routing gives None; the mark holds."""
    marked = run(policy(), [taint(T0)], T0)
    held = run(None, [taint(T0)], minutes(1), marked.history)
    assert (held.effect, held.policy, held.rule, held.orphaned) == ("NoExecute", None, "xid", True)
    assert "no HealthPolicy applies" in held.why
    assert run(None, [taint(T0)], minutes(2), held.history, verified_at=minutes(2)).effect == "None"


def test_an_escalated_mark_whose_rule_left_holds_its_escalated_effect() -> None:
    p = policy(rule("old", effect="NoSchedule"))
    seen = [taint(T0), removed(minutes(1)), taint(minutes(3), "48")]
    escalated = run(p, seen, minutes(3), run(p, seen[:2], minutes(1), run(p, seen[:1], T0).history).history)
    assert (escalated.effect, escalated.escalated) == ("NoExecute", True)
    held = run(policy(rule("alerts", obs.SOURCE_ALERT, "GPUXidError")), seen, minutes(4), escalated.history)
    assert (held.effect, held.escalated, held.rule, held.orphaned) == ("NoExecute", True, "old", True)


def test_a_renamed_rule_that_marks_as_strongly_takes_the_mark_over() -> None:
    marked = run(policy(rule("old", effect="NoSchedule")), [taint(T0)], T0)
    renamed = policy(rule("new", effect="NoSchedule"))
    taken = run(renamed, [taint(T0)], minutes(1), marked.history)
    assert (taken.effect, taken.rule, taken.orphaned) == ("NoSchedule", "new", False)
    assert taken.history.marked_since == T0 and "takes over the mark of rule old" in taken.why
    # and its own recovery ends the mark
    assert run(renamed, [taint(T0), removed(minutes(2))], minutes(2), taken.history).recovered
    # a weaker rule does not take a NoExecute mark over
    strong = run(policy(rule("old")), [taint(T0)], T0)
    weaker = run(renamed, [taint(T0)], minutes(1), strong.history)
    assert (weaker.effect, weaker.rule, weaker.orphaned) == ("NoExecute", "old", True)


def test_an_orphaned_shadow_mark_holds_nothing() -> None:
    marked = run(policy(rule("old", mode="Shadow")), [taint(T0)], T0)
    assert marked.history.held_effect == "None"
    decision = run(policy(rule("alerts", obs.SOURCE_ALERT, "GPUXidError")), [taint(T0)], minutes(1), marked.history)
    assert (decision.effect, decision.orphaned, decision.history.marked_since) == ("None", False, None)


def test_flapping_every_five_minutes_for_an_hour_is_released_once_then_held() -> None:
    """Issue 21's target: fault and recover every 5 minutes for an hour -> at most one un-quarantine."""
    p = policy(rule(effect="NoSchedule"))
    seen: list[Observation] = []
    history = History()
    effects: list[str] = []
    recoveries = 0
    for step in range(12):
        fault = minutes(step * 5)
        seen.append(taint(fault, str(step)))
        decision = run(p, seen, fault, history)
        history = decision.history
        effects.append(decision.effect)
        healthy = fault + timedelta(minutes=2, seconds=30)
        seen.append(removed(healthy))
        decision = run(p, seen, healthy, history)
        history = decision.history
        recoveries += decision.recovered
        effects.append(decision.effect)
    assert recoveries == 1
    assert effects[:3] == ["NoSchedule", "None", "NoExecute"]
    assert set(effects[3:]) == {"NoExecute"}
    assert history.escalated and history.clears == (minutes(2.5),)


def test_pod_health_flapping_every_five_minutes_is_released_at_most_once() -> None:
    """The same target through KEP-4680 pod health: with a short hold it recovers once, then escalates;
    with the default 5-minute hold the device never stays Healthy long enough to be released."""
    for hold, releases in ((1, 1), (5, 0)):
        p = policy(rule("pod", obs.SOURCE_POD, "allocatedResourcesStatus", values=("Unhealthy",),
                        effect="NoSchedule"), hold=hold)
        events = [pod(minutes(step * 5 + offset), health) for step in range(12)
                  for offset, health in ((0.0, obs.UNHEALTHY), (2.5, obs.HEALTHY))]
        history = History()
        recoveries = 0
        for number, event in enumerate(events):
            decision = run(p, events[:number + 1], event.at, history)
            history = decision.history
            recoveries += decision.recovered
            following = events[number + 1].at if number + 1 < len(events) else minutes(60)  # the hour ends
            if decision.recheck_at is not None and decision.recheck_at < following:
                # the controller looks again when the hold ends, if nothing came before
                decision = run(p, events[:number + 1], decision.recheck_at, history)
                history = decision.history
                recoveries += decision.recovered
        assert recoveries == releases, hold
        assert decision.effect == ("NoExecute" if releases else "NoSchedule")


# --- JSON ----------------------------------------------------------------------------------------

def test_history_json_round_trips() -> None:
    history = History(boundary=T0, clears=(minutes(1), minutes(2)), escalated=True, marked_since=minutes(3),
                      rule="xid", held_effect="NoExecute", shadow_clears=(minutes(0.5),))
    body = history_to_json(history)
    assert body == {"boundary": "2026-12-01T12:00:00Z", "clears": ["2026-12-01T12:01:00Z", "2026-12-01T12:02:00Z"],
                    "shadowClears": ["2026-12-01T12:00:30Z"], "escalated": True,
                    "markedSince": "2026-12-01T12:03:00Z", "rule": "xid", "effect": "NoExecute"}
    assert history_from_json(json.loads(json.dumps(body))) == history
    assert history_to_json(History()) == {"clears": [], "escalated": False}
    assert history_from_json(history_to_json(History())) == History()


def test_a_malformed_history_reads_as_what_is_well_formed() -> None:
    assert history_from_json("x") == History()
    assert history_from_json({"clears": ["bad", "2026-12-01T12:00:00Z"], "escalated": "yes",
                              "rule": "xid"}) == History(clears=(T0,))
    many = {"clears": [obs.format_at(minutes(i)) for i in range(40)]}
    assert history_from_json(many).clears == tuple(minutes(i) for i in range(40 - CLEARS_MAX, 40))


def test_decision_json() -> None:
    decision = run(policy(rule(mode="Shadow")), [taint(T0)], T0)
    assert decision_to_json(decision, T0) == {
        "policy": "p", "rule": "xid", "mode": "Shadow", "effect": "None", "would": "NoExecute",
        "why": decision.why, "at": "2026-12-01T12:00:00Z", "escalated": False, "workloadFault": False}
    assert "rule" not in decision_to_json(run(None, [], T0), T0)
    assert "at" not in decision_to_json(decision)


def test_why_is_bounded() -> None:
    p = policy(rule(signal="k" * 2000, values=()))
    o = Observation(obs.SOURCE_TAINT, "k" * 2000, "v" * 2000, obs.UNHEALTHY, T0, "key")
    assert len(run(p, [o], T0).why) <= 1024


# --- replay --------------------------------------------------------------------------------------

DEVICES = [DeviceRef("gpu.nvidia.com", f"node-{n}", f"gpu-{g}") for n in range(3) for g in range(4)]
XID_RULE = rule("xid", values=("48", "79", "94"), effect="NoSchedule", count=2, window=240, burst=1)
ROUTER = Router([
    Policy("nvidia", drivers=("gpu.nvidia.com",), rules=(
        XID_RULE,
        rule("pod", obs.SOURCE_POD, "allocatedResourcesStatus", values=("Unhealthy",), effect="NoExecute"),
        rule("alerts", obs.SOURCE_ALERT, "GPUXidError", mode="Shadow",
             workload=WorkloadFault(3, timedelta(minutes=10)))), recovery=Recovery(timedelta(minutes=5))),
    Policy("taints-only", priority=1, pools=("node-2",), rules=(XID_RULE,),
           recovery=Recovery(refault_window=timedelta(hours=6)))], {})


def trace() -> list[TraceEvent]:
    """A day of made-up but varied signals on 12 devices, the same every time (no randomness)."""
    events: list[TraceEvent] = []
    for step in range(24 * 12):
        at = T0 + timedelta(minutes=5 * step)
        ref = DEVICES[(step * 7) % len(DEVICES)]
        kind = (step * 5 + step // 12) % 7
        if kind in (0, 6):
            events.append((at, ref, taint(at, ("48", "79", "13", "94")[step % 4])))
        elif kind == 1:
            events.append((at, ref, removed(at)))
        elif kind in (2, 3):
            health = (obs.UNHEALTHY, obs.HEALTHY, obs.UNKNOWN)[step % 3]
            events.append((at, ref, pod(at, health, key=f"pod-{step // 30}/main/{ref}")))
        elif kind == 4:
            events.append((at, ref, alert(at, "79", fingerprint=f"f{step % 5}")))
        elif kind == 5 and step % 11 == 0:
            events.append((at, ref, Verified()))
        else:
            events.append((at, ref, pod(at, obs.HEALTHY, key=f"pod-{step // 30}/main/{ref}")))
    return events


def _round_trip(state: dict[DeviceRef, DeviceState]) -> dict[DeviceRef, DeviceState]:
    """The state as it would be read back from the records after a restart (JSON through the API)."""
    text = json.dumps({f"{ref.driver}|{ref.pool}|{ref.device}": {
        "observations": [obs.to_json(o) for o in device.observations],
        "recovery": history_to_json(device.history),
        "verifiedAt": obs.format_at(device.verified_at) if device.verified_at else None}
        for ref, device in state.items()})
    restored: dict[DeviceRef, DeviceState] = {}
    for name, body in json.loads(text).items():
        verified = body["verifiedAt"]
        restored[DeviceRef(*name.split("|"))] = DeviceState(
            obs.observations_from_json(body["observations"]), history_from_json(body["recovery"]),
            history_from_json({"boundary": verified}).boundary if verified else None)
    return restored


def test_replay_is_deterministic_across_runs_and_restarts() -> None:
    events = trace()
    first = replay(events, ROUTER)
    assert first == replay(events, ROUTER.policies)
    effects = {d.effect for _, _, d in first}
    assert {"NoExecute", "NoSchedule", "None"} <= effects, effects
    assert any(d.recovered for _, _, d in first) and any(d.escalated for _, _, d in first)
    assert any(d.rule == "alerts" for _, _, d in first)
    # a restart half way: the second half from the state read back from JSON
    half = len(events) // 2
    state: dict[DeviceRef, DeviceState] = {}
    before = replay(events[:half], ROUTER, state=state)
    after = replay(events[half:], ROUTER, state=_round_trip(state))
    assert before + after == first
