"""The CEL adapter with plain data: upstream's device variable, domains, quantity, semver, errors."""

from __future__ import annotations

from decimal import Decimal

import pytest

from claimwarden.cel import (
    CelError,
    Evaluator,
    device_input,
    parse_quantity,
    parse_semver,
    rewrite_unknown_domains,
)

DRIVER = "gpu.example.com"
DEVICE = {
    "name": "gpu-0",
    "attributes": {"model": {"string": "H100"}, "index": {"int": 3}, "healthy": {"bool": True},
                   "driverVersion": {"version": "1.2.3"}, "other.example.com/rack": {"string": "r1"}},
    "capacity": {"memory": {"value": "80Gi"}, "compute": {"value": "132"}},
}
A = f'device.attributes["{DRIVER}"]'
C = f'device.capacity["{DRIVER}"]'


@pytest.fixture(scope="module")
def evaluator() -> Evaluator:
    return Evaluator()


def run(evaluator: Evaluator, expression: str, device: dict | None = None) -> bool:  # type: ignore[type-arg]
    return evaluator.compile(expression).matches(device_input(DRIVER, device or DEVICE))


@pytest.mark.parametrize(("expression", "expected"), [
    ("device.driver == 'gpu.example.com'", True),
    (f'{A}.model == "H100"', True),
    (f"{A}.index > 2 && {A}.healthy", True),
    (f"{A}.index > 2.5", True),  # int against double, as k8s allows
    ('device.attributes["other.example.com"].rack == "r1"', True),
    # a domain the device does not have is an empty map (Go's default), in both forms
    ('has(device.attributes["nvidia.com"].model)', False),
    ("has(device.attributes.nvidia.model)", False),
    ('"nvidia.com" in device.attributes', False),
    (f'"{DRIVER}" in device.attributes', True),
    (f'{C}.memory.compareTo(quantity("40Gi")) > 0', True),
    (f'{C}.memory.isGreaterThan(quantity("80Gi"))', False),
    (f'{C}.memory.isLessThan(quantity("81Gi"))', True),
    (f'{C}.memory == quantity("81920Mi")', True),
    (f"{C}.compute.asInteger() == 132", True),
    (f"{C}.compute.isInteger()", True),
    (f'{C}.memory.add(quantity("16Gi")) == quantity("96Gi")', True),
    (f'{C}.memory.sub(quantity("16Gi")).isLessThan(quantity("65Gi"))', True),
    (f"{C}.compute.asApproximateFloat() > 131.5", True),
    ('isQuantity("1.5Gi") && !isQuantity("Gi")', True),
    (f'{A}.driverVersion.isGreaterThan(semver("1.2.0"))', True),
    (f'{A}.driverVersion.isLessThan(semver("1.2.3"))', False),
    (f'{A}.driverVersion.compareTo(semver("1.2.3-rc.1")) == 1', True),  # a release sorts after its rc
    (f'{A}.driverVersion == semver("1.2.3+build.7")', True),  # build metadata is ignored, as Version.EQ
    (f'{A}.driverVersion == semver("v1.2.3", true)', True),
    (f"{A}.driverVersion.major() == 1 && {A}.driverVersion.minor() == 2 && {A}.driverVersion.patch() == 3", True),
    ('isSemver("1.0.0") && !isSemver("1.0") && isSemver("v1.0", true)', True),
    (f'cel.bind(m, {A}.model, m == "H100" || m == "A100")', True),
    (f'{A}.model.lowerAscii() == "h100"', True),
    (f'{A}.model.matches("^H[0-9]+$")', True),
    (f"false && {A}.nope == 1", False),  # errors are absorbed by && and ||, as in cel-go
    (f"true || {A}.nope == 1", True),
    (f'{A}.model == "H100" // a comment with device.attributes["x"]', True),
])
def test_selectors(evaluator: Evaluator, expression: str, expected: bool) -> None:
    assert run(evaluator, expression) is expected


@pytest.mark.parametrize(("expression", "message"), [
    (f"{A}.nope == 1", "no such key: nope"),
    ('device.attributes["nvidia.com"].model == "x"', "no such key: model"),
    (f'{A}.nope == 1 || {A}.model == "B100"', "no such key: nope"),
    (f'{C}.memory.compareTo(semver("1.0.0")) > 0', "no such overload"),
    ('quantity("12 Gi").sign() == 1', "quantities must match"),
    ('semver("1.0") == semver("1.0.0")', "invalid semver"),
])
def test_runtime_errors_are_errors(evaluator: Evaluator, expression: str, message: str) -> None:
    with pytest.raises(CelError, match=message):
        run(evaluator, expression)


@pytest.mark.parametrize(("expression", "message"), [
    ("device.attributes[", "compile error"),
    ("noSuchVariable == 1", "undeclared reference"),
    ("1 + 1", "must evaluate to bool"),
    ("", "empty"),
])
def test_compile_errors(evaluator: Evaluator, expression: str, message: str) -> None:
    with pytest.raises(CelError, match=message):
        evaluator.compile(expression)


def test_a_dyn_result_that_is_not_bool_errors(evaluator: Evaluator) -> None:
    with pytest.raises(CelError, match="could not be converted to bool"):
        run(evaluator, f"{A}.index")


def test_an_attribute_go_cannot_convert_makes_every_selector_error(evaluator: Evaluator) -> None:
    broken = {**DEVICE, "attributes": {**DEVICE["attributes"], "driverVersion": {"version": "1.2"}}}  # type: ignore[dict-item]
    with pytest.raises(CelError, match="attribute driverVersion"):
        run(evaluator, "device.driver == 'gpu.example.com'", broken)
    empty = {**DEVICE, "attributes": {"x": {}}}
    with pytest.raises(CelError, match="unsupported attribute value"):
        run(evaluator, "true", empty)


def test_rewrite_leaves_strings_in_and_size_alone() -> None:
    text = '"device.attributes[x]" == "a" && "d" in device.attributes && size(device.capacity) > 0'
    assert rewrite_unknown_domains(text) == text
    assert rewrite_unknown_domains('device.attributes["d"].a') == 'device.attributes[?"d"].orValue({}).a'
    assert rewrite_unknown_domains("device.capacity.d.a") == 'device.capacity[?"d"].orValue({}).a'


@pytest.mark.parametrize(("text", "value"), [
    ("1Gi", Decimal(2**30)), ("500m", Decimal("0.5")), ("1e3", Decimal(1000)), ("1.5k", Decimal(1500)),
    ("24Gi", Decimal(24 * 2**30)), ("-2", Decimal(-2)),
])
def test_quantities(text: str, value: Decimal) -> None:
    assert parse_quantity(text) == value


def test_semver_strict_and_normalized() -> None:
    assert parse_semver("1.2.3-rc.1+b") == (1, 2, 3, "rc.1")
    assert parse_semver("v01.2", normalize=True) == (1, 2, 0, "")
    with pytest.raises(ValueError):
        parse_semver("01.2.3")
