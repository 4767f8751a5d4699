"""UnhealthyDevice records: their names, their fields, and how slice annotations turn into them.

Pure functions over plain dicts in the raw Kubernetes JSON shape; nothing here talks to the API.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from claimwarden import durations
from claimwarden.durations import format_duration
from claimwarden.objects.meta import is_being_deleted, metadata, spec
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
LISTED_DEVICES_MAX = 10

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


def is_expired(record: dict[str, Any], now: datetime) -> bool:
    """True when spec.expiresAt is set, parsable and not after `now` (a naive `now` is taken as UTC)."""
    expiry = expires_at(record)
    if expiry is None:
        return False
    if now.tzinfo is None:
        now = now.replace(tzinfo=UTC)
    return expiry <= now


# --- slice annotations --------------------------------------------------------------------------

@dataclass(frozen=True)
class SliceMark:
    """One valid `unhealthy.claimwarden.io/<device>: <reason>` annotation of a ResourceSlice."""

    ref: DeviceRef
    reason: str
    slice_name: str
    drain: str = DRAIN_IMMEDIATE
    """From the slice's `drain.claimwarden.io/<device>` annotation, when it has one."""


@dataclass(frozen=True)
class MarkError:
    """One annotation of ours that cannot be used; reported as a Warning Event on the slice."""

    slice_name: str
    key: str
    message: str


def slice_name(slice_: dict[str, Any]) -> str:
    """The slice's metadata.name, or ""."""
    return str(metadata(slice_).get("name") or "")


def slice_pool(slice_: dict[str, Any]) -> str:
    """The slice's spec.pool.name, or ""."""
    return str((spec(slice_).get("pool") or {}).get("name") or "")


def slice_devices(slice_: dict[str, Any]) -> list[str]:
    """The names of the devices a slice lists, in its order."""
    return [str(device["name"]) for device in spec(slice_).get("devices") or [] if device.get("name")]


def marked_device(key: str) -> str | None:
    """The device part of an annotation key of ours, or None when the key is not ours."""
    return key[len(ANNOTATION_PREFIX):] if key.startswith(ANNOTATION_PREFIX) else None


def marked_annotations(slice_: dict[str, Any]) -> dict[str, str]:
    """The slice's annotations whose key starts with ANNOTATION_PREFIX."""
    annotations = metadata(slice_).get("annotations") or {}
    return {str(key): str(value) for key, value in annotations.items() if str(key).startswith(ANNOTATION_PREFIX)}


def parse_slice_marks(slice_: dict[str, Any]) -> tuple[list[SliceMark], list[MarkError]]:
    """The valid marks of a slice and the errors of the invalid ones, both sorted by device / key."""
    name = slice_name(slice_)
    driver, pool = str(spec(slice_).get("driver") or ""), slice_pool(slice_)
    listed = slice_devices(slice_)
    marks: list[SliceMark] = []
    errors: list[MarkError] = []
    annotations = metadata(slice_).get("annotations") or {}
    for key, value in marked_annotations(slice_).items():
        device = marked_device(key) or ""
        problem = _mark_problem(key, device, value, name, driver, pool, listed)
        drain_key = DRAIN_ANNOTATION_PREFIX + device
        drain = str(annotations.get(drain_key) or DRAIN_IMMEDIATE).strip()
        if problem is None and parse_drain(drain) is None:
            problem = f"annotation {drain_key!r}: {drain!r} is not a drain mode; use {DRAIN_SYNTAX}"
            key = drain_key
        if problem:
            errors.append(MarkError(name, key, problem))
        else:
            marks.append(SliceMark(DeviceRef(driver, pool, device), value.strip(), name, str(parse_drain(drain))))
    marks.sort(key=lambda mark: mark.ref.device)
    errors.sort(key=lambda error: error.key)
    return marks, errors


