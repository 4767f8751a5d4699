"""Siblings: a mark on a whole device is a mark on every device of its fault domain (docs/concepts/fault-domains.md).

A fatal fault of a GPU is a fault of its partitions too, yet a driver may taint (and a person may mark) only
the device it saw fail. The leader therefore *derives* one UnhealthyDevice per sibling from each record whose
scope is its fault domain (its **origin**): owned by the origin (``ownerReferences``, so the garbage collector
deletes it with the origin), labelled with it, with its effect and drain and a reason that names it. The whole
machinery for one device (one quarantine claim per device, the breaker, the budget, PodDisruptionBudgets,
approvals) then applies to each sibling unchanged; the breaker counts the siblings' pods like any others.

The scope (``spec.scope``) is ``FaultDomain`` or ``Device``; unset, it is ``FaultDomain`` for a whole device
(domains.whole_devices) and ``Device`` for a partition, so that marking one partition leaves its siblings
alone unless the mark says the fault is parent-scoped (a HealthPolicy rule's ``scope`` says so for signals).

Rules, referred to by the controller:

1. A derived record is never an origin itself (no chains), whatever its scope says.
2. Derived records are recognised by ``spec.source: sibling``. Records are cluster-scoped and whoever may
   create one may mark any device anyway; a forged "derived" record that no origin asks for, or one whose
   owner is not the origin's current UID, is deleted, so forging one achieves nothing lasting.
3. Only what the current slices say removes a sibling: a derived record whose device no current slice of
   the pool lists, or whose origin's device no current slice lists, stays (slices are re-created by drivers,
   and records outlive them); while the pool's newest generation is not complete (fewer slices than its
   ``resourceSliceCount``, say its counter slice is not there yet) nothing is deleted at all. Otherwise its
   origin's going, or its origin's scope or effect no longer asking for it, removes it.
4. One derived record per (origin, sibling): two origins covering one device give two records, and a
   sibling's own record is a third; the quarantine is the device's (health/__init__.py), whichever mark it.

Everything here is pure: records and slices as plain dicts in, what to create, patch and delete out.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from claimwarden.objects.meta import is_being_deleted, metadata, spec

from . import records
from .domains import Slice, fault_domains, whole_devices
from .records import DeviceRef

SOURCE = records.SOURCE_SIBLING
ORIGIN_LABEL = "claimwarden.io/origin"
SCOPE_DEVICE = "Device"
SCOPE_FAULT_DOMAIN = "FaultDomain"
SCOPES = (SCOPE_DEVICE, SCOPE_FAULT_DOMAIN)
DOMAIN_SHOWN_MAX = 128
EXTENDING_EFFECTS = ("NoExecute", "NoSchedule")
"""Effects that extend to the siblings. A dry run (None) previews its own device only."""


def is_derived(record: dict[str, Any]) -> bool:
    """True for a record derived for a sibling (rule 2)."""
    return str(spec(record).get("source") or "") == SOURCE


def record_scope(record: dict[str, Any], *, whole: bool) -> str:
    """The record's scope: spec.scope when set and valid, else FaultDomain for a whole device, Device otherwise.

    The CRD refuses other values; one that got in anyway (an older CRD) counts as Device, the side that marks
    fewer devices (``scope_error`` says why, for an Event)."""
    raw = spec(record).get("scope")
    if raw in SCOPES:
        return str(raw)
    if raw in (None, ""):
        return SCOPE_FAULT_DOMAIN if whole else SCOPE_DEVICE
    return SCOPE_DEVICE


def scope_error(record: dict[str, Any]) -> str | None:
    """Why spec.scope cannot be used, or None when it is fine or unset."""
    raw = spec(record).get("scope")
    if raw in (None, "") or raw in SCOPES:
        return None
    return f"spec.scope {raw!r} is not one of {', '.join(SCOPES)}; the record marks its own device only"


def derived_name(origin_name: str, sibling: DeviceRef) -> str:
    """The derived record of `sibling` for the origin: `<pool>.<device>.<hash of origin and device>`."""
    return records.record_name(sibling, salt=f"{SOURCE}/{origin_name}/")


def derived_spec(origin: dict[str, Any], origin_ref: DeviceRef) -> dict[str, Any]:
    """The spec fields a derived record takes from its origin (besides its own device)."""
    reason = (f"in the fault domain of {origin_ref.device} (record {metadata(origin).get('name')}): "
              f"{records.record_reason(origin)}")
    return {"effect": records.record_effect(origin), "drain": str(records.record_drain(origin)),
            "reason": reason[:records.REASON_MAX], "scope": SCOPE_DEVICE}


def derived_body(origin: dict[str, Any], origin_ref: DeviceRef, sibling: DeviceRef) -> dict[str, Any]:
    meta = metadata(origin)
    name = str(meta.get("name") or "")
    return {
        "apiVersion": records.API_VERSION,
        "kind": records.KIND,
        "metadata": {
            "name": derived_name(name, sibling),
            "labels": {ORIGIN_LABEL: records.label_value(name)},
            # No blockOwnerDeletion: it would need the right to update the origin's finalizers, and nothing
            # waits for the derived records to go first.
            "ownerReferences": [{"apiVersion": records.API_VERSION, "kind": records.KIND, "name": name,
                                 "uid": str(meta.get("uid") or ""), "controller": True}],
        },
        "spec": {"driver": sibling.driver, "pool": sibling.pool, "device": sibling.device, "source": SOURCE,
                 **derived_spec(origin, origin_ref)},
    }


def owner_uid(record: dict[str, Any]) -> str:
    """The UID of the record's controlling owner, or ""."""
    for owner in metadata(record).get("ownerReferences") or []:
        if isinstance(owner, Mapping) and owner.get("controller") and owner.get("kind") == records.KIND:
            return str(owner.get("uid") or "")
    return ""


