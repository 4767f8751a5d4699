"""One snapshot of what the plugin reads, as plain dicts in the raw Kubernetes JSON shape.

`read.py` fills it from the API; `explain` (and its funnel), `doctor` and `devices` are pure functions over it, so
unit tests and the benchmark build snapshots by hand. The indices (devices, holders) are computed
once per snapshot.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import cached_property
from typing import Any

from claimwarden.health.records import RECORD_LABEL

Obj = dict[str, Any]
DeviceId = tuple[str, str, str]
"""(driver, pool, device)"""

DEFAULT_CLAIMWARDEN_NAMESPACE = "claimwarden-system"
ATTRIBUTE_TYPES = ("int", "bool", "string", "version")
"""The value fields of a DeviceAttribute; exactly one is set."""


@dataclass(frozen=True)
class Device:
    """One device a ResourceSlice publishes (newest generation of its pool), with where it lives."""

    driver: str
    pool: str
    name: str
    body: Obj
    slice_name: str
    slice_spec: Obj
    order: int

    @property
    def id(self) -> DeviceId:
        return (self.driver, self.pool, self.name)

    @property
    def node_name(self) -> str | None:
        if self.slice_spec.get("perDeviceNodeSelection"):
            return self.body.get("nodeName")
        return self.slice_spec.get("nodeName")

    @property
    def node_spec(self) -> Obj:
        """Where the device can be used: {nodeName} | {nodeSelector} | {allNodes}."""
        source = self.body if self.slice_spec.get("perDeviceNodeSelection") else self.slice_spec
        return {k: source[k] for k in ("nodeName", "nodeSelector", "allNodes") if source.get(k) is not None}

    def typed_attribute(self, name: str, *, bare_in_driver_domain: bool = False) -> tuple[str, Any] | None:
        """An attribute as (type, value), looked up as the allocator's lookupAttribute does: the exact key, else
        the bare id when the name's domain is the driver's; with `bare_in_driver_domain` a bare name also finds
        the key qualified with the driver's domain (how people write it on the command line)."""
        attributes = self.body.get("attributes") or {}
        entry = attributes.get(name)
        if entry is None:
            domain, _, ident = name.partition("/")
            if ident and domain == self.driver:
                entry = attributes.get(ident)
            elif not ident and bare_in_driver_domain:
                entry = attributes.get(f"{self.driver}/{name}")
        if not entry:
            return None
        for kind in ATTRIBUTE_TYPES:
            if entry.get(kind) is not None:
                return (kind, entry[kind])
        return None

    def attribute(self, name: str) -> Any:
        """An attribute's value by bare or qualified name (bare = the driver's domain), or None."""
        found = self.typed_attribute(name, bare_in_driver_domain=True)
        return None if found is None else found[1]

    @property
    def model(self) -> str:
        for name in ("model", "productName", "type"):
            value = self.attribute(name)
            if value is not None:
                return str(value)
        return ""


@dataclass(frozen=True)
class Holder:
    """A claim whose allocation names a device."""

    claim: Obj
    quarantine: bool

    @property
    def ref(self) -> str:
        meta = self.claim.get("metadata") or {}
        return f"{meta.get('namespace', '')}/{meta.get('name', '')}"

    @property
    def pods(self) -> list[str]:
        namespace = (self.claim.get("metadata") or {}).get("namespace", "")
        return [f"{namespace}/{entry.get('name')}" for entry in
                ((self.claim.get("status") or {}).get("reservedFor") or []) if entry.get("resource") == "pods"]


