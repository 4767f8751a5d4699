"""One grammar for durations: Go's time.ParseDuration, checked against a table Go itself produced.

The table's expected values came from running time.ParseDuration (Go 1.26) on each input and
printing int64(d), or None for an error; parse_nanoseconds must agree to the nanosecond.
"""

from __future__ import annotations

import functools
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from cel_expr_python import cel

from claimwarden import durations
from claimwarden.health import records

ROOT = Path(__file__).resolve().parents[2]

GO_PARSE_DURATION = [
    ("0", 0),
    ("+0", 0),
    ("-0", 0),
    ("", None),
    ("0s", 0),
    ("300ms", 300000000),
    ("-1.5h", -5400000000000),
    ("2h45m", 9900000000000),
    ("1h30m", 5400000000000),
    ("10m", 600000000000),
    ("45s", 45000000000),
    ("1.5h", 5400000000000),
    ("1m1h", 3660000000000),
    ("30m10h", 37800000000000),
    ("1234567s", 1234567000000000),
    (".5s", 500000000),
    ("5.s", 5000000000),
    ("1.s", 1000000000),
    (".s", None),
    (".", None),
    ("s", None),
    ("1", None),
    ("10", None),
    ("-", None),
    ("+5s", 5000000000),
    ("1d", None),
    ("1w", None),
    ("1y", None),
    ("1mm", None),
    ("1ns", 1),
    ("1us", 1000),
    ("1µs", 1000),
    ("1μs", 1000),
    ("1ms", 1000000),
    ("1.0000000001s", 1000000000),
    ("0.0000000005s", 0),
    ("1h1h", 7200000000000),
    ("2562047h", 9223369200000000000),
    ("2562048h", None),
    ("9223372036854775807ns", 9223372036854775807),
    ("9223372036854775808ns", None),
    ("-9223372036854775808ns", -9223372036854775808),
    (" 1m", None),
    ("1m ", None),
    ("1M", None),
    ("1e3s", None),
    ("1_000s", None),
    ("3.75ms", 3750000),
    ("1h2m3.4567s", 3723456700000),
    ("00001s", 1000000000),
    ("0.5m", 30000000000),
    ("-0s", 0),
    ("++1s", None),
    ("1.2.3s", None),
    ("0x10s", None),
    ("999999h", 3599996400000000000),
    ("12345678901234567890ns", None),
    ("0.3333333333333333333h", 1200000000000),
    ("1..5s", None),
    ("\uff11s", None),  # a fullwidth digit one
]


@pytest.mark.parametrize(("text", "nanoseconds"), GO_PARSE_DURATION)
def test_parse_nanoseconds_agrees_with_go(text: str, nanoseconds: int | None) -> None:
    if nanoseconds is None:
        with pytest.raises(durations.DurationError, match="Go's form"):
            durations.parse_nanoseconds(text)
    else:
        assert durations.parse_nanoseconds(text) == nanoseconds


def test_parse_refuses_negative_durations_unless_asked() -> None:
    with pytest.raises(durations.DurationError, match=r"'-1\.5h' is negative"):
        durations.parse("-1.5h")
    assert durations.parse("-1.5h", negative=True) == -timedelta(hours=1, minutes=30)
    assert durations.parse("-0") == timedelta(0)


def test_parse_truncates_to_the_microsecond_toward_zero() -> None:
    assert durations.parse("1999ns") == timedelta(microseconds=1)
    assert durations.parse("-1999ns", negative=True) == timedelta(microseconds=-1)


@pytest.mark.parametrize(("text", "seconds"), [
    ("300", 300.0), ("2.5", 2.5), ("0", 0.0), ("5m", 300.0), ("1h30m", 5400.0), ("250ms", 0.25), ("1e3", 1000.0)])
def test_parse_seconds_takes_a_plain_number_of_seconds_or_a_go_duration(text: str, seconds: float) -> None:
    assert durations.parse_seconds(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "5d", "nan", "inf", "-inf", "1e3s", "five"])
def test_parse_seconds_refuses_what_is_neither(text: str) -> None:
    with pytest.raises(durations.DurationError, match="Go's form"):
        durations.parse_seconds(text)


def test_parse_seconds_refuses_negatives_in_both_forms() -> None:
    for text in ("-5", "-5m"):
        with pytest.raises(durations.DurationError, match="negative"):
            durations.parse_seconds(text)
    assert durations.parse_seconds("-5m", negative=True) == -300.0


@pytest.mark.parametrize(("duration", "text"), [
    (timedelta(hours=1, minutes=30), "1h30m"), (timedelta(seconds=45), "45s"), (timedelta(0), "0s"),
    (timedelta(hours=2, seconds=5), "2h5s"), (timedelta(minutes=1, milliseconds=500), "1m0.5s"),
    (timedelta(milliseconds=250), "250ms"), (timedelta(microseconds=3), "3us"), (-timedelta(minutes=1), "-1m")])
def test_format_duration_writes_what_parse_reads_back(duration: timedelta, text: str) -> None:
    assert durations.format_duration(duration) == text
    assert durations.parse(text, negative=True) == duration


@functools.cache
def _crd_rules(path: Path, marker: str) -> list[str]:
    found: list[str] = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            found.extend(check["rule"] for check in node.get("x-kubernetes-validations", []) if marker in check["rule"])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(yaml.safe_load(path.read_text(encoding="utf-8")))
    return found


@functools.cache
def _compiled(rule: str) -> Any:
    return cel.NewEnv(variables={"self": cel.Type.STRING}).compile(rule)


# Where the CRDs and the parser may differ, by design: a sign on a duration of 0 or more (the CRDs
# refuse any sign, the parser reads "+5s" and "-0") and values past Go's int64 bound (a pattern cannot
# count; the parser refuses them).
_SIGNED_OR_PAST_BOUND = {"+0", "-0", "-0s", "+5s", "2562048h", "9223372036854775808ns", "12345678901234567890ns"}


@pytest.mark.parametrize(("text", "nanoseconds"), GO_PARSE_DURATION)
def test_the_crds_duration_and_drain_rules_accept_what_the_parser_accepts(text: str, nanoseconds: int | None) -> None:
    crds = ROOT / "crds"
    durations_rules = _crd_rules(crds / "healthpolicies.claimwarden.io.yaml", "self == '0' ||")
    drain_rules = (_crd_rules(crds / "healthpolicies.claimwarden.io.yaml", "EvictAfter=")
                   + _crd_rules(crds / "unhealthydevices.claimwarden.io.yaml", "EvictAfter="))
    assert len(durations_rules) == 4 and len(drain_rules) == 2
    if text in _SIGNED_OR_PAST_BOUND:
        return
    parsed = nanoseconds is not None and nanoseconds >= 0
    for rule in durations_rules:
        assert _compiled(rule).eval(data={"self": text}).value() == parsed, (rule, text)
    for rule in drain_rules:
        assert _compiled(rule).eval(data={"self": f"EvictAfter={text}"}).value() == parsed, (rule, text)
        assert (records.parse_drain(f"EvictAfter={text}") is not None) == parsed