@dataclass(frozen=True)
class PoolSync:
    """What to change in the derived records of one pool."""

    create: tuple[dict[str, Any], ...] = ()
    patch: tuple[tuple[str, dict[str, Any]], ...] = ()
    """(record name, spec fields) of derived records whose origin's effect, drain or reason changed."""
    delete: tuple[tuple[str, str], ...] = ()
    """(record name, uid) of derived records no origin asks for."""


def plan_pool(driver: str, pool: str, pool_records: Iterable[dict[str, Any]],
              pool_slices: Iterable[Slice]) -> PoolSync:
    """The derived records one pool should have, compared with those it has (rules 1-4).

    `pool_records`: every record naming a device of the pool (origins, derived records, others alike);
    `pool_slices`: the pool's slices as the cache holds them (older generations are left out here)."""
    slices = list(pool_slices)
    domains = fault_domains(slices)
    whole = whole_devices(slices)
    listed = set(domains)
    wanted: dict[str, tuple[dict[str, Any], str]] = {}  # name -> (body, origin uid)
    keep_origins: set[str] = set()  # origins whose device no current slice lists: their derived records stay
    existing: dict[str, dict[str, Any]] = {}
    for record in pool_records:
        ref = records.record_ref(record)
        if ref is None or (ref.driver, ref.pool) != (driver, pool):
            continue
        name = str(metadata(record).get("name") or "")
        if is_derived(record):
            existing[name] = record
            continue
        if is_being_deleted(record):
            continue
        if ref not in listed:
            keep_origins.add(str(metadata(record).get("uid") or ""))
            continue
        if records.record_effect(record) not in EXTENDING_EFFECTS or \
                record_scope(record, whole=ref in whole) != SCOPE_FAULT_DOMAIN:
            continue
        uid = str(metadata(record).get("uid") or "")
        for sibling in sorted(domains[ref] - {ref}, key=lambda r: r.device):
            body = derived_body(record, ref, sibling)
            wanted[body["metadata"]["name"]] = (body, uid)
    extending = {uid for _, uid in wanted.values()}
    complete = pool_complete(slices)
    patch: list[tuple[str, dict[str, Any]]] = []
    delete: list[tuple[str, str]] = []
    for name in sorted(existing):
        record = existing[name]
        owner = owner_uid(record)
        want = wanted.get(name)
        if want is None:
            # Rule 3: an origin whose device is not listed now, or a sibling not listed now under an origin
            # that still extends, keeps the record.
            unlisted = records.record_ref(record) not in listed
            if not complete or (owner and (owner in keep_origins or (unlisted and owner in extending))):
                continue
            _delete(record, delete)
        elif owner != want[1] or records.record_ref(record) != records.record_ref(want[0]):
            if complete:
                _delete(record, delete)  # a stale or forged one under our name: made again once it is gone
        else:
            fields = {k: v for k, v in want[0]["spec"].items() if spec(record).get(k) != v}
            if fields:
                patch.append((name, fields))
    create = sorted((wanted[name][0] for name in set(wanted) - set(existing)),
                    key=lambda body: (body["spec"]["device"], body["metadata"]["name"]))
    return PoolSync(create=tuple(create), patch=tuple(patch), delete=tuple(delete))