@dataclass
class Snapshot:
    slices: list[Obj] = field(default_factory=list)
    classes: list[Obj] = field(default_factory=list)
    claims: list[Obj] = field(default_factory=list)
    pods: list[Obj] = field(default_factory=list)
    nodes: list[Obj] = field(default_factory=list)
    records: list[Obj] = field(default_factory=list)
    taint_rules: list[Obj] | None = None
    """None when the cluster does not serve DeviceTaintRule."""
    templates: list[Obj] = field(default_factory=list)
    claimwarden_namespace: str = DEFAULT_CLAIMWARDEN_NAMESPACE
    now: datetime = field(default_factory=lambda: datetime.now(UTC))

    @cached_property
    def devices(self) -> list[Device]:
        """Every device of the newest generation of each pool, in pool, slice and device order."""
        newest: dict[tuple[str, str], int] = {}
        for slice_ in self.slices:
            spec = slice_.get("spec") or {}
            key = (spec.get("driver", ""), (spec.get("pool") or {}).get("name", ""))
            newest[key] = max(newest.get(key, 0), int((spec.get("pool") or {}).get("generation") or 0))
        out: list[Device] = []
        ordered = sorted(self.slices, key=lambda s: ((s.get("spec") or {}).get("driver", ""),
                                                      ((s.get("spec") or {}).get("pool") or {}).get("name", ""),
                                                      (s.get("metadata") or {}).get("name", "")))
        for slice_ in ordered:
            spec = slice_.get("spec") or {}
            driver, pool = spec.get("driver", ""), (spec.get("pool") or {}).get("name", "")
            if int((spec.get("pool") or {}).get("generation") or 0) < newest[(driver, pool)]:
                continue
            for body in spec.get("devices") or []:
                out.append(Device(driver, pool, body.get("name", ""), body,
                                  (slice_.get("metadata") or {}).get("name", ""), spec, len(out)))
        return out

    @cached_property
    def _current_pools(self) -> dict[tuple[str, str], list[Obj]]:
        from claimwarden.health.domains import current_slices

        pools: dict[tuple[str, str], list[Obj]] = {}
        current = {id(slice_) for slice_ in current_slices(self.slices)}
        for slice_ in (s for s in self.slices if id(s) in current):
            spec = slice_.get("spec") or {}
            pools.setdefault((spec.get("driver", ""), (spec.get("pool") or {}).get("name", "")), []).append(slice_)
        return pools

    def pool_slices(self, driver: str, pool: str) -> list[Obj]:
        """The slices of the newest generation of one pool (counter sets may sit in any of them from 1.35)."""
        return self._current_pools.get((driver, pool), [])

    @cached_property
    def fault_domains(self) -> dict[DeviceId, list[str]]:
        """Each device's siblings: the other devices of its fault domain (health/domains.py), by name."""
        from claimwarden.health.domains import fault_domains

        found: dict[DeviceId, list[str]] = {}
        for slices in self._current_pools.values():
            for ref, domain in fault_domains(slices).items():
                found[(ref.driver, ref.pool, ref.device)] = sorted(r.device for r in domain if r != ref)
        return found

    @cached_property
    def device_index(self) -> dict[DeviceId, Device]:
        return {device.id: device for device in self.devices}

    @cached_property
    def class_index(self) -> dict[str, Obj]:
        return {(c.get("metadata") or {}).get("name", ""): c for c in self.classes}

    @cached_property
    def node_index(self) -> dict[str, Obj]:
        return {(n.get("metadata") or {}).get("name", ""): n for n in self.nodes}

    @cached_property
    def pod_index(self) -> dict[tuple[str, str], Obj]:
        return _by_namespaced_name(self.pods)

    @cached_property
    def pod_uids(self) -> dict[str, Obj]:
        return {(p.get("metadata") or {}).get("uid", ""): p for p in self.pods}

    @cached_property
    def claim_index(self) -> dict[tuple[str, str], Obj]:
        return _by_namespaced_name(self.claims)

    def is_quarantine_claim(self, claim: Obj) -> bool:
        meta = claim.get("metadata") or {}
        return meta.get("namespace") == self.claimwarden_namespace and RECORD_LABEL in (meta.get("labels") or {})

    @cached_property
    def holders(self) -> dict[DeviceId, list[Holder]]:
        """Which claims' allocations name each device (admin-access results block nobody and are left out)."""
        out: dict[DeviceId, list[Holder]] = defaultdict(list)
        for claim in self.claims:
            allocation = (claim.get("status") or {}).get("allocation") or {}
            for result in (allocation.get("devices") or {}).get("results") or []:
                if result.get("adminAccess"):
                    continue
                key = (result.get("driver", ""), result.get("pool", ""), result.get("device", ""))
                out[key].append(Holder(claim, self.is_quarantine_claim(claim)))
        return out

    @cached_property
    def records_by_device(self) -> dict[DeviceId, Obj]:
        """A device's record; a person's or an annotation's before the signals' one (signals/records.py), and that
        before one derived for a sibling (health/siblings.py): `mark` takes over neither and `clear` handles
        them apart (plan_clear)."""
        rank = {"signals": 1, "sibling": 2}
        out: dict[DeviceId, Obj] = {}
        for record in self.records:
            spec = record.get("spec") or {}
            key = (spec.get("driver", ""), spec.get("pool", ""), spec.get("device", ""))
            if key not in out or rank.get(str(spec.get("source")), 0) < rank.get(
                    str((out[key].get("spec") or {}).get("source")), 0):
                out[key] = record
        return out


def _by_namespaced_name(objects: list[Obj]) -> dict[tuple[str, str], Obj]:
    return {((o.get("metadata") or {}).get("namespace", ""), (o.get("metadata") or {}).get("name", "")): o
            for o in objects}


def name_of(obj: Obj) -> str:
    return str((obj.get("metadata") or {}).get("name", ""))


def namespace_of(obj: Obj) -> str:
    return str((obj.get("metadata") or {}).get("namespace", ""))


def ref_of(obj: Obj) -> str:
    namespace = namespace_of(obj)
    return f"{namespace}/{name_of(obj)}" if namespace else name_of(obj)
