"""Fault domains: which devices a fault on one device takes with it (DESIGN.md §2.7, docs/concepts/fault-domains.md).

A physical GPU and its partitions are separate devices in a ResourceSlice, and a driver that finds the GPU
broken may taint only the device it saw fail. DRA publishes who belongs together in two ways:

- **Counter sets** (KEP-4815, partitionable devices): a pool lists ``sharedCounters[]`` (named counter sets)
  and each device's ``consumesCounters[].counterSet`` names the sets it draws from. The full GPU and each of
  its partitions draw from the GPU's one set. Counter set names are unique per pool, and since 1.35 the sets
  may sit in other slices of the pool than the devices (a slice holds either devices or counter sets).
- **A parent attribute**: NVIDIA's MIG devices carry ``parentUUID``, the ``uuid`` of their GPU.

The fault domain of a device is the device itself, every device of the same driver and pool that draws from
one of its counter sets, and every device with the same parent: the same value of a parent attribute, or the
device whose identity attribute (``uuid``) is that value. It is not transitive: a device drawing from sets A
and B is in the domain of devices of A and of B, but those are not in each other's.

Only the newest generation of a pool counts, as for the scheduler: slices of an older generation are being
replaced. Malformed entries (a consumption without a set name, a device without a name) are skipped rather
than guessed at; a set that devices name but no slice of the pool publishes still groups its devices (the
driver says they share it), and ``problems`` reports it.

A **whole device** is the one a fault of which is a fault of its whole domain (the GPU, not one of its
partitions): another device's parent attribute names its identity, or it draws, from every counter set it
uses, every counter the set publishes at the set's full value (dra-example-driver's full GPU). A device alone
in its domain has no siblings either way; a partition is a device with siblings that is not whole.

Everything here is pure: plain ResourceSlice dicts in, DeviceRefs out, in one pass over the devices plus the
size of the domains (a pool of 8 GPUs with 64 partitions each is 520 devices, not 520² comparisons).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from ..quantities import parse_quantity
from .records import DeviceRef

PARENT_ATTRIBUTES: tuple[str, ...] = ("parentUUID",)
"""Attributes whose value names a device's parent. A bare name matches the attribute in any domain
(``parentUUID``, ``gpu.nvidia.com/parentUUID``); a qualified one only itself."""
IDENTITY_ATTRIBUTES: tuple[str, ...] = ("uuid",)
"""Attributes whose value is what a child's parent attribute names: the parent is the device carrying it."""


@dataclass(frozen=True)
class DomainRules:
    parent_attributes: tuple[str, ...] = PARENT_ATTRIBUTES
    identity_attributes: tuple[str, ...] = IDENTITY_ATTRIBUTES


Slice = Mapping[str, Any]
_PoolKey = tuple[str, str]
_GroupKey = tuple[str, str, str, str]  # driver, pool, kind ("set" or "parent"), name or value


def fault_domains(pool_slices: Iterable[Slice], *, rules: DomainRules = DomainRules()
                  ) -> dict[DeviceRef, frozenset[DeviceRef]]:
    """Every published device's fault domain (always including the device itself)."""
    groups_of = _device_groups(current_slices(pool_slices), rules)
    members: dict[_GroupKey, set[DeviceRef]] = defaultdict(set)
    for ref, keys in groups_of.items():
        for key in keys:
            members[key].add(ref)
    frozen = {key: frozenset(refs) for key, refs in members.items()}
    domains: dict[DeviceRef, frozenset[DeviceRef]] = {}
    for ref, keys in groups_of.items():
        if not keys:
            domains[ref] = frozenset((ref,))
        elif len(keys) == 1:
            domains[ref] = frozen[next(iter(keys))]  # shared by the whole group: no copy per device
        else:
            domains[ref] = frozenset().union(*(frozen[key] for key in keys))
    return domains


def fault_domain(ref: DeviceRef, pool_slices: Iterable[Slice], *, rules: DomainRules = DomainRules()
                 ) -> frozenset[DeviceRef]:
    """The fault domain of ``ref``; just the device when the slices do not list it (it may be gone)."""
    relevant = [s for s in pool_slices if _pool_key(s) == (ref.driver, ref.pool)]
    return fault_domains(relevant, rules=rules).get(ref, frozenset((ref,)))


def whole_devices(pool_slices: Iterable[Slice], *, rules: DomainRules = DomainRules()) -> frozenset[DeviceRef]:
    """The devices whose fault is a fault of their whole domain: a parent named by another device's parent
    attribute, or a device that takes all of every counter set it draws from (see the module docstring).
    Counters that are malformed (no value, not a quantity) make a device not whole rather than guessed."""
    current = current_slices(pool_slices)
    sets: dict[tuple[str, str, str], dict[str, Decimal | None]] = {}
    for item in current:
        driver, pool = _pool_key(item)
        for counter_set in _dicts((item.get("spec") or {}).get("sharedCounters")):
            if isinstance(counter_set.get("name"), str) and counter_set["name"]:
                sets[(driver, pool, counter_set["name"])] = _counter_values(counter_set.get("counters"))
    named_parents: set[tuple[str, str, str]] = set()
    devices: list[tuple[DeviceRef, Mapping[str, Any]]] = []
    for item in current:
        driver, pool = _pool_key(item)
        for device in _dicts((item.get("spec") or {}).get("devices")):
            if isinstance(device.get("name"), str) and device["name"]:
                devices.append((DeviceRef(driver, pool, device["name"]), device))
                parent = _attribute(_mapping(device.get("attributes")), rules.parent_attributes)
                if parent is not None:
                    named_parents.add((driver, pool, parent))
    whole = set()
    for ref, device in devices:
        identity = _attribute(_mapping(device.get("attributes")), rules.identity_attributes)
        named = identity is not None and (ref.driver, ref.pool, identity) in named_parents
        if named or _takes_all_counters(ref, device, sets):
            whole.add(ref)
    return frozenset(whole)


