"""HealthPolicy parsing, routing and the observation helpers (issue 21), with plain data."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from claimwarden.signals import observations as obs
from claimwarden.signals.observations import Observation
from claimwarden.signals.policy import (
    Policy,
    Router,
    Rule,
    Threshold,
    WorkloadFault,
    parse_duration,
    parse_policy,
    policy_status,
)

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def body(name: str = "p", **spec: Any) -> dict[str, Any]:
    rules = spec.pop("rules", [{"name": "xid", "source": "DriverTaint", "signal": "gpu.nvidia.com/xid",
                                "effect": "NoExecute"}])
    return {"metadata": {"name": name}, "spec": {"rules": rules, **spec}}


def taint(at: datetime, value: str = "79", state: str = obs.UNHEALTHY, key: str | None = None) -> Observation:
    return Observation(obs.SOURCE_TAINT, "gpu.nvidia.com/xid", value, state, at,
                       key or f"gpu.nvidia.com/xid={value}@{at.isoformat()}")


# --- durations -----------------------------------------------------------------------------------

@pytest.mark.parametrize(("text", "expected"), [
    ("1h30m", timedelta(hours=1, minutes=30)), ("10m", timedelta(minutes=10)), ("45s", timedelta(seconds=45)),
    ("0s", timedelta(0)), ("2h", timedelta(hours=2)), ("1h2m3s", timedelta(hours=1, minutes=2, seconds=3)),
    # Go's grammar (issue 23 item 8; the whole table is in test_durations.py)
    ("1m1h", timedelta(hours=1, minutes=1)), ("1.5h", timedelta(hours=1, minutes=30)),
    ("1234567s", timedelta(seconds=1234567))])
def test_durations_parse(text: str, expected: timedelta) -> None:
    assert parse_duration(text) == expected


@pytest.mark.parametrize("text", ["", "10", "1d", "m", "-1m", " 1m"])
def test_bad_durations_are_none(text: str) -> None:
    assert parse_duration(text) is None


# --- parsing -------------------------------------------------------------------------------------

def test_a_minimal_policy_takes_the_defaults() -> None:
    policy, errors = parse_policy(body())
    assert errors == []
    assert policy is not None
    rule = policy.rules[0]
    assert (rule.mode, rule.threshold, rule.values, rule.workload_fault, rule.drain) == (
        "Shadow", Threshold(1, timedelta(minutes=10), timedelta(0)), (), None, None)
    assert (policy.priority, policy.drivers, policy.pools) == (0, (), ())
    assert (policy.device_class, policy.selector) == (None, None)
    assert policy.recovery.healthy_hold == timedelta(minutes=5)
    assert policy.recovery.refault_window == timedelta(hours=1)
    assert policy.recovery.escalate_to == "NoExecute"


def test_a_full_policy_parses() -> None:
    policy, errors = parse_policy(body(
        priority=10, drivers=["gpu.nvidia.com"], pools=["node-1", "rack-*"], deviceClassName="gpu.nvidia.com",
        selector='device.attributes["gpu.nvidia.com"].model == "H100"',
        rules=[{"name": "fatal-xid", "source": "DriverTaint", "signal": "gpu.nvidia.com/xid", "values": ["48", "79"],
                "effect": "NoExecute", "mode": "Enforce", "threshold": {"count": 2, "window": "1h", "burst": "3m"},
                "workloadFault": {"devices": 3, "window": "10m"}, "drain": "EvictAfter=30m"},
               {"name": "pod", "source": "PodStatus", "effect": "NoSchedule"}],
        recovery={"healthyHold": "10m", "refaultWindow": "2h", "escalateTo": "NoSchedule"}))
    assert errors == []
    assert policy is not None
    fatal, pod = policy.rules
    assert fatal == Rule("fatal-xid", "DriverTaint", "gpu.nvidia.com/xid", ("48", "79"), "NoExecute", "Enforce",
                         Threshold(2, timedelta(hours=1), timedelta(minutes=3)),
                         WorkloadFault(3, timedelta(minutes=10)), "EvictAfter=30m")
    assert pod.signal == "allocatedResourcesStatus"  # PodStatus has one signal: its default
    assert policy.pools == ("node-1", "rack-*")
    assert policy.recovery.escalate_to == "NoSchedule"
    assert policy.rule("pod") is pod
    assert policy.rule("nope") is None


@pytest.mark.parametrize(("spec", "expected"), [
    ({"rules": []}, "spec.rules: must list at least one rule"),
    ({"rules": [{"name": "a", "source": "Syslog", "signal": "x", "effect": "NoExecute"}]},
     "spec.rules[0].source: 'Syslog' is not one of DriverTaint, PodStatus, Alertmanager, NodeCondition"),
    ({"rules": [{"name": "a", "source": "DriverTaint", "signal": "x", "effect": "Evict"}]},
     "spec.rules[0].effect: 'Evict' is not one of NoExecute, NoSchedule, None"),
    ({"rules": [{"name": "a", "source": "DriverTaint", "signal": "x", "effect": "None", "mode": "Dry"}]},
     "spec.rules[0].mode: 'Dry' is not one of Shadow, Enforce"),
    ({"rules": [{"name": "a", "source": "DriverTaint", "effect": "None"}]},
     "spec.rules[0].signal: is required (a taint key, alert name, condition type, or allocatedResourcesStatus "
     "for PodStatus)"),
    ({"rules": [{"name": "a", "source": "DriverTaint", "signal": "x", "effect": "None",
                 "threshold": {"window": "10x"}}]},
     "spec.rules[0].threshold.window: '10x' is not a duration like 1h30m, 10m or 45s (Go's form: numbers with units "
     "ns, us, ms, s, m or h, such as 300ms, 1.5h or 2h45m; 0 alone needs no unit)"),
    ({"rules": [{"name": "a", "source": "DriverTaint", "signal": "x", "effect": "None",
                 "threshold": {"count": 0}}]}, "spec.rules[0].threshold.count: 0 is not a whole number from 1 to 32"),
    ({"rules": [{"name": "a", "source": "DriverTaint", "signal": "x", "effect": "None",
                 "threshold": {"window": "1m", "burst": "5m"}}]},
     "spec.rules[0].threshold.burst: must not be longer than the window"),
    ({"rules": [{"name": "a", "source": "DriverTaint", "signal": "x", "effect": "None"},
                {"name": "a", "source": "PodStatus", "effect": "None"}]},
     "spec.rules[1].name: 'a' is used by an earlier rule"),
    ({"rules": [{"name": "a", "source": "DriverTaint", "signal": "x", "effect": "None", "drain": "Soon"}]},
     "spec.rules[0].drain: 'Soon' is not Immediate, AllowCompletion, Node or EvictAfter=<duration>"),
    ({"rules": [{"name": "a", "source": "DriverTaint", "signal": "x", "effect": "None", "scope": "Rack"}]},
     "spec.rules[0].scope: 'Rack' is not one of Device, FaultDomain"),
    ({"rules": [{"name": "a", "source": "DriverTaint", "signal": "x", "effect": "None",
                 "workloadFault": {"window": "10m"}}]}, "spec.rules[0].workloadFault.devices: is required"),
    ({"pools": ["ra*ck"]}, "spec.pools[0]: 'ra*ck': '*' is allowed only at the end"),
    ({"priority": 5000}, "spec.priority: 5000 is not a whole number from -1000 to 1000"),
    ({"recovery": {"escalateTo": "None"}}, "spec.recovery.escalateTo: 'None' is not NoExecute or NoSchedule"),
    ({"rules": [{"name": "a", "source": "DriverTaint", "signal": "x", "effect": "None",
                 "values": [str(n) for n in range(17)]}]},
     "spec.rules[0].values: has 17 entries, at most 16 are allowed"),
    ({"rules": [{"name": "a", "source": "NodeCondition", "signal": "GPUProblem", "effect": "NoSchedule"}]},
     'spec.rules[0].values: a NodeCondition rule must list the condition statuses that mean a fault (like ["True"]): '
     "Node Problem Detector reports its conditions False while healthy"),
    ({"rules": [{"name": "a", "source": "NodeCondition", "signal": "GPUProblem", "effect": "NoSchedule",
                 "values": []}]},
     'spec.rules[0].values: a NodeCondition rule must list the condition statuses that mean a fault (like ["True"]): '
     "Node Problem Detector reports its conditions False while healthy"),
])
def test_parse_errors_are_in_words(spec: dict[str, Any], expected: str) -> None:
    policy, errors = parse_policy(body(**spec))
    assert policy is None
    assert expected in errors, errors


def test_every_error_is_reported_at_once() -> None:
    policy, errors = parse_policy({"metadata": {}, "spec": {"rules": [{"name": "Bad_Name", "effect": "x"}]}})
    assert policy is None
    assert len(errors) >= 4, errors
    assert errors[0] == "metadata.name: is required"


def test_a_policy_that_is_not_an_object_is_an_error() -> None:
    assert parse_policy({"metadata": {"name": "p"}, "spec": "rules"}) == (None, ["spec: must be an object"])


def test_policy_status() -> None:
    policy, errors = parse_policy(body(rules=[
        {"name": "a", "source": "DriverTaint", "signal": "x", "effect": "NoExecute", "mode": "Enforce"},
        {"name": "b", "source": "PodStatus", "effect": "NoSchedule"}]))
    status = policy_status(policy, errors)
    assert (status["rules"], status["enforced"]) == (2, 1)
    assert status["accepted"] == {"type": "Accepted", "status": "True", "reason": "Accepted",
                                  "message": "2 rules, 1 enforced"}
    assert policy_status(policy, [], "spec.selector: compile error: x")["accepted"]["reason"] == "NotRoutable"
    bad, errors = parse_policy(body(rules=[]))
    assert policy_status(bad, errors) == {"rules": 0, "enforced": 0, "accepted": {
        "type": "Accepted", "status": "False", "reason": "Invalid",
        "message": "spec.rules: must list at least one rule"}}


# --- rules ---------------------------------------------------------------------------------------

def test_a_rule_matches_source_signal_and_values() -> None:
    rule = Rule("r", obs.SOURCE_TAINT, "gpu.nvidia.com/xid", ("48", "79"), "NoExecute")
    assert rule.matches(taint(T0, "79"))
    assert not rule.matches(taint(T0, "13"))
    assert not rule.matches(Observation(obs.SOURCE_ALERT, "gpu.nvidia.com/xid", "79", obs.UNHEALTHY, T0, "k"))
    assert Rule("any", obs.SOURCE_TAINT, "gpu.nvidia.com/xid", (), "NoExecute").matches(taint(T0, "13"))


# --- routing -------------------------------------------------------------------------------------

H100 = {"name": "gpu-0", "attributes": {"model": {"string": "H100"}, "memory": {"int": 80}}}
A100 = {"name": "gpu-1", "attributes": {"model": {"string": "A100"}, "memory": {"int": 40}}}


def policy(name: str, **fields: Any) -> Policy:
    return Policy(name=name, rules=(Rule("r", obs.SOURCE_TAINT, "k", (), "NoExecute"),), **fields)


def test_the_highest_priority_wins_then_the_name() -> None:
    router = Router([policy("b"), policy("a"), policy("low", priority=-1), policy("high", priority=5)], {})
    assert router.errors == {}
    assert [p.name for p in router.policies] == ["high", "a", "b", "low"]
    chosen = router.route("gpu.example.com", "node-1", H100)
    assert chosen is not None and chosen.name == "high"


def test_drivers_and_pools_narrow_the_route() -> None:
    router = Router([policy("nvidia", priority=3, drivers=("gpu.nvidia.com",)),
                     policy("rack", priority=2, pools=("rack-*", "node-9")),
                     policy("fallback")], {})

    def name(driver: str, pool: str) -> str | None:
        chosen = router.route(driver, pool, H100)
        return chosen.name if chosen else None

    assert name("gpu.nvidia.com", "node-1") == "nvidia"
    assert name("gpu.example.com", "rack-7") == "rack"
    assert name("gpu.example.com", "rack-") == "rack"
    assert name("gpu.example.com", "node-9") == "rack"
    assert name("gpu.example.com", "node-90") == "fallback"
    assert name("gpu.example.com", "arack-7") == "fallback"
    assert Router([policy("nvidia", drivers=("gpu.nvidia.com",))], {}).route("gpu.example.com", "n", H100) is None


def test_a_cel_selector_routes_by_device_attributes() -> None:
    router = Router([policy("h100", priority=1, selector='device.attributes["gpu.example.com"].model == "H100"'),
                     policy("big", selector="device.attributes['gpu.example.com'].memory >= 40")], {})
    assert router.errors == {}
    assert getattr(router.route("gpu.example.com", "node-1", H100), "name", None) == "h100"
    assert getattr(router.route("gpu.example.com", "node-1", A100), "name", None) == "big"
    # an unknown domain is an empty map, as in DRA: no match, no error
    other = Router([policy("h100", selector='device.attributes["other.com"].model == "H100"')], {})
    assert other.route("gpu.example.com", "node-1", H100) is None


def test_a_device_class_routes_with_its_selectors() -> None:
    classes = {"gpu.example.com": ['device.driver == "gpu.example.com"'],
               "big.gpu.example.com": ['device.driver == "gpu.example.com"',
                                       "device.attributes['gpu.example.com'].memory >= 80"]}
    router = Router([policy("big", priority=1, device_class="big.gpu.example.com"),
                     policy("any", device_class="gpu.example.com")], classes)
    assert getattr(router.route("gpu.example.com", "node-1", H100), "name", None) == "big"
    assert getattr(router.route("gpu.example.com", "node-1", A100), "name", None) == "any"
    assert router.route("gpu.nvidia.com", "node-1", A100) is None


def test_a_bad_cel_or_a_missing_class_is_reported_not_raised() -> None:
    router = Router([policy("broken", priority=9, selector="device.attributes[ =="),
                     policy("nonbool", priority=8, selector="1 + 2"),
                     policy("classless", priority=7, device_class="absent"),
                     policy("good")], {})
    assert set(router.errors) == {"broken", "nonbool", "classless"}
    assert "compile error" in router.errors["broken"]
    assert router.errors["classless"] == "DeviceClass absent does not exist"
    assert getattr(router.route("gpu.example.com", "node-1", H100), "name", None) == "good"


def test_a_cel_runtime_error_skips_that_policy_for_that_device() -> None:
    router = Router([policy("strict", priority=1, selector="device.attributes['gpu.example.com'].cores > 2"),
                     policy("good")], {})
    assert getattr(router.route("gpu.example.com", "node-1", H100), "name", None) == "good"
    (where, message), = router.runtime_errors.items()
    assert where == ("strict", "gpu.example.com/node-1/" + H100["name"])
    assert "no such key" in message


# --- observations --------------------------------------------------------------------------------

def test_observation_json_round_trips_exactly() -> None:
    o = Observation(obs.SOURCE_POD, "allocatedResourcesStatus", "Unhealthy", obs.UNHEALTHY,
                    T0 + timedelta(microseconds=1500), "uid/c/gpu.example.com/node-1/gpu-0", "ECC error")
    assert obs.from_json(obs.to_json(o)) == o
    whole = taint(T0)
    assert obs.to_json(whole)["at"] == "2026-12-01T12:00:00Z"
    assert obs.from_json(obs.to_json(whole)) == whole


@pytest.mark.parametrize("broken", [
    {}, {"source": "Syslog"}, "text",
    {"source": "DriverTaint", "signal": "k", "value": "", "state": "Bad", "at": "2026-12-01T12:00:00Z", "key": "k"},
    {"source": "DriverTaint", "signal": "k", "value": "", "state": "Healthy", "at": "yesterday", "key": "k"},
    {"source": "DriverTaint", "signal": "k", "value": 3, "state": "Healthy", "at": "2026-12-01T12:00:00Z", "key": "k"},
    {"source": "DriverTaint", "signal": "k", "value": "", "state": "Healthy", "at": "2026-12-01T12:00:00Z", "key": ""},
])
def test_malformed_observations_are_none(broken: Any) -> None:
    assert obs.from_json(broken) is None


def test_long_fields_are_cut_to_the_crd_and_still_dedup() -> None:
    o = Observation(obs.SOURCE_ALERT, "A" * 600, "v" * 600, obs.UNHEALTHY, T0, "f" * 2000, "x" * 1000)
    body = obs.to_json(o)
    assert [len(body[name]) for name in ("signal", "value", "key", "message")] == [
        obs.SIGNAL_MAX, obs.VALUE_MAX, obs.KEY_MAX, obs.MESSAGE_MAX]
    merged, added = obs.merge([], [o])
    assert added == merged == [obs.from_json(body)]
    # read back from the record and seen again: nothing new, no write
    assert obs.merge([obs.from_json(body)], [o])[1] == []


def test_merge_dedups_by_key_and_state_and_keeps_the_newest() -> None:
    first = [taint(T0 + timedelta(minutes=i), key=f"k{i}") for i in range(3)]
    merged, added = obs.merge([], first)
    assert merged == first and added == first
    again = [taint(T0 + timedelta(minutes=1), key="k1"),  # the same (key, state), seen again
             taint(T0 + timedelta(minutes=1), key="k1", state=obs.HEALTHY),
             taint(T0 - timedelta(minutes=1), key="early")]
    merged, added = obs.merge(merged, again)
    assert added == again[1:]
    assert [o.key for o in merged] == ["early", "k0", "k1", "k1", "k2"]
    many = [taint(T0 + timedelta(hours=1, seconds=i), key=f"n{i}") for i in range(40)]
    merged, added = obs.merge(merged, many)
    assert len(merged) == obs.OBSERVATIONS_MAX
    assert merged == many[-obs.OBSERVATIONS_MAX:]
    assert added == many[-obs.OBSERVATIONS_MAX:]
    # one older than everything kept is not "added": seeing it again must not rewrite the record
    assert obs.merge(merged, [taint(T0, key="old")]) == (merged, [])


def test_latest_by_key() -> None:
    a1 = taint(T0, key="a")
    a2 = taint(T0 + timedelta(minutes=1), key="a", state=obs.HEALTHY)
    b = taint(T0, key="b")
    assert obs.latest_by_key([a2, b, a1]) == {"a": a2, "b": b}
