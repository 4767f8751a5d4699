"""The gauges behind the observability pack's alerts: pending claims' age and unselective DeviceTaintRules."""

from __future__ import annotations

from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from claimwarden.health.taint_rules import selects_every_device
from claimwarden.metrics import ClaimCollector, ClaimSample, DeviceCollector


def _scrape(collector: Any) -> str:
    registry = CollectorRegistry()
    registry.register(collector)
    return generate_latest(registry).decode()


@pytest.mark.parametrize(("spec", "everything"), [
    ({}, True),  # deviceSelector omitted (kubernetes/kubernetes#141422)
    ({"deviceSelector": {}}, True),  # present but empty (#141620)
    ({"deviceSelector": {"driver": "", "selectors": []}}, True),
    ({"deviceSelector": {"driver": "gpu.example.com"}}, False),
    ({"deviceSelector": {"deviceClassName": "gpu"}}, False),
    ({"deviceSelector": {"selectors": [{"cel": {"expression": "true"}}]}}, False),  # explicit, on purpose
    ({"deviceSelector": {"driver": "d", "pool": "p", "device": "gpu-0"}}, False),
])
def test_a_rule_selects_every_device_only_without_any_selector_field(spec: dict[str, Any], everything: bool) -> None:
    assert selects_every_device({"metadata": {"name": "r"}, "spec": {"taint": {"effect": "NoExecute"}, **spec}}) \
        is everything


def test_the_oldest_pending_claim_per_source() -> None:
    text = _scrape(ClaimCollector(lambda: [
        ClaimSample("pending", "resource_claim_template", False, 30.0),
        ClaimSample("pending", "resource_claim_template", False, 1200.0),
        ClaimSample("reserved", "resource_claim_template", False, 0.0),
        ClaimSample("reserved", "user", False, 0.0),
    ]))
    assert 'claimwarden_claims_pending_longest_seconds{source="resource_claim_template"} 1200.0' in text
    assert 'claimwarden_claims_pending_longest_seconds{source="user"} 0.0' in text


def test_the_unselective_rule_gauge_is_absent_where_the_api_is_not_served() -> None:
    def collector(count: int | None) -> DeviceCollector:
        return DeviceCollector(lambda: [], lambda: [], lambda: 0, lambda: count)
    assert "claimwarden_device_taint_rules_unselective" not in _scrape(collector(None))
    assert "claimwarden_device_taint_rules_unselective 2.0" in _scrape(collector(2))
