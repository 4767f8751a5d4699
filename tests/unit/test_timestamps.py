"""The one RFC 3339 parser: every form RFC 3339 allows, nothing else."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest

from claimwarden.timestamps import format_rfc3339, parse_rfc3339

NOON = datetime(2025, 1, 31, 12, 0, 0, tzinfo=UTC)


@pytest.mark.parametrize(("text", "expected"), [
    ("2025-01-31T12:00:00Z", NOON),
    ("2025-01-31t12:00:00z", NOON),
    ("2025-01-31t12:00:00Z", NOON),
    ("2025-01-31T12:00:00z", NOON),
    ("2025-01-31T13:30:00+01:30", NOON),
    ("2025-01-31T07:00:00-05:00", NOON),
    ("2025-01-31T12:00:00.5Z", NOON + timedelta(milliseconds=500)),
    ("2025-01-31T12:00:00.000000Z", NOON),
    ("2025-01-31T12:00:00.123456789z", NOON + timedelta(microseconds=123456)),
    ("2025-01-31t13:00:00.25+01:00", NOON + timedelta(milliseconds=250)),
])
def test_accepts_every_rfc3339_form(text: str, expected: datetime) -> None:
    parsed = parse_rfc3339(text)
    assert parsed == expected
    assert parsed is not None and parsed.tzinfo is not None


@pytest.mark.parametrize("text", [
    None, "", 17, "garbage", "2025-01-31", "2025-01-31T12:00:00", "2025-01-31 12:00:00Z",
    "2025-01-31T12:00Z", "2025-13-31T12:00:00Z", "2025-01-31T25:00:00Z", "2025-01-31T12:00:00+0100",
    "2025-01-31T12:00:00.Z", " 2025-01-31T12:00:00Z", "2025-01-31T12:00:00Z ", "2025-01-31T12:00:00ZZ",
])
def test_rejects_anything_else(text: object) -> None:
    assert parse_rfc3339(text) is None


def test_format_writes_utc_with_z_and_round_trips() -> None:
    moment = datetime(2025, 1, 31, 13, 0, 0, 999, tzinfo=timezone(timedelta(hours=1)))
    assert format_rfc3339(moment) == "2025-01-31T12:00:00Z"
    assert format_rfc3339(NOON.replace(tzinfo=None)) == "2025-01-31T12:00:00Z"
    assert parse_rfc3339(format_rfc3339(NOON)) == NOON
