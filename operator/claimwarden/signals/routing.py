"""Which HealthPolicy decides for a device: the router over the policies in the cache, kept while they hold.

Parsing every policy and compiling its CEL for each reconcile would cost more than the decision: the
router is built again only when a policy's spec (its generation, not its status: claimwarden writes that)
or a DeviceClass's selectors changed. What is wrong with a policy (it does not parse, its selector does
not compile, its CEL fails on a device) is handed to `report`, which tells a person once.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from ..cache import Body, Cache
from ..health.records import DeviceRef
from . import policy

INVALID_POLICY = "InvalidHealthPolicy"
POLICY_ERROR = "HealthPolicyEvaluationError"

Report = Callable[[Body, str, str], None]
"""(the policy's body, what is wrong, the Event's reason) -> None."""


class PolicyRouting:
    """The policies parsed from the cache and the router over them."""

    def __init__(self, *, cache: Cache, report: Report) -> None:
        self.cache = cache
        self.report = report
        self._router: policy.Router | None = None
        self._router_key: tuple[Any, ...] | None = None

    def policies(self) -> list[policy.Policy]:
        """Every policy in the cache that parses (what does not is reported)."""
        parsed = []
        for body in self.cache.health_policies():
            found, errors = policy.parse_policy(body)
            if found is not None:
                parsed.append(found)
            for error in errors:
                self.report(body, error, INVALID_POLICY)
        return parsed

    def rule(self, policy_name: str | None, rule_name: str | None) -> policy.Rule | None:
        """The policy's rule of that name, or None when either is gone."""
        return next((r for p in self.policies() if p.name == policy_name for r in p.rules if r.name == rule_name),
                    None)

    def router(self) -> policy.Router:
        """The router over the policies and DeviceClasses in the cache, built again when a policy's spec (its
        generation: not its status) or a DeviceClass's selectors changed."""
        bodies = self.cache.health_policies()
        classes = self.cache.device_class_selectors()
        key = (tuple(sorted((b["metadata"].get("name"), b["metadata"].get("uid"), b["metadata"].get("generation"))
                            for b in bodies)),
               tuple(sorted((k, tuple(v)) for k, v in classes.items())))
        if self._router is None or key != self._router_key:
            self._router = policy.Router(self.policies(), classes)
            self._router_key = key
            for policy_name, why in sorted(self._router.errors.items()):
                body = next((b for b in bodies if b["metadata"].get("name") == policy_name), None)
                if body is not None:
                    self.report(body, why, INVALID_POLICY)
        return self._router

    def route(self, ref: DeviceRef, device: Mapping[str, Any]) -> policy.Policy | None:
        """The device's policy; `device` is its entry in a slice (what the selectors read)."""
        router = self.router()
        before = len(router.runtime_errors)
        found = router.route(ref.driver, ref.pool, device)
        if len(router.runtime_errors) > before:  # a CEL error on this device: once per policy and device
            for (policy_name, _), why in list(router.runtime_errors.items())[before:]:
                body = next((b for b in self.cache.health_policies() if b["metadata"].get("name") == policy_name),
                            None)
                if body is not None:
                    self.report(body, f"{why}; the device is not routed to this policy", POLICY_ERROR)
        return found
