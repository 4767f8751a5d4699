"""HealthPolicy: which observations mark a device, how strongly, and how it recovers.

A HealthPolicy (cluster-scoped, ``crds/healthpolicies.claimwarden.io.yaml``) holds rules such as
"2 DriverTaint gpu.nvidia.com/xid=79 observations within 10m, a burst of 1m counting once ->
NoExecute". Which policy applies to a device is a route: its drivers, pools (exact or a trailing
``*``), a DeviceClass whose selectors the device must pass, and a CEL selector over the same
``device`` variable DRA uses (``claimwarden.cel``). The matching policy with the highest
priority wins, ties broken by name, so every device has at most one policy and a reader can tell
which from the policies alone.

The CRD validates with CEL; ``parse_policy`` checks the same again in words, because an object
stored under an older CRD (or applied with validation off) must get a clear error, not a crash.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from claimwarden import durations
from claimwarden.cel import CelError, Evaluator, Program, device_input
from claimwarden.health.records import EFFECTS, parse_drain
from claimwarden.health.siblings import SCOPES
from claimwarden.signals.observations import SIGNAL_MAX, SOURCE_NODE, SOURCE_POD, SOURCES, Observation
from claimwarden.timestamps import format_rfc3339

GROUP = "claimwarden.io"
VERSION = "v1alpha1"
PLURAL = "healthpolicies"
KIND = "HealthPolicy"

MODE_SHADOW, MODE_ENFORCE = "Shadow", "Enforce"
MODES = (MODE_SHADOW, MODE_ENFORCE)
EFFECT_NONE = "None"
STRENGTH = {"None": 0, "NoSchedule": 1, "NoExecute": 2}
"""Effects by strength: where several rules fire, the strongest wins."""
RULES_MAX = 32
VALUES_MAX = 16
PRIORITY_MIN, PRIORITY_MAX = -1000, 1000
POD_SIGNAL = "allocatedResourcesStatus"
REPAIR_ACTIONS = ("None", "GpuReset", "NodeReboot", "Drain")
"""A rule's recommendedAction (handoff/actions.py ACTIONS: kept in step, the CRD's enum too)."""

_RULE_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def parse_duration(text: str) -> timedelta | None:
    """A Go duration of 0 or more (`1h30m`, `10m`, `45s`, `1.5h`, `0`: durations.py); None for anything else."""
    if not isinstance(text, str):
        return None
    try:
        return durations.parse(text)
    except durations.DurationError:
        return None


@dataclass(frozen=True)
class Threshold:
    """`count` bursts within `window`; observations within `burst` of a burst's first count once."""

    count: int = 1
    window: timedelta = timedelta(minutes=10)
    burst: timedelta = timedelta(0)


@dataclass(frozen=True)
class WorkloadFault:
    """The same signal on `devices` or more different devices within `window` is the workload's fault."""

    devices: int
    window: timedelta


@dataclass(frozen=True)
class Rule:
    """spec.rules[]: which observations count (source, signal, values), when they fire, and the effect."""

    name: str
    source: str
    signal: str
    values: tuple[str, ...] = ()
    effect: str = "NoSchedule"
    mode: str = MODE_SHADOW
    threshold: Threshold = Threshold()
    workload_fault: WorkloadFault | None = None
    drain: str | None = None
    recommended_action: str | None = None
    """What a repair system should do about a device this rule marks (handoff/actions.py); None: the signal's."""
    scope: str | None = None
    """The record's spec.scope: FaultDomain for faults that take the whole device (an XID whose recovery resets
    the GPU), Device for the device alone; None leaves it to the device (health/siblings.py)."""

    def matches(self, o: Observation) -> bool:
        """The observation is of this rule's source and signal, with one of its values (any when none)."""
        return o.source == self.source and o.signal == self.signal and (not self.values or o.value in self.values)


@dataclass(frozen=True)
class Recovery:
    """spec.recovery: the PodStatus hold, the re-fault window that escalates, and the escalated effect."""

    healthy_hold: timedelta = timedelta(minutes=5)
    refault_window: timedelta = timedelta(hours=1)
    escalate_to: str = "NoExecute"


@dataclass(frozen=True)
class Policy:
    """One HealthPolicy: its route (priority, drivers, pools, DeviceClass, CEL selector), rules and recovery."""

    name: str
    priority: int = 0
    drivers: tuple[str, ...] = ()
    pools: tuple[str, ...] = ()
    device_class: str | None = None
    selector: str | None = None
    rules: tuple[Rule, ...] = ()
    recovery: Recovery = Recovery()

    def rule(self, name: str | None) -> Rule | None:
        """The rule of that name (None when the policy has none)."""
        return next((rule for rule in self.rules if rule.name == name), None)


# --- parsing ------------------------------------------------------------------------------------

