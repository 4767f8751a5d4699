"""DeviceTaintRules that select every device: upstream's footgun, counted for an alert.

A DeviceTaintRule whose ``spec.deviceSelector`` is omitted, or present with no field set, applies its
taint to every device in the cluster (kubernetes/kubernetes#141620, #141422). With effect NoExecute
the device-taint-eviction controller then evicts every pod that holds a claim. claimwarden's own
rules always name driver, pool and device; rules written by people or other tools may not.

Where DeviceTaintRule is served, the leader lists the rules every ``INTERVAL`` seconds (a read; the
objects are few) and ``claimwarden_device_taint_rules_unselective`` counts those selecting every
device, for the alert ClaimwardenDeviceTaintRuleSelectsEverything (docs/reference/alerts.md). The series is
absent where the API is not served. kube-state-metrics would be the natural source of this count,
but v2.16 serves no custom-resource-state series for built-in types (kubernetes/kube-state-metrics#2681).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from ..kube.api import Kube
from ..kube.errors import NotServed

log = logging.getLogger("claimwarden.health")
INTERVAL = 15.0
# Any of these set narrows the rule; none set (or no deviceSelector at all) selects every device.
SELECTOR_FIELDS = ("driver", "pool", "device", "deviceClassName", "selectors")


def selects_every_device(rule: dict[str, Any]) -> bool:
    selector = (rule.get("spec") or {}).get("deviceSelector") or {}
    return not any(selector.get(field) for field in SELECTOR_FIELDS)


class UnselectiveRules:
    """The count of DeviceTaintRules selecting every device; None where the API is not served (yet)."""

    def __init__(self, kube: Kube, served_version: Callable[[], Awaitable[str | None]],
                 not_served: Callable[[str], None] = lambda _version: None) -> None:
        """`not_served(version)`: the server answered that it does not serve the rules at `version` (an
        upgrade dropped it), so `served_version` should look again."""
        self.kube = kube
        self.served_version = served_version
        self.not_served = not_served
        self.count: int | None = None
        self.names: list[str] = []

    async def refresh(self) -> None:
        version = await self.served_version()
        if not version:
            self.count = None
            return
        try:
            rules = await self.kube.list_cluster_objects(f"resource.k8s.io/{version}", "devicetaintrules")
        except NotServed:
            self.not_served(version)
            raise
        names = sorted(r["metadata"]["name"] for r in rules if selects_every_device(r))
        if names and names != self.names:
            log.warning("DeviceTaintRule(s) %s select every device in the cluster (no deviceSelector fields)",
                        ", ".join(names))
        self.names, self.count = names, len(names)

    async def run(self, leading: Callable[[], bool]) -> None:
        while True:
            if leading():
                try:
                    await self.refresh()
                except asyncio.CancelledError:
                    raise
                except Exception as exc:  # the next round retries; the gauge keeps its last value
                    log.warning("listing DeviceTaintRules failed: %s", exc)
            await asyncio.sleep(INTERVAL)