def _mark_problem(key: str, device: str, value: str, slice_: str, driver: str, pool: str,
                  listed: list[str]) -> str | None:
    if not is_dns_label(device):
        return (f"annotation {key!r}: the part after {ANNOTATION_PREFIX!r} must be a device name "
                f"(a DNS label: 1-63 lowercase letters, digits or '-'), got {device!r}")
    if not driver or not pool:
        return f"annotation {key!r}: ResourceSlice {slice_!r} has no spec.driver or spec.pool.name"
    if device not in listed:
        return (f"annotation {key!r}: device {device!r} is not listed by ResourceSlice {slice_!r}; "
                f"it lists {describe_devices(listed)}")
    reason = value.strip()
    if not reason:
        return f"annotation {key!r}: the value must be the reason why device {device!r} is unhealthy"
    if len(reason) > REASON_MAX:
        return f"annotation {key!r}: the reason is {len(reason)} characters long, at most {REASON_MAX} are allowed"
    return None


def describe_devices(names: list[str]) -> str:
    """Up to 10 device names for a message, e.g. "gpu-0, gpu-1 (and 6 more)" or "no devices"."""
    if not names:
        return "no devices"
    ordered = sorted(names)
    shown = ", ".join(ordered[:LISTED_DEVICES_MAX])
    hidden = len(ordered) - LISTED_DEVICES_MAX
    return f"{shown} (and {hidden} more)" if hidden > 0 else shown


def record_body(mark: SliceMark) -> dict[str, Any]:
    """The UnhealthyDevice to create for a slice annotation."""
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": record_name(mark.ref), "labels": {SLICE_LABEL: label_value(mark.slice_name)}},
        "spec": {
            "driver": mark.ref.driver,
            "pool": mark.ref.pool,
            "device": mark.ref.device,
            "effect": DEFAULT_EFFECT,
            "reason": mark.reason,
            "source": SOURCE_ANNOTATION,
            "drain": mark.drain,
        },
    }


# --- syncing a slice's marks with the records ---------------------------------------------------

@dataclass(frozen=True)
class SliceSync:
    """What to change in the records so they match one slice's annotations."""

    create: tuple[dict[str, Any], ...] = ()
    """Record bodies to create."""
    update_reason: tuple[tuple[str, str], ...] = ()
    """(record name, new reason) of annotation records whose reason changed."""
    update_drain: tuple[tuple[str, str], ...] = ()
    """(record name, new drain) of annotation records whose drain annotation changed."""
    delete: tuple[str, ...] = ()
    """Names of annotation records of this slice whose annotation is gone."""
    relabel: tuple[tuple[str, str], ...] = ()
    """(record name, slice name) of annotation records that now follow another slice (`follow_marks`)."""
    errors: tuple[MarkError, ...] = ()


def plan_slice(slice_: dict[str, Any], records: Mapping[str, dict[str, Any]],
               pool_slices: Iterable[dict[str, Any]] = ()) -> SliceSync:
    """Compare one slice's marks with the existing records (name → record).

    A record that exists for a marked device under another name than `record_name` (an admin's)
    counts as that device's record. Records made by hand are never updated or deleted here. A
    device whose annotation is present but invalid (for example an emptied reason) keeps its
    record: a bad annotation changes nothing. `pool_slices`: the current slices of the same driver
    and pool (this one may be among them); which slice a record follows is `follow_marks`'s decision.
    """
    marks, errors = parse_slice_marks(slice_)
    by_ref = records_by_ref(records)
    create: list[dict[str, Any]] = []
    update: list[tuple[str, str]] = []
    update_drain: list[tuple[str, str]] = []
    for mark in marks:
        found = _existing_record(mark.ref, records, by_ref)
        if found is None:
            create.append(record_body(mark))
            continue
        name, record = found
        if is_from_annotation(record) and not is_being_deleted(record):
            if record_reason(record) != mark.reason:
                update.append((name, mark.reason))
            if str(record_drain(record)) != mark.drain:
                update_drain.append((name, mark.drain))
    delete, relabel = follow_marks(slice_, records, pool_slices)
    return SliceSync(create=tuple(create), update_reason=tuple(update), update_drain=tuple(update_drain),
                     delete=tuple(delete), relabel=tuple(relabel), errors=tuple(errors))