def with_origins(pool_records: list[dict[str, Any]],
                 record_named: Callable[[str], dict[str, Any] | None]) -> list[dict[str, Any]]:
    """The pool's records plus the origins their derived records name that are not among them.

    Records are found through the devices the pool lists; an origin whose own device no slice lists now (a GPU
    fallen off the bus) is then missing, and its derived records would look orphaned: each plan of the pool
    would delete them, and a LIST of every record would take the deletion back (rule 3)."""
    present = {str(metadata(r).get("name") or "") for r in pool_records}
    found = list(pool_records)
    for record in pool_records:
        if not is_derived(record):
            continue
        for owner in metadata(record).get("ownerReferences") or []:
            name = str(owner.get("name") or "") if isinstance(owner, Mapping) else ""
            origin = record_named(name) if name and name not in present else None
            if origin is not None:
                present.add(name)
                found.append(origin)
    return found


def pool_complete(pool_slices: Iterable[Slice]) -> bool:
    """True when the pool's newest generation has all its slices (``resourceSliceCount``), as the scheduler
    requires before it allocates from a pool; a pool without slices is not complete."""
    newest: dict[int, list[Slice]] = {}
    for item in pool_slices:
        pool = (item.get("spec") or {}).get("pool") or {}
        try:
            generation = int(pool.get("generation") or 0)
        except (TypeError, ValueError):
            generation = 0
        newest.setdefault(generation, []).append(item)
    if not newest:
        return False
    current = newest[max(newest)]
    counts = {((s.get("spec") or {}).get("pool") or {}).get("resourceSliceCount") for s in current}
    return all(isinstance(count, int) and count <= len(current) for count in counts)


def domain_devices(ref: DeviceRef, pool_slices: Iterable[Slice]) -> list[str] | None:
    """The device names of `ref`'s fault domain (its own included), or None when no current slice lists it."""
    domain = fault_domains(pool_slices).get(ref)
    return None if domain is None else sorted(r.device for r in domain)


def domain_status(domain: list[str] | None, status: Mapping[str, Any], ref: DeviceRef) -> dict[str, Any]:
    """status.faultDomain (the first DOMAIN_SHOWN_MAX names) and status.faultDomainSize of a record. While no
    slice lists the device (a driver re-creating its slices), the domain last shown stays."""
    if domain is None:
        shown = status.get("faultDomain")
        if isinstance(shown, list) and shown:
            return {"faultDomain": shown, "faultDomainSize": status.get("faultDomainSize") or len(shown)}
        domain = [ref.device]
    return {"faultDomain": domain[:DOMAIN_SHOWN_MAX], "faultDomainSize": len(domain)}


def _delete(record: dict[str, Any], delete: list[tuple[str, str]]) -> None:
    if not is_being_deleted(record):
        meta = metadata(record)
        delete.append((str(meta.get("name") or ""), str(meta.get("uid") or "")))
