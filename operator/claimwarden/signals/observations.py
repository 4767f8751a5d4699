"""Observations: what a signal source saw about one device, as kept in its record's status.

An observation is a fact, never a decision: "the driver tainted gpu-3 with xid=79 at 12:00",
"pod p's container saw gpu-3 Unhealthy", "Alertmanager fired GPUXidError for gpu-3". The policy
(``policy``, ``decide``) turns them into a mark. Each source builds its own ``key`` so that seeing
the same thing again (a re-list, a restart, a second replica, Alertmanager re-sending) adds
nothing: the same (key, state) is the same observation.

A record keeps the newest ``OBSERVATIONS_MAX`` of them (the CRD's maxItems), sorted by time, so
that a device that flaps for days cannot grow its record without bound; ``decide`` keeps what it
must remember beyond that window in the record's history (``decide.History``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

from claimwarden.timestamps import parse_rfc3339

SOURCE_TAINT, SOURCE_POD, SOURCE_ALERT, SOURCE_NODE = "DriverTaint", "PodStatus", "Alertmanager", "NodeCondition"
SOURCES = (SOURCE_TAINT, SOURCE_POD, SOURCE_ALERT, SOURCE_NODE)
UNHEALTHY, HEALTHY, UNKNOWN = "Unhealthy", "Healthy", "Unknown"
STATES = (UNHEALTHY, HEALTHY, UNKNOWN)
OBSERVATIONS_MAX = 32
"""Observations kept per record (the newest); the CRD's maxItems."""
MESSAGE_MAX = VALUE_MAX = 256
SIGNAL_MAX = 253 + 1 + 63
"""The longest taint key (a qualified name: a 253-character DNS prefix, '/', a 63-character name), so that
no taint key is ever cut: a cut key would not match the taint and look removed. Alert names and condition
types are cut to it."""
KEY_MAX = 1024
"""The CRD's maxLengths: a longer field is cut when stored (`stored`), so that the status write is valid."""


@dataclass(frozen=True)
class Observation:
    """One thing one source saw about one device; each source documents its keys and times."""

    source: str    # one of SOURCES
    signal: str    # DriverTaint: taint key; PodStatus: "allocatedResourcesStatus"; Alertmanager: alertname;
                   # NodeCondition: condition type
    value: str     # DriverTaint: taint value ("" if none); PodStatus: the health; Alertmanager: label xid,
                   # else code, else ""; NodeCondition: the condition's status (True|False|Unknown)
    state: str     # UNHEALTHY | HEALTHY | UNKNOWN
    at: datetime   # when it happened (aware, UTC)
    key: str       # identity: the same (key, state) is the same observation
    message: str = ""


def format_at(moment: datetime) -> str:
    """RFC 3339 in UTC with a 'Z'; microseconds only when there are some, so a JSON round trip is exact."""
    moment = moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)
    if moment.microsecond:
        return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def stored(o: Observation) -> Observation:
    """The observation as its record keeps it: fields cut to the CRD's maxLengths (alert labels are unbounded)."""
    if (len(o.signal) <= SIGNAL_MAX and len(o.value) <= VALUE_MAX and len(o.key) <= KEY_MAX
            and len(o.message) <= MESSAGE_MAX):
        return o
    return replace(o, signal=o.signal[:SIGNAL_MAX], value=o.value[:VALUE_MAX], key=o.key[:KEY_MAX],
                   message=o.message[:MESSAGE_MAX])


def to_json(o: Observation) -> dict[str, str]:
    """The status.observations[] entry of an observation (as `stored` cuts it)."""
    o = stored(o)
    return {"source": o.source, "signal": o.signal, "value": o.value, "state": o.state,
            "at": format_at(o.at), "key": o.key, "message": o.message}


def from_json(d: Mapping[str, Any]) -> Observation | None:
    """An observation from its status entry; None for anything malformed (an older or hand-edited record)."""
    if not isinstance(d, Mapping):
        return None
    fields = {name: d.get(name) for name in ("source", "signal", "value", "state", "key")}
    if not all(isinstance(value, str) for value in fields.values()):
        return None
    source, signal, value, state, key = (str(fields[name]) for name in ("source", "signal", "value", "state", "key"))
    message = d.get("message", "")
    at = parse_rfc3339(d.get("at"))
    if at is None or not isinstance(message, str) or source not in SOURCES or state not in STATES or not key \
            or not signal:
        return None
    return stored(Observation(source=source, signal=signal, value=value, state=state, at=at.astimezone(UTC),
                              key=key, message=message))


def observations_from_json(entries: object) -> list[Observation]:
    """The well-formed observations of a status.observations list (malformed entries dropped)."""
    if not isinstance(entries, list):
        return []
    return [o for o in map(from_json, entries) if o is not None]


def _order(o: Observation) -> tuple[datetime, str, str]:
    return (o.at, o.key, o.state)


def merge(existing: Sequence[Observation], new: Iterable[Observation],
          limit: int = OBSERVATIONS_MAX) -> tuple[list[Observation], list[Observation]]:
    """(merged, added): merged sorted by (at, key), the newest `limit` kept; added: those of `new`
    not already present by (key, state) and kept in merged, as `stored` cuts them.

    One that would fall off at once (older than the `limit` kept) is not "added": a source that
    sees it again then adds nothing, and its record is not rewritten in a loop.
    """
    seen = {(o.key, o.state) for o in existing}
    fresh: list[Observation] = []
    for o in map(stored, new):
        if (o.key, o.state) not in seen:
            seen.add((o.key, o.state))
            fresh.append(o)
    merged = sorted([*existing, *fresh], key=_order)[-limit:] if limit > 0 else []
    kept = set(map(id, merged))
    return merged, [o for o in fresh if id(o) in kept]


def latest_by_key(observations: Iterable[Observation]) -> dict[str, Observation]:
    """The newest observation of every key (by time; at the same time, the later one in the input)."""
    latest: dict[str, Observation] = {}
    for o in observations:
        current = latest.get(o.key)
        if current is None or o.at >= current.at:
            latest[o.key] = o
    return latest