class _Errors(list[str]):
    def add(self, where: str, what: str) -> None:
        self.append(f"{where}: {what}")


def _strings(value: object, where: str, errors: _Errors, *, limit: int | None = None) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(item, str) and item for item in value):
        errors.add(where, "must be a list of non-empty strings")
        return ()
    if limit is not None and len(value) > limit:
        errors.add(where, f"has {len(value)} entries, at most {limit} are allowed")
    return tuple(value)


def _duration(body: Mapping[str, Any], name: str, default: timedelta, where: str, errors: _Errors) -> timedelta:
    raw = body.get(name)
    if raw is None:
        return default
    if not isinstance(raw, str):
        errors.add(f"{where}.{name}", f"{raw!r} is not a duration like 1h30m, 10m or 45s ({durations.GRAMMAR})")
        return default
    try:
        return durations.parse(raw)
    except durations.DurationError as exc:
        errors.add(f"{where}.{name}", str(exc))
        return default


def _count(body: Mapping[str, Any], name: str, default: int | None, where: str, errors: _Errors,
           low: int = 1, high: int = 1000) -> int | None:
    raw = body.get(name, default)
    if raw is None:
        errors.add(f"{where}.{name}", "is required")
        return default
    if isinstance(raw, bool) or not isinstance(raw, int) or not low <= raw <= high:
        errors.add(f"{where}.{name}", f"{raw!r} is not a whole number from {low} to {high}")
        return default
    return raw


def _mapping(value: object, where: str, errors: _Errors) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        errors.add(where, "must be an object")
        return {}
    return value


def _parse_rule(body: object, where: str, errors: _Errors) -> Rule | None:
    if not isinstance(body, Mapping):
        errors.add(where, "must be an object")
        return None
    before = len(errors)
    name = body.get("name")
    if not isinstance(name, str) or not _RULE_NAME.match(name) or len(name) > 63:
        errors.add(f"{where}.name", f"{name!r} is not a name of lower-case letters, digits and '-' (at most 63)")
    source = body.get("source")
    if source not in SOURCES:
        errors.add(f"{where}.source", f"{source!r} is not one of {', '.join(SOURCES)}")
    signal = body.get("signal", POD_SIGNAL if source == SOURCE_POD else None)
    if not isinstance(signal, str) or not signal:
        errors.add(f"{where}.signal", "is required (a taint key, alert name, condition type, or "
                                      f"{POD_SIGNAL} for PodStatus)")
    elif len(signal) > SIGNAL_MAX:
        errors.add(f"{where}.signal", f"is longer than {SIGNAL_MAX} characters")
    values = _strings(body.get("values"), f"{where}.values", errors, limit=VALUES_MAX)
    if source == SOURCE_NODE and not values:
        # Every condition is observed whatever its status, and NPD reports False while healthy.
        errors.add(f"{where}.values", 'a NodeCondition rule must list the condition statuses that mean a fault '
                                      '(like ["True"]): Node Problem Detector reports its conditions False while '
                                      'healthy')
    effect = body.get("effect")
    if effect not in EFFECTS:
        errors.add(f"{where}.effect", f"{effect!r} is not one of {', '.join(EFFECTS)}")
    mode = body.get("mode", MODE_SHADOW)
    if mode not in MODES:
        errors.add(f"{where}.mode", f"{mode!r} is not one of {', '.join(MODES)}")
    raw_threshold = _mapping(body.get("threshold"), f"{where}.threshold", errors)
    threshold = Threshold(
        count=_count(raw_threshold, "count", 1, f"{where}.threshold", errors, high=32) or 1,
        window=_duration(raw_threshold, "window", Threshold.window, f"{where}.threshold", errors),
        burst=_duration(raw_threshold, "burst", Threshold.burst, f"{where}.threshold", errors))
    if threshold.burst > threshold.window:
        errors.add(f"{where}.threshold.burst", "must not be longer than the window")
    if threshold.window <= timedelta(0):
        errors.add(f"{where}.threshold.window", "must be longer than 0s")
    workload_fault = None
    if body.get("workloadFault") is not None:
        raw_fault = _mapping(body.get("workloadFault"), f"{where}.workloadFault", errors)
        devices = _count(raw_fault, "devices", None, f"{where}.workloadFault", errors, low=2, high=100000)
        window = _duration(raw_fault, "window", timedelta(minutes=10), f"{where}.workloadFault", errors)
        workload_fault = WorkloadFault(devices or 2, window)
    drain = body.get("drain")
    if drain is not None and (not isinstance(drain, str) or parse_drain(drain) is None):
        errors.add(f"{where}.drain", f"{drain!r} is not Immediate, AllowCompletion, Node or EvictAfter=<duration>")
    action = body.get("recommendedAction")
    if action is not None and action not in REPAIR_ACTIONS:
        errors.add(f"{where}.recommendedAction", f"{action!r} is not one of {', '.join(REPAIR_ACTIONS)}")
    scope = body.get("scope")
    if scope is not None and scope not in SCOPES:
        errors.add(f"{where}.scope", f"{scope!r} is not one of {', '.join(SCOPES)}")
    if len(errors) > before:
        return None
    return Rule(name=str(name), source=str(source), signal=str(signal), values=values, effect=str(effect),
                mode=str(mode), threshold=threshold, workload_fault=workload_fault,
                drain=str(drain) if drain is not None else None,
                recommended_action=str(action) if action is not None else None,
                scope=str(scope) if scope is not None else None)


