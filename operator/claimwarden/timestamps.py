"""RFC 3339 timestamps, as the Kubernetes API writes and accepts them: the one parser and formatter."""

from __future__ import annotations

import datetime
import re

_RFC3339 = re.compile(r"^\d{4}-\d{2}-\d{2}[Tt]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})$")


def now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def parse_rfc3339(text: object) -> datetime.datetime | None:
    """An RFC 3339 date-time ('T'/'t', 'Z'/'z' or an offset, optional fraction) as an aware datetime, else None."""
    if not isinstance(text, str) or not _RFC3339.match(text):
        return None
    try:
        return datetime.datetime.fromisoformat(text.upper().replace("Z", "+00:00"))
    except ValueError:
        return None


def format_rfc3339(moment: datetime.datetime) -> str:
    """`moment` in UTC with second precision, as the API writes timestamps."""
    return moment.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
