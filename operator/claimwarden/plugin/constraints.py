"""Constraints: what the claim's requests must share (`matchAttribute`) and what a pool can give
(partitionable counters).

A `matchAttribute` constraint applies to the requests it names (all when it names none) and holds when
every device chosen for them has the attribute with one and the same typed value, looked up as the
allocator's lookupAttribute does (`Device.typed_attribute`). Partitionable devices consume counters
from their pool's counter sets; a device fits while no counter goes below zero.
"""

from __future__ import annotations

from claimwarden.quantities import parse_quantity

from .requests import Req
from .snapshot import Device, Obj, Snapshot


def constraints_of(claim: Obj) -> list[Obj]:
    """The claim's `matchAttribute` constraints (the only kind the allocator knows)."""
    return [c for c in ((claim.get("spec") or {}).get("devices") or {}).get("constraints") or []
            if c.get("matchAttribute")]


def applies(constraint: Obj, req: Req) -> bool:
    """Whether the constraint binds the request: it names none, the request, or the subrequest."""
    names = constraint.get("requests") or []
    return not names or req.request in names or (req.sub is not None and req.label in names)


def constraints_hold(constraints: list[Obj], device: Device, req: Req, chosen: list[tuple[Req, Device]]) -> bool:
    """Whether `device` for `req` keeps every constraint that binds it, against the devices already chosen for the
    same claim (the first bound one decides: all of them share the value)."""
    for constraint in constraints:
        if not applies(constraint, req):
            continue
        value = device.typed_attribute(constraint["matchAttribute"])
        if value is None:
            return False
        for other_req, other in chosen:
            if other_req.claim_index == req.claim_index and applies(constraint, other_req):
                if other.typed_attribute(constraint["matchAttribute"]) != value:
                    return False
                break
    return True


def counters_fit(snapshot: Snapshot, device: Device, chosen: list[Device]) -> bool:
    """Partitionable devices: the counter sets of the device's pool, which 1.35+ may publish in other slices of
    the pool than the device's, minus what the pool's allocated and chosen devices consume."""
    pool = (device.driver, device.pool)
    available: dict[tuple[str, str], float] = {}
    for slice_ in snapshot.pool_slices(*pool):
        for counter_set in (slice_.get("spec") or {}).get("sharedCounters") or []:
            for name, counter in (counter_set.get("counters") or {}).items():
                available[(counter_set.get("name", ""), name)] = float(parse_quantity(str(counter.get("value", "0"))))
    users = [d for d in snapshot.devices if (d.driver, d.pool) == pool and d.id in snapshot.holders]
    users += [d for d in chosen if (d.driver, d.pool) == pool]
    for user in [*users, device]:
        for consumption in user.body.get("consumesCounters") or []:
            for name, counter in (consumption.get("counters") or {}).items():
                key = (consumption.get("counterSet", ""), name)
                available[key] = available.get(key, 0.0) - float(parse_quantity(str(counter.get("value", "0"))))
    return all(value >= 0 for value in available.values())