def parse_policy(body: Mapping[str, Any]) -> tuple[Policy | None, list[str]]:
    """The policy of a HealthPolicy object, or None and every error in words ("spec.rules[1].effect: …")."""
    errors = _Errors()
    name = str(((body.get("metadata") or {}) if isinstance(body, Mapping) else {}).get("name") or "")
    if not name:
        errors.add("metadata.name", "is required")
    raw_spec = body.get("spec") if isinstance(body, Mapping) else None
    if not isinstance(raw_spec, Mapping):
        errors.add("spec", "must be an object")
        return None, list(errors)
    spec: Mapping[str, Any] = raw_spec
    priority = _count(spec, "priority", 0, "spec", errors, low=PRIORITY_MIN, high=PRIORITY_MAX)
    drivers = _strings(spec.get("drivers"), "spec.drivers", errors)
    pools = _strings(spec.get("pools"), "spec.pools", errors)
    for number, pool in enumerate(pools):
        if "*" in pool[:-1]:
            errors.add(f"spec.pools[{number}]", f"{pool!r}: '*' is allowed only at the end")
    device_class = spec.get("deviceClassName")
    if device_class is not None and (not isinstance(device_class, str) or not device_class):
        errors.add("spec.deviceClassName", "must be a DeviceClass name")
    selector = spec.get("selector")
    if selector is not None and (not isinstance(selector, str) or not selector.strip()):
        errors.add("spec.selector", "must be a CEL expression")
    raw_rules = spec.get("rules")
    rules: list[Rule] = []
    if not isinstance(raw_rules, list) or not raw_rules:
        errors.add("spec.rules", "must list at least one rule")
    else:
        if len(raw_rules) > RULES_MAX:
            errors.add("spec.rules", f"has {len(raw_rules)} rules, at most {RULES_MAX} are allowed")
        for number, raw in enumerate(raw_rules):
            rule = _parse_rule(raw, f"spec.rules[{number}]", errors)
            if rule is not None:
                if any(other.name == rule.name for other in rules):
                    errors.add(f"spec.rules[{number}].name", f"{rule.name!r} is used by an earlier rule")
                rules.append(rule)
    raw_recovery = _mapping(spec.get("recovery"), "spec.recovery", errors)
    escalate_to = raw_recovery.get("escalateTo", Recovery.escalate_to)
    if escalate_to not in ("NoExecute", "NoSchedule"):
        errors.add("spec.recovery.escalateTo", f"{escalate_to!r} is not NoExecute or NoSchedule")
    recovery = Recovery(
        healthy_hold=_duration(raw_recovery, "healthyHold", Recovery.healthy_hold, "spec.recovery", errors),
        refault_window=_duration(raw_recovery, "refaultWindow", Recovery.refault_window, "spec.recovery", errors),
        escalate_to=str(escalate_to))
    if errors:
        return None, list(errors)
    return Policy(name=name, priority=int(priority or 0), drivers=drivers, pools=pools,
                  device_class=device_class, selector=selector, rules=tuple(rules), recovery=recovery), []


def policy_status(policy: Policy | None, errors: Sequence[str], route_error: str | None = None) -> dict[str, Any]:
    """What a HealthPolicy's status says (the printer columns Rules, Enforced, Accepted): the rule counts and
    the Accepted condition's status, reason and message (lastTransitionTime is the writer's to keep).

    `errors`: parse_policy's; `route_error`: Router.errors for the policy (CEL, a missing DeviceClass).
    """
    rules = policy.rules if policy is not None else ()
    if errors or policy is None:
        accepted = {"status": "False", "reason": "Invalid", "message": "; ".join(errors)[:32768] or "not parsed"}
    elif route_error:
        accepted = {"status": "False", "reason": "NotRoutable", "message": route_error[:32768]}
    else:
        accepted = {"status": "True", "reason": "Accepted",
                    "message": f"{len(rules)} rules, {sum(r.mode == MODE_ENFORCE for r in rules)} enforced"}
    return {"rules": len(rules), "enforced": sum(r.mode == MODE_ENFORCE for r in rules),
            "accepted": {"type": "Accepted", **accepted}}


