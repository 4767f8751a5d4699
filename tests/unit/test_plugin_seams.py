"""The seams between explain's step modules: one attribute look-up (Device.typed_attribute) for constraints and
for people's selectors, and a matchAttribute constraint checked against the devices already chosen."""

from __future__ import annotations

from typing import Any

from claimwarden.plugin.constraints import constraints_hold
from claimwarden.plugin.requests import requests_of
from claimwarden.plugin.snapshot import Device

from .plugin_fixtures import DRIVER, claim, request


def _device(name: str, attributes: dict[str, Any]) -> Device:
    return Device(DRIVER, "pool", name, {"name": name, "attributes": attributes}, "slice", {}, 0)


def test_the_allocators_look_up_finds_a_driver_qualified_name_under_its_bare_key_and_nothing_else() -> None:
    device = _device("gpu-0", {"model": {"string": "H100"}, "example.com/rack": {"int": 4}})
    assert device.typed_attribute(f"{DRIVER}/model") == ("string", "H100")
    assert device.typed_attribute("example.com/rack") == ("int", 4)
    assert device.typed_attribute("other.com/model") is None
    assert device.typed_attribute("rack") is None  # a bare name is the driver's, not example.com's


def test_peoples_look_up_also_finds_a_bare_name_under_the_drivers_qualified_key() -> None:
    device = _device("gpu-0", {f"{DRIVER}/index": {"int": 3}, "ready": {"bool": False}})
    assert device.typed_attribute("index") is None
    assert device.typed_attribute("index", bare_in_driver_domain=True) == ("int", 3)
    assert device.attribute("index") == 3
    assert device.attribute("ready") is False  # a false value is found, not taken for a missing one


def test_a_match_attribute_constraint_holds_only_for_the_same_typed_value_within_one_claim() -> None:
    body = claim("pair", [request("a"), request("b")],
                 constraints=[{"requests": ["a", "b"], "matchAttribute": f"{DRIVER}/numa"}])
    [[first], [second]] = requests_of(body, 0)
    constraints = body["spec"]["devices"]["constraints"]
    chosen = [(first, _device("gpu-0", {"numa": {"int": 1}}))]
    assert constraints_hold(constraints, _device("gpu-1", {"numa": {"int": 1}}), second, chosen)
    assert not constraints_hold(constraints, _device("gpu-2", {"numa": {"int": 0}}), second, chosen)
    assert not constraints_hold(constraints, _device("gpu-3", {"numa": {"string": "1"}}), second, chosen)
    assert not constraints_hold(constraints, _device("gpu-4", {}), second, chosen)  # no attribute, no match
    other_claim = [(requests_of(body, 1)[0][0], _device("gpu-0", {"numa": {"int": 1}}))]
    assert constraints_hold(constraints, _device("gpu-2", {"numa": {"int": 0}}), second, other_claim)