def _takes_all_counters(ref: DeviceRef, device: Mapping[str, Any],
                        sets: Mapping[tuple[str, str, str], Mapping[str, Decimal | None]]) -> bool:
    consumptions = _dicts(device.get("consumesCounters"))
    if not consumptions:
        return False
    for consumption in consumptions:
        published = sets.get((ref.driver, ref.pool, str(consumption.get("counterSet") or "")))
        taken = _counter_values(consumption.get("counters"))
        if not published or taken != published or None in published.values():
            return False
    return True


def _counter_values(counters: Any) -> dict[str, Decimal | None]:
    """``{"memory": {"value": "40Gi"}}`` -> ``{"memory": Decimal(42949672960)}``; None for a malformed value."""
    values: dict[str, Decimal | None] = {}
    for name, counter in _mapping(counters).items():
        raw = counter.get("value") if isinstance(counter, Mapping) else None
        try:
            values[str(name)] = parse_quantity(raw) if isinstance(raw, str) else None
        except ValueError:
            values[str(name)] = None
    return values


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def problems(pool_slices: Iterable[Slice]) -> list[str]:
    """What is wrong in the published counter sets, one sentence each (for an Event or a log line)."""
    current = current_slices(pool_slices)
    published: dict[_PoolKey, set[str]] = defaultdict(set)
    named: dict[_PoolKey, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    found: list[str] = []
    for item in current:
        pool = _pool_key(item)
        spec = item.get("spec") or {}
        for counter_set in _dicts(spec.get("sharedCounters")):
            if isinstance(counter_set.get("name"), str) and counter_set["name"]:
                published[pool].add(counter_set["name"])
        for device in _dicts(spec.get("devices")):
            for consumption in _dicts(device.get("consumesCounters")):
                name = consumption.get("counterSet")
                if isinstance(name, str) and name:
                    named[pool][name].append(str(device.get("name")))
                else:
                    found.append(f"{pool[0]}/{pool[1]}/{device.get('name')}: a consumesCounters entry names "
                                 "no counterSet; it is ignored")
    for pool, sets in sorted(named.items()):
        for name, devices in sorted(sets.items()):
            if name not in published[pool]:
                found.append(f"{pool[0]}/{pool[1]}: counter set {name!r} is consumed by "
                             f"{', '.join(sorted(devices))} but no slice of the pool publishes it")
    return found


def current_slices(pool_slices: Iterable[Slice]) -> list[Slice]:
    """The slices of each pool's newest generation; slices without a driver or pool name are dropped."""
    by_pool: dict[_PoolKey, list[tuple[int, Slice]]] = defaultdict(list)
    for item in pool_slices:
        key = _pool_key(item)
        if key[0] and key[1]:
            by_pool[key].append((_generation(item), item))
    current: list[Slice] = []
    for entries in by_pool.values():
        newest = max(generation for generation, _ in entries)
        current += [item for generation, item in entries if generation == newest]
    return current


def _device_groups(slices: list[Slice], rules: DomainRules) -> dict[DeviceRef, set[_GroupKey]]:
    """Each device and the groups (counter sets, parent) it belongs to."""
    groups: dict[DeviceRef, set[_GroupKey]] = {}
    for item in slices:
        driver, pool = _pool_key(item)
        for device in _dicts((item.get("spec") or {}).get("devices")):
            name = device.get("name")
            if not isinstance(name, str) or not name:
                continue
            keys = groups.setdefault(DeviceRef(driver, pool, name), set())
            for consumption in _dicts(device.get("consumesCounters")):
                counter_set = consumption.get("counterSet")
                if isinstance(counter_set, str) and counter_set:
                    keys.add((driver, pool, "set", counter_set))
            attributes = device.get("attributes")
            if isinstance(attributes, Mapping):
                parent = _attribute(attributes, rules.parent_attributes) or _attribute(
                    attributes, rules.identity_attributes)
                if parent is not None:
                    keys.add((driver, pool, "parent", parent))
    return groups


def _attribute(attributes: Mapping[str, Any], names: tuple[str, ...]) -> str | None:
    """The first of ``names`` the device carries, as text (``{"string": "GPU-1"}`` -> ``"GPU-1"``)."""
    for wanted in names:
        for key, value in attributes.items():
            if key == wanted or ("/" not in wanted and key.rsplit("/", 1)[-1] == wanted):
                scalar = _scalar(value)
                if scalar is not None:
                    return scalar
    return None


def _scalar(value: Any) -> str | None:
    if not isinstance(value, Mapping):
        return None
    for kind in ("string", "int", "version", "bool"):
        if kind in value and value[kind] is not None and value[kind] != "":
            return f"{kind}:{value[kind]}"
    return None


def _pool_key(item: Slice) -> _PoolKey:
    spec = item.get("spec") or {}
    pool = spec.get("pool") or {}
    driver, name = spec.get("driver"), pool.get("name") if isinstance(pool, Mapping) else None
    return (driver if isinstance(driver, str) else "", name if isinstance(name, str) else "")


def _generation(item: Slice) -> int:
    pool = (item.get("spec") or {}).get("pool") or {}
    try:
        return int(pool.get("generation") or 0)
    except (TypeError, ValueError):
        return 0


def _dicts(value: Any) -> list[Mapping[str, Any]]:
    return [entry for entry in value if isinstance(entry, Mapping)] if isinstance(value, list) else []