def desired_status(body: Mapping[str, Any], route_error: str | None, moment: datetime) -> dict[str, Any]:
    """The whole status claimwarden writes on a HealthPolicy: policy_status's counts and Accepted condition, with
    the generation they were read from. The Accepted condition keeps its lastTransitionTime while its status
    stays; other writers' conditions are kept as they are."""
    parsed, errors = parse_policy(body)
    summary = policy_status(parsed, errors, route_error)
    generation = (body.get("metadata") or {}).get("generation")
    conditions = list((body.get("status") or {}).get("conditions") or [])
    before = next((c for c in conditions if isinstance(c, Mapping) and c.get("type") == "Accepted"), None)
    accepted = summary["accepted"]
    since = before.get("lastTransitionTime") if before is not None and before.get("status") == accepted["status"] \
        else None
    condition = {**accepted, "lastTransitionTime": since or format_rfc3339(moment)}
    status: dict[str, Any] = {"rules": summary["rules"], "enforced": summary["enforced"]}
    if isinstance(generation, int):
        status["observedGeneration"] = generation
        condition["observedGeneration"] = generation
    others = [c for c in conditions if c is not before]
    status["conditions"] = [*others, condition]
    return status


def status_patch(current: Mapping[str, Any], desired: Mapping[str, Any]) -> dict[str, Any] | None:
    """The merge patch of the status subresource that writes `desired`, or None when `current` already says it
    (a policy's status is written only when it changes)."""
    if all(current.get(key) == value for key, value in desired.items()):
        return None
    return {"status": dict(desired)}


# --- routing ------------------------------------------------------------------------------------

def _pool_matches(pattern: str, pool: str) -> bool:
    return pool.startswith(pattern[:-1]) if pattern.endswith("*") else pool == pattern


@dataclass
class _Route:
    policy: Policy
    programs: list[Program] = field(default_factory=list)


class Router:
    """Chooses the policy of a device. Build a new one when policies or DeviceClasses change.

    `class_selectors` maps a DeviceClass name to its CEL selectors (spec.selectors[].cel.expression).
    A policy whose CEL does not compile, or whose DeviceClass does not exist, is left out and named
    in `errors` (for an Event and the policy's status), never raised.
    """

    def __init__(self, policies: Iterable[Policy], class_selectors: Mapping[str, Sequence[str]],
                 *, evaluator: Evaluator | None = None) -> None:
        self._evaluator = evaluator or Evaluator()
        self.errors: dict[str, str] = {}
        self.runtime_errors: dict[tuple[str, str], str] = {}
        """(policy name, driver/pool/device) -> the CEL error evaluating the policy on that device (the device was
        not routed to it)."""
        self._routes: list[_Route] = []
        for policy in sorted(policies, key=lambda p: (-p.priority, p.name)):
            route = self._compile(policy, class_selectors)
            if route is not None:
                self._routes.append(route)

    def _compile(self, policy: Policy, class_selectors: Mapping[str, Sequence[str]]) -> _Route | None:
        expressions: list[tuple[str, str]] = []
        if policy.device_class is not None:
            if policy.device_class not in class_selectors:
                self.errors[policy.name] = f"DeviceClass {policy.device_class} does not exist"
                return None
            expressions += [(f"DeviceClass {policy.device_class}", e) for e in class_selectors[policy.device_class]]
        if policy.selector is not None:
            expressions.append(("spec.selector", policy.selector))
        route = _Route(policy)
        for where, expression in expressions:
            try:
                route.programs.append(self._evaluator.compile(expression))
            except CelError as exc:
                self.errors[policy.name] = f"{where}: {exc}"
                return None
        return route

    @property
    def policies(self) -> list[Policy]:
        """The policies in use, in routing order."""
        return [route.policy for route in self._routes]

    def route(self, driver: str, pool: str, device: Mapping[str, Any]) -> Policy | None:
        """The policy of a device (its ResourceSlice spec.devices[] entry); None when none matches."""
        cel_input = None
        for route in self._routes:
            policy = route.policy
            if policy.drivers and driver not in policy.drivers:
                continue
            if policy.pools and not any(_pool_matches(pattern, pool) for pattern in policy.pools):
                continue
            if route.programs:
                cel_input = cel_input or device_input(driver, device,
                                                      allow_multiple=bool(device.get("allowMultipleAllocations")))
                try:
                    if not all(program.matches(cel_input) for program in route.programs):
                        continue
                except CelError as exc:
                    # As in the scheduler, an error is not a match; the policy keeps its other devices.
                    where = f"{driver}/{pool}/{device.get('name', '')}"
                    self.runtime_errors[(policy.name, where)] = f"device {where}: {exc}"
                    continue
            return policy
        return None
