"""RFC 3339 timestamps, the one parser and the one formatter claimwarden uses.

Kubernetes writes ``2025-01-31T12:00:00Z`` (and ``.000000Z`` for micro-times), but a user's
``spec.expiresAt`` may be any RFC 3339 date-time: ``t`` and ``z`` in lower case (RFC 3339 §5.6,
NOTE), an offset instead of ``Z``, and any number of fractional digits (nanoseconds are kept to
the microsecond). Python 3.11's ``datetime.fromisoformat`` rejects a lower-case ``z`` and accepts
ISO forms that RFC 3339 does not (a space for the ``T``, no offset), so the shape is checked here
first.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime

_RFC3339 = re.compile(r"^(\d{4}-\d{2}-\d{2})[Tt](\d{2}:\d{2}:\d{2})(?:\.(\d+))?([Zz]|[+-]\d{2}:\d{2})$")


def parse_rfc3339(text: object) -> datetime | None:
    """An RFC 3339 date-time as an aware datetime; None for None, "", non-strings and anything else."""
    if not isinstance(text, str):
        return None
    match = _RFC3339.match(text)
    if match is None:
        return None
    date, time, fraction, offset = match.groups()
    fraction = f".{fraction[:6].ljust(6, '0')}" if fraction else ""
    offset = "+00:00" if offset in ("Z", "z") else offset
    try:
        return datetime.fromisoformat(f"{date}T{time}{fraction}{offset}")
    except ValueError:  # e.g. month 13 or hour 25
        return None


def format_rfc3339(moment: datetime) -> str:
    """Second precision in UTC with a 'Z', as Kubernetes writes metav1.Time (a naive moment is taken as UTC)."""
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def now_rfc3339() -> str:
    """The current time, formatted as above."""
    return format_rfc3339(datetime.now(UTC))


def now() -> datetime:
    """The current time, aware, in UTC."""
    return datetime.now(UTC)
