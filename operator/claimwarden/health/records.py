"""UnhealthyDevice records: what they are called, what their spec says, and the drain grammar.

A record names one device (``DeviceRef``: driver, pool, device) under a deterministic name
(``record_name``) and carries its effect, drain mode, source, reason and expiry in its spec. How slice
annotations turn into records is slice_marks.py.

Pure functions over plain dicts in the raw Kubernetes JSON shape; nothing here talks to the API.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from claimwarden import durations
from claimwarden.durations import format_duration
from claimwarden.objects.meta import metadata, spec
from claimwarden.timestamps import parse_rfc3339

GROUP = "claimwarden.io"
VERSION = "v1alpha1"
PLURAL = "unhealthydevices"
KIND = "UnhealthyDevice"
API_VERSION = f"{GROUP}/{VERSION}"

ANNOTATION_PREFIX = "unhealthy.claimwarden.io/"
DRAIN_ANNOTATION_PREFIX = "drain.claimwarden.io/"
TAINT_KEY = "claimwarden.io/unhealthy"
TAINT_VALUE = "unhealthy"
"""The value of every claimwarden taint, simulated (eviction) or published (DeviceTaintRule) alike,
so one `Equal` toleration means the same thing to the scheduler and to claimwarden."""

EFFECTS = ("NoExecute", "NoSchedule", "None")
DEFAULT_EFFECT = "NoExecute"
SOURCE_ANNOTATION = "annotation"
SOURCE_MANUAL = "manual"
SOURCE_SIBLING = "sibling"
"""A record the leader derived for a sibling of a marked whole device (siblings.py)."""
SLICE_LABEL = "claimwarden.io/slice"
RECORD_LABEL = "claimwarden.io/record"

REASON_MAX = 1024
NAME_MAX = 253
LABEL_VALUE_MAX = 63
DNS_LABEL_MAX = 63
HASH_LENGTH = 8

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_NOT_NAME_CHAR = re.compile(r"[^a-z0-9.-]")
_NOT_LABEL_CHAR = re.compile(r"[^A-Za-z0-9_.-]")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")

DRAIN_IMMEDIATE = "Immediate"
DRAIN_ALLOW_COMPLETION = "AllowCompletion"
DRAIN_EVICT_AFTER = "EvictAfter"
DRAIN_NODE = "Node"  # the record's whole node, in the drain order (health/node_drain.py)
DRAIN_SYNTAX = ("Immediate, AllowCompletion, Node or EvictAfter=<duration> "
                "(like EvictAfter=30m, EvictAfter=1h30m, EvictAfter=45s: a Go duration, durations.py)")


@dataclass(frozen=True)
class DeviceRef:
    """The identity of one device: its driver, pool and name."""

    driver: str
    pool: str
    device: str

    def __str__(self) -> str:
        return f"{self.driver}/{self.pool}/{self.device}"


# --- names --------------------------------------------------------------------------------------

def short_hash(text: str) -> str:
    """The first 8 hex digits of the SHA-256 of `text`."""
    return hashlib.sha256(text.encode()).hexdigest()[:HASH_LENGTH]


def is_dns_label(text: str) -> bool:
    """True for a valid DNS-1123 label: 1-63 lowercase alphanumerics or '-', alphanumeric at both ends."""
    return len(text) <= DNS_LABEL_MAX and bool(_DNS_LABEL.match(text))


def to_subdomain_part(text: str, limit: int) -> str:
    """`text` made into at most `limit` characters of a DNS-1123 subdomain ("" when nothing is left).

    Lower-cases, replaces every other character than alphanumerics, '-' and '.' by '-', drops empty
    dot-separated labels and the hyphens at either end of each label.
    """
    cleaned = _clean_labels(_NOT_NAME_CHAR.sub("-", text.lower()))
    return _clean_labels(cleaned[:limit])


def _clean_labels(text: str) -> str:
    return ".".join(label.strip("-") for label in text.split(".") if label.strip("-"))


def truncate_name(name: str, limit: int) -> str:
    """`name` cut to `limit` characters, without a trailing '-' or '.' left by the cut."""
    return name if len(name) <= limit else name[:limit].rstrip("-.")


def record_name(ref: DeviceRef, *, salt: str = "") -> str:
    """The deterministic UnhealthyDevice name of a device: `<pool>.<device>.<hash>`.

    `salt` goes before the hash input: the signals' record of a device (``signals/``) is another object than
    its annotation record, so that each source deletes only its own.

    The hash (of driver, pool and device) keeps devices of different drivers apart when their pool
    and device names are the same, and keeps cleaned-up or shortened names unique. The pool part
    is shortened first so the device name stays readable.
    """
    device = to_subdomain_part(ref.device, DNS_LABEL_MAX)
    room_for_pool = NAME_MAX - HASH_LENGTH - 1 - (len(device) + 1 if device else 0)
    pool = to_subdomain_part(ref.pool, room_for_pool)
    parts = [part for part in (pool, device) if part]
    return ".".join([*parts, short_hash(f"{salt}{ref.driver}/{ref.pool}/{ref.device}")])


def label_value(name: str) -> str:
    """`name` as a valid label value (at most 63 characters), for SLICE_LABEL and RECORD_LABEL.

    A name that is already a valid label value is kept; any other (object names may be up to 253
    characters long) becomes its cleaned start plus a hash of the whole name, so two long names
    stay distinct. Label selectors must go through the same function.
    """
    if len(name) <= LABEL_VALUE_MAX and _LABEL_VALUE.match(name):
        return name
    head = _NOT_LABEL_CHAR.sub("-", name)[: LABEL_VALUE_MAX - HASH_LENGTH - 1].strip("-_.")
    return f"{head}-{short_hash(name)}" if head else short_hash(name)


# --- records ------------------------------------------------------------------------------------

def record_ref(record: dict[str, Any]) -> DeviceRef | None:
    """The device a record names, or None when spec.driver, spec.pool or spec.device is missing."""
    body = spec(record)
    driver, pool, device = body.get("driver"), body.get("pool"), body.get("device")
    if not (driver and pool and device):
        return None
    return DeviceRef(str(driver), str(pool), str(device))


def record_effect(record: dict[str, Any]) -> str:
    """The record's effect: NoExecute, NoSchedule or None (NoExecute when unset)."""
    return str(spec(record).get("effect") or DEFAULT_EFFECT)


