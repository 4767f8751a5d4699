"""Durations, in one grammar everywhere: Go's, as ``metav1.Duration`` (``time.ParseDuration``) reads it.

A duration is an optional sign and one or more numbers with a unit: ``300ms``, ``45s``, ``10m``,
``1h30m``, ``1.5h``, ``-2h45m``. Units are ``ns``, ``us`` (also ``µs``), ``ms``, ``s``, ``m`` and
``h``; a number may have a fraction (``.5s``, ``1.s``); parts may come in any order and repeat
(``30m10h`` is 10h30m); ``0`` alone needs no unit; anything else (empty, spaces, ``1d``, a bare
number) is not a duration. The value must fit Go's int64 of nanoseconds (about 2562047h).

The same text means the same thing in a HealthPolicy, in a record's ``EvictAfter=``, in the
plugin's flags and in ``claimwarden run``'s flags; the CRDs' patterns accept the same texts (but
for the int64 bound, which only the parser checks). Where a negative duration makes no sense
(everywhere so far), `parse` refuses it by default. Flags that took a plain number of seconds
before keep taking one (`parse_seconds`).

Kept apart from durationpy, which the kubernetes client brings: that reads days, weeks and years,
digits of other scripts and values beyond Go's bound, so a text claimwarden accepted could be one
the API server (or kubectl) refuses.
"""

from __future__ import annotations

import math
from datetime import timedelta
from typing import TypeVar

GRAMMAR = "Go's form: numbers with units ns, us, ms, s, m or h, such as 300ms, 1.5h or 2h45m; 0 alone needs no unit"

_UNITS = {"ns": 1, "us": 1_000, "µs": 1_000, "μs": 1_000, "ms": 1_000_000, "s": 1_000_000_000,
          "m": 60_000_000_000, "h": 3_600_000_000_000}
_LIMIT = 1 << 63  # Go's Duration is an int64 of nanoseconds
_DIGITS = "0123456789"
_Number = TypeVar("_Number", int, float)


class DurationError(ValueError):
    """Not a duration (the message names the grammar), or a negative one where none makes sense."""


def parse_nanoseconds(text: str) -> int:
    """The nanoseconds of a Go duration, exactly as time.ParseDuration computes them (fractions truncated)."""
    rest = text
    negative = False
    if rest[:1] in ("-", "+"):
        negative, rest = rest[0] == "-", rest[1:]
    if rest == "0":
        return 0
    if not rest:
        raise _not_a_duration(text)
    total = 0
    while rest:
        whole, rest = _leading_digits(rest)
        fraction = ""
        if rest[:1] == ".":
            fraction, rest = _leading_digits(rest[1:])
        if not whole and not fraction:
            raise _not_a_duration(text)  # ".s", or a unit with no number
        unit_end = next((i for i, c in enumerate(rest) if c == "." or c in _DIGITS), len(rest))
        unit = _UNITS.get(rest[:unit_end])
        if unit is None:
            raise _not_a_duration(text)
        rest = rest[unit_end:]
        value = int(whole or "0")
        if value > _LIMIT // unit:
            raise _not_a_duration(text)
        value *= unit
        numerator, scale = _fraction(fraction)
        if numerator:
            # As Go does: float64 keeps fractions of an hour nanosecond-exact.
            value += int(float(numerator) * (float(unit) / scale))
        total += value
        if total > _LIMIT:
            raise _not_a_duration(text)
    if negative:
        return -total
    if total > _LIMIT - 1:
        raise _not_a_duration(text)
    return total


def parse(text: str, *, negative: bool = False) -> timedelta:
    """A Go duration as a timedelta (to the microsecond, truncated); negative ones only with ``negative``."""
    nanoseconds = _signed(parse_nanoseconds(text), text, negative=negative)
    micro = abs(nanoseconds) // 1000
    return timedelta(microseconds=-micro if nanoseconds < 0 else micro)


def parse_seconds(text: str, *, negative: bool = False) -> float:
    """Seconds from a plain number (what the flags took before Go durations) or from a Go duration."""
    try:
        seconds = float(text)
    except ValueError:
        return _signed(parse_nanoseconds(text), text, negative=negative) / 1e9
    if not math.isfinite(seconds):  # float() reads "nan" and "inf"
        raise _not_a_duration(text)
    return _signed(seconds, text, negative=negative)


def format_duration(duration: timedelta) -> str:
    """A duration as Go's grammar reads it, shortest first: "1h30m", "45s", "1m0.5s", "250ms", "0s"."""
    micro = abs(duration // timedelta(microseconds=1))
    sign = "-" if duration < timedelta(0) else ""
    if micro == 0:
        return "0s"
    if micro < 1_000_000:
        return sign + (f"{micro // 1000}ms" if micro % 1000 == 0 else f"{micro}us")
    seconds, micro = divmod(micro, 1_000_000)
    hours, rest = divmod(seconds, 3600)
    minutes, seconds = divmod(rest, 60)
    text = "".join(f"{value}{unit}" for value, unit in ((hours, "h"), (minutes, "m")) if value)
    if micro:
        text += f"{seconds}.{micro:06d}".rstrip("0") + "s"
    elif seconds:
        text += f"{seconds}s"
    return sign + text


def _leading_digits(text: str) -> tuple[str, str]:
    end = next((i for i, c in enumerate(text) if c not in _DIGITS), len(text))
    return text[:end], text[end:]


def _fraction(digits: str) -> tuple[int, float]:
    """The fraction's digits as Go's leadingFraction reads them: digits past int64's precision are dropped."""
    value, scale = 0, 1.0
    for digit in digits:
        following = value * 10 + int(digit)
        if value > (_LIMIT - 1) // 10 or following > _LIMIT:
            break
        value, scale = following, scale * 10
    return value, scale


def _signed(value: _Number, text: str, *, negative: bool) -> _Number:
    if value < 0 and not negative:
        raise DurationError(f"{text!r} is negative; a duration of 0 or more is needed")
    return value


def _not_a_duration(text: str) -> DurationError:
    return DurationError(f"{text!r} is not a duration like 1h30m, 10m or 45s ({GRAMMAR})")
