"""Driver taints on ResourceSlices (KEP-5055) -> observations.

A driver taints a device in its slice (``spec.devices[].taints[]``: ``key``, ``value``, ``effect``,
``timeAdded``; the apiserver defaults ``timeAdded`` when the driver leaves it out). NVIDIA's driver keeps
only the latest value per key, so the history lives in claimwarden's record: each taint seen is an
Unhealthy observation, each taint gone a Healthy one (docs/concepts/health-from-signals.md). A taint's
identity is ``key=value@timeAdded``: the kubelet plugin helper's slice controller keeps the stored
``timeAdded`` when a driver republishes a taint with the same key, value and effect
(``resourceslice.DevicesDeepEqual`` in k8s.io/dynamic-resource-allocation), so a republish is no new
fault, while a new value or effect gets a new ``timeAdded``.

A pool may span several slices and is rewritten generation by generation; a device's taints are read
only from a *complete* pool at its highest ``spec.pool.generation``, as the scheduler reads pools.
Half-published pools give no conclusion (no removal is inferred from a device missing from them).

Pure functions over plain dicts in the raw Kubernetes JSON shape.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from claimwarden.health.records import TAINT_KEY, DeviceRef
from claimwarden.signals.keys import bounded
from claimwarden.signals.observations import (
    HEALTHY,
    MESSAGE_MAX,
    SOURCE_TAINT,
    UNHEALTHY,
    Observation,
)
from claimwarden.timestamps import format_rfc3339, parse_rfc3339

PoolKey = tuple[str, str]
"""(driver, pool name)."""
_AFTER = timedelta(microseconds=1)


def _mapping(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def complete_pools(slices: Iterable[Mapping[str, Any]]) -> dict[PoolKey, list[Mapping[str, Any]]]:
    """(driver, pool) -> its slices at the highest ``spec.pool.generation``, only for complete pools.

    Complete: that generation has exactly ``spec.pool.resourceSliceCount`` slices (all of them saying
    the same count). A slice listed twice (same name) counts once. Slices without a driver, a pool
    name or an integer generation are skipped.
    """
    by_pool: dict[PoolKey, dict[str, Mapping[str, Any]]] = defaultdict(dict)
    for index, item in enumerate(slices):
        spec, pool = _mapping(item.get("spec")), _mapping(_mapping(item.get("spec")).get("pool"))
        driver, name, generation = spec.get("driver"), pool.get("name"), _int(pool.get("generation"))
        if not (isinstance(driver, str) and driver and isinstance(name, str) and name and generation is not None):
            continue
        identity = _mapping(item.get("metadata")).get("name")
        by_pool[(driver, name)][identity if isinstance(identity, str) and identity else f"#{index}"] = item
    complete: dict[PoolKey, list[Mapping[str, Any]]] = {}
    for key, named in by_pool.items():
        newest = max(_int(s["spec"]["pool"]["generation"]) or 0 for s in named.values())
        current = [s for s in named.values() if s["spec"]["pool"]["generation"] == newest]
        counts = {_int(s["spec"]["pool"].get("resourceSliceCount")) for s in current}
        if counts == {len(current)}:
            complete[key] = current
    return complete


def device_taints(pool_slices: Iterable[Mapping[str, Any]]) -> dict[DeviceRef, list[Mapping[str, Any]]]:
    """Every device of a pool's slices -> its ``taints`` (an empty list when it has none).

    Devices without taints are listed too: a device whose taint went away must be seen to have none.
    Taint entries that are not objects with a string ``key`` are dropped.
    """
    found: dict[DeviceRef, list[Mapping[str, Any]]] = {}
    for item in pool_slices:
        spec = _mapping(item.get("spec"))
        driver, pool = spec.get("driver"), _mapping(spec.get("pool")).get("name")
        if not (isinstance(driver, str) and isinstance(pool, str)):
            continue
        devices = spec.get("devices")
        for device in devices if isinstance(devices, list) else []:
            name = _mapping(device).get("name")
            if not isinstance(name, str) or not name:
                continue
            taints = _mapping(device).get("taints")
            found[DeviceRef(driver, pool, name)] = [
                t for t in (taints if isinstance(taints, list) else [])
                if isinstance(t, Mapping) and isinstance(t.get("key"), str) and t["key"]]
    return found


def _value(taint: Mapping[str, Any]) -> str:
    value = taint.get("value")
    return value if isinstance(value, str) else ""


def taint_observations(ref: DeviceRef, taints: Sequence[Mapping[str, Any]] | None,
                       previous: Sequence[Observation], now: datetime) -> list[Observation]:
    """What is new about a device's taints, given the observations its record already holds.

    ``taints`` None means its pool is incomplete (or the device is not in it): nothing is concluded.
    A taint is new when no earlier observation has its key ``"{key}={value}@{timeAdded}"``; it is an
    Unhealthy observation at its ``timeAdded``. A taint without ``timeAdded`` (the apiserver defaults
    it, so only hand-made input lacks it) is new unless the newest observation of its key already says
    that value; it is dated ``now``. A new taint is dated no earlier than just after the newest
    removal of its key: it came back after that removal was seen, and dated at or before it (the
    apiserver's clock behind ours), it would never count after the recovery (``decide``'s floor); its
    key keeps ``timeAdded``. A key whose newest observation is Unhealthy and that is no longer on the
    device gets one Healthy ``"{key} removed@{now}"`` observation, dated ``now`` (or just after that
    Unhealthy one, should the apiserver's clock be ahead of ours). claimwarden's own taint key is
    ignored: it is a consequence of a mark, never a signal.
    """
    if taints is None:
        return []
    mine = [o for o in previous if o.source == SOURCE_TAINT]
    seen = {o.key for o in mine}
    newest: dict[str, Observation] = {}
    removed_at: dict[str, datetime] = {}
    for observation in sorted(mine, key=lambda o: (o.at, o.key)):
        newest[observation.signal] = observation
        if observation.state == HEALTHY:
            removed_at[observation.signal] = observation.at
    new: list[Observation] = []
    present: set[str] = set()
    for taint in taints:
        key = taint.get("key")
        if not isinstance(key, str) or not key or key == TAINT_KEY:
            continue
        present.add(key)
        value, effect = _value(taint), taint.get("effect")
        added = parse_rfc3339(taint.get("timeAdded"))
        if added is None:
            last = newest.get(key)
            if last is not None and last.state == UNHEALTHY and last.value == value:
                continue
            at = now
        else:
            at = added
        observation_key = bounded(f"{key}={value}@{format_rfc3339(at)}")
        if observation_key in seen:
            continue
        seen.add(observation_key)
        if key in removed_at:
            at = max(at, removed_at[key] + _AFTER)
        effect_text = f" ({effect})" if isinstance(effect, str) and effect else ""
        new.append(Observation(
            source=SOURCE_TAINT, signal=key, value=value, state=UNHEALTHY, at=at, key=observation_key,
            message=f"the driver tainted {ref} with {key}={value}{effect_text}"[:MESSAGE_MAX]))
    for key, last in sorted(newest.items()):
        if key in present or last.state != UNHEALTHY:
            continue
        # timeAdded is the apiserver's clock, `now` ours: a removal must still come after the fault it
        # ends (decide recovers on a Healthy observation later than the fault), even when ours is behind.
        at = max(now, last.at + _AFTER)
        new.append(Observation(
            source=SOURCE_TAINT, signal=key, value=last.value, state=HEALTHY, at=at,
            key=bounded(f"{key} removed@{format_rfc3339(at)}"),
            message=f"the driver removed its taint {key} from {ref}"[:MESSAGE_MAX]))
    return new

