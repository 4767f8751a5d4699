"""decide and replay (issue 21): thresholds, shadow, workload faults, recovery, escalation, determinism."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from claimwarden.health.records import DeviceRef
from claimwarden.signals import observations as obs
from claimwarden.signals.decide import (
    Decision,
    History,
    decide,
)
from claimwarden.signals.observations import Observation
from claimwarden.signals.policy import Policy, Recovery, Rule, Threshold, WorkloadFault

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
    assert decision.history == History(marked_since=minutes(1), rule="xid")
    assert "rule xid" in decision.why and "79" in decision.why


def test_values_filter_the_observations() -> None:
    p = policy(rule(values=("48", "79")))
    assert run(p, [taint(T0, "13")], T0).effect == "None"
    assert run(p, [taint(T0, "48")], T0).effect == "NoExecute"


def test_shadow_does_nothing_but_says_what_it_would_do() -> None:
    decision = run(policy(rule(mode="Shadow")), [taint(T0)], T0)
    assert (decision.effect, decision.would, decision.mode, decision.rule) == ("None", "NoExecute", "Shadow", "xid")
    assert "would NoExecute" in decision.why