def records_by_ref(records: Mapping[str, dict[str, Any]]) -> dict[DeviceRef, tuple[str, dict[str, Any]]]:
    """The records keyed by the device they name (the first name in sorted order wins a tie).

    Records derived for siblings are left out: they go with their origin, and a mark set on the device
    itself must then stay (it gets a record of its own)."""
    index: dict[DeviceRef, tuple[str, dict[str, Any]]] = {}
    for name in sorted(records):
        if record_source(records[name]) == SOURCE_SIBLING:
            continue
        ref = record_ref(records[name])
        if ref is not None and ref not in index:
            index[ref] = (name, records[name])
    return index


def _existing_record(ref: DeviceRef, records: Mapping[str, dict[str, Any]],
                     by_ref: Mapping[DeviceRef, tuple[str, dict[str, Any]]]) -> tuple[str, dict[str, Any]] | None:
    name = record_name(ref)
    record = records.get(name)
    if record is not None and record_ref(record) == ref and record_source(record) != SOURCE_SIBLING:
        return name, record
    return by_ref.get(ref)


def slice_label(record: dict[str, Any]) -> str:
    """The record's SLICE_LABEL: the label value of the slice whose annotation it follows ("" for none)."""
    return str((metadata(record).get("labels") or {}).get(SLICE_LABEL) or "")


def annotated_devices(slice_: dict[str, Any]) -> set[str]:
    """The devices the slice lists and has an annotation of ours for, valid or not (an annotation for a
    device the slice does not list marks nothing: a record passed to that slice would never be cleared)."""
    return {marked_device(key) or "" for key in marked_annotations(slice_)} & set(slice_devices(slice_))


def follow_marks(slice_: dict[str, Any], records: Mapping[str, dict[str, Any]],
                 pool_slices: Iterable[dict[str, Any]] = ()) -> tuple[list[str], list[tuple[str, str]]]:
    """Which annotation records of the devices this slice lists are cleared, and which follow another slice.

    An annotation record follows the slice in its SLICE_LABEL: removing the annotation from that slice
    clears it. Drivers re-create their slices under new names (1.37's slice controller replaces slices
    whose names lack an index prefix), so the mark may be set again on a new slice after the old one is
    gone, and for a moment two slices of one pool may both exist. A record therefore
    - stays with its slice while that slice carries an annotation for the device;
    - else follows a current slice of the pool that carries one (this slice first, then by name), so
      that removing the annotation there clears it;
    - else is cleared when its slice is this one: the annotation was removed here and no slice of the
      pool carries it any more;
    - else stays: its slice is gone and the one that replaced it was never marked (records outlive
      their slice).
    A record is never cleared while any current slice of the pool carries the annotation, and moves
    only from a slice without the annotation to one with it, so two slices cannot pass it to and fro.

    Returns the sorted names of the records to delete and (record name, slice name) of those to re-label.
    """
    this = slice_name(slice_)
    driver, pool = str(spec(slice_).get("driver") or ""), slice_pool(slice_)
    carrying = {this: annotated_devices(slice_)}
    for other in pool_slices:
        name = slice_name(other)
        if name and name != this and (str(spec(other).get("driver") or ""), slice_pool(other)) == (driver, pool):
            carrying[name] = annotated_devices(other)
    by_label = {label_value(name): name for name in carrying}
    listed = set(slice_devices(slice_))
    delete: list[str] = []
    relabel: list[tuple[str, str]] = []
    for name in sorted(records):
        record = records[name]
        ref = record_ref(record)
        if ref is None or (ref.driver, ref.pool) != (driver, pool) or ref.device not in listed:
            continue
        if not is_from_annotation(record) or is_being_deleted(record):
            continue
        label = slice_label(record)
        if ref.device in carrying.get(by_label.get(label, ""), set()):
            continue
        carriers = sorted(slice for slice, devices in carrying.items() if ref.device in devices)
        if carriers:
            relabel.append((name, this if this in carriers else carriers[0]))
        elif label == label_value(this):
            delete.append(name)
    return delete, relabel