@dataclass(frozen=True)
class Drain:
    """How a NoExecute record empties its device (spec.drain)."""

    mode: str  # DRAIN_IMMEDIATE, DRAIN_ALLOW_COMPLETION, DRAIN_NODE or DRAIN_EVICT_AFTER
    after: timedelta | None = None  # EvictAfter only

    def __str__(self) -> str:
        if self.mode != DRAIN_EVICT_AFTER or self.after is None:
            return self.mode
        return f"{DRAIN_EVICT_AFTER}={format_duration(self.after)}"


def parse_drain(text: str) -> Drain | None:
    """`Immediate`, `AllowCompletion`, `Node` or `EvictAfter=<Go duration of 0 or more>`; None for anything else.

    The CRDs' rules for spec.drain accept the same texts: keep the two in step.
    """
    if text in (DRAIN_IMMEDIATE, DRAIN_ALLOW_COMPLETION, DRAIN_NODE):
        return Drain(text)
    mode, equals, after = text.partition("=")
    if mode != DRAIN_EVICT_AFTER or not equals:
        return None
    try:
        return Drain(DRAIN_EVICT_AFTER, durations.parse(after))
    except durations.DurationError:
        return None


def record_drain(record: dict[str, Any]) -> Drain:
    """The record's spec.drain (Immediate when unset).

    The CRD refuses other values; one that got in anyway (an older CRD) counts as AllowCompletion,
    the side that evicts nothing.
    """
    raw = spec(record).get("drain")
    if not raw:
        return Drain(DRAIN_IMMEDIATE)
    return parse_drain(str(raw)) or Drain(DRAIN_ALLOW_COMPLETION)


def record_source(record: dict[str, Any]) -> str:
    """Who made the record: "annotation", "manual", ... ("manual" when unset, like the CRD default)."""
    return str(spec(record).get("source") or SOURCE_MANUAL)


def record_reason(record: dict[str, Any]) -> str:
    """The record's spec.reason, or ""."""
    return str(spec(record).get("reason") or "")


def is_from_annotation(record: dict[str, Any]) -> bool:
    """True for a record claimwarden made from a slice annotation (and so may update or delete)."""
    return record_source(record) == SOURCE_ANNOTATION


def expiry_error(record: dict[str, Any]) -> str | None:
    """Why spec.expiresAt cannot be used (then the record never expires), or None when it is fine or unset."""
    raw = spec(record).get("expiresAt")
    if raw is None or raw == "":
        return None
    if parse_rfc3339(raw) is None:
        return (f"spec.expiresAt {raw!r} is not an RFC 3339 date-time (like 2025-01-31T12:00:00Z); "
                "the record never expires")
    return None


def expires_at(record: dict[str, Any]) -> datetime | None:
    """The record's parsed spec.expiresAt, or None when unset or unparsable."""
    raw = spec(record).get("expiresAt")
    return parse_rfc3339(raw)


def marked_at(record: dict[str, Any]) -> datetime | None:
    """When the record's device was marked: its status.markedAt, else its creationTimestamp (None when neither
    parses)."""
    return parse_rfc3339((record.get("status") or {}).get("markedAt")) or parse_rfc3339(
        metadata(record).get("creationTimestamp"))


def is_expired(record: dict[str, Any], now: datetime) -> bool:
    """True when spec.expiresAt is set, parsable and not after `now` (a naive `now` is taken as UTC)."""
    expiry = expires_at(record)
    if expiry is None:
        return False
    if now.tzinfo is None:
        now = now.replace(tzinfo=UTC)
    return expiry <= now
