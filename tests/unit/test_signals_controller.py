"""The signals controller against a fake API and cache (plain dicts): what it writes, keeps and deletes.

Found by an adversarial review of issue 21: a record deleted while its taint was still there lost its history
(a verified clear undone at once; a record with no mark re-created about once a second), a held mark was looked
at every second, a mark was lifted when its rule went away, and a laptop's clock behind the apiserver's made a
verified clear clear nothing.
"""

from __future__ import annotations

import asyncio
import copy
import itertools
from datetime import datetime, timedelta
from typing import Any

import pytest

from claimwarden import timestamps
from claimwarden.health.records import DeviceRef
from claimwarden.runtime.workqueue import Retry
from claimwarden.signals import controller as signals_controller
from claimwarden.signals import lifetime as signals_lifetime
from claimwarden.signals import records as signal_records

DRIVER, POOL, DEVICE, KEY = "gpu.example.com", "node-1", "gpu-0", "gpu.example.com/xid"
REF = DeviceRef(DRIVER, POOL, DEVICE)
NAME = signal_records.signal_record_name(REF)
_versions = itertools.count(100)


def _rule(name: str = "fatal-xid", count: int = 1, effect: str = "NoExecute") -> dict[str, Any]:
    return {"name": name, "source": "DriverTaint", "signal": KEY, "effect": effect, "mode": "Enforce",
            "threshold": {"count": count, "window": "10m"}}


class FakeCache:
    def __init__(self, taint_added: datetime | None) -> None:
        self.recs: dict[str, dict[str, Any]] = {}
        self.devices: list[dict[str, Any]] = [{"name": DEVICE, "taints": []}]
        if taint_added is not None:
            self.devices[0]["taints"] = [{"key": KEY, "value": "79", "effect": "NoSchedule",
                                          "timeAdded": timestamps.format_rfc3339(taint_added)}]
        self.policies = [self.policy(_rule())]

    @staticmethod
    def policy(*rules: dict[str, Any]) -> dict[str, Any]:
        version = next(_versions)  # a new spec: a new generation (the router is built again on it)
        return {"metadata": {"name": "p", "resourceVersion": str(version), "generation": version, "uid": "u"},
                "spec": {"drivers": [DRIVER], "rules": list(rules), "recovery": {"refaultWindow": "10m"}}}

    def slice(self) -> dict[str, Any]:
        return {"metadata": {"name": "s1"}, "spec": {
            "driver": DRIVER, "nodeName": POOL, "pool": {"name": POOL, "generation": 1, "resourceSliceCount": 1},
            "devices": self.devices}}

    def record(self, name: str) -> dict[str, Any] | None:
        return self.recs.get(name)

    def records(self) -> list[dict[str, Any]]:
        return list(self.recs.values())

    def resource_slices_of_pool(self, driver: str, pool: str) -> list[dict[str, Any]]:
        return [self.slice()]

    def resource_slices(self) -> list[dict[str, Any]]:
        return [self.slice()]

    def claims_holding(self, key: Any) -> list[Any]:
        return []

    def pod(self, namespace: str, name: str) -> None:
        return None

    def pod_keys(self) -> list[Any]:
        return []

    def health_policies(self) -> list[dict[str, Any]]:
        return self.policies

    def device_class_selectors(self) -> dict[str, Any]:
        return {}

    def node_names(self) -> list[str]:
        return []

    def node_conditions(self, name: str) -> list[Any]:
        return []


class FakeKube:
    def __init__(self, cache: FakeCache) -> None:
        self.cache = cache
        self.writes: list[tuple[str, ...]] = []
        self.events: list[str] = []

    async def create_cluster_object(self, api: str, plural: str, body: dict[str, Any]) -> dict[str, Any]:
        created = copy.deepcopy(body)
        created["metadata"].update(resourceVersion=str(next(_versions)), uid="uid-1")
        self.cache.recs[created["metadata"]["name"]] = created
        self.writes.append(("create", created["spec"]["effect"]))
        return copy.deepcopy(created)

    async def merge_patch_cluster_object(self, api: str, plural: str, name: str, patch: dict[str, Any],
                                         subresource: str = "") -> dict[str, Any]:
        record = self.cache.recs[name]
        for part, value in patch.items():
            if part == "metadata":
                record["metadata"].setdefault("annotations", {}).update(value["annotations"])
                continue
            record[part] = _merge_patch(record.get(part, {}), value)
        record["metadata"]["resourceVersion"] = str(next(_versions))
        if part != "metadata":
            self.writes.append(("patch", subresource or "spec", record["spec"]["effect"]))
        return copy.deepcopy(record)

    async def delete_cluster_object(self, api: str, plural: str, name: str, **_: Any) -> bool:
        self.cache.recs.pop(name)
        self.writes.append(("delete",))
        return True

    async def post_event(self, involved: Any, event_type: str, reason: str, message: str) -> None:
        self.events.append(reason)


def _merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386, as the apiserver applies a merge patch: objects merge, null removes, anything else replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    merged = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            merged.pop(key, None)
        else:
            merged[key] = _merge_patch(merged.get(key), value)
    return merged


def _setup(taint_age: timedelta | None) -> tuple[FakeCache, FakeKube, signals_controller.SignalsController]:
    cache = FakeCache(timestamps.now() - taint_age if taint_age is not None else None)
    kube = FakeKube(cache)
    return cache, kube, signals_controller.SignalsController(cache=cache, kube=kube)  # type: ignore[arg-type]


def _effect(cache: FakeCache) -> str | None:
    record = cache.recs.get(NAME)
    return None if record is None else str(record["spec"]["effect"])


def _verify(kube: FakeKube, at: datetime) -> None:
    asyncio.run(kube.merge_patch_cluster_object("", "", NAME, {"metadata": {"annotations": {
        signal_records.VERIFIED_ANNOTATION: timestamps.format_rfc3339(at)}}}))


def test_a_verified_clear_of_a_taint_still_there_keeps_the_record_and_stays_cleared() -> None:
    cache, kube, controller = _setup(timedelta(hours=2))  # older than the refault window
    asyncio.run(controller.reconcile(REF))
    assert _effect(cache) == "NoExecute"
    _verify(kube, timestamps.now() - timedelta(seconds=1))
    kube.writes.clear()
    for _ in range(3):  # the clear's reconcile, then what its writes and any deletion would bring
        asyncio.run(controller.reconcile(REF))
    assert _effect(cache) == "None"
    assert ("delete",) not in kube.writes and not [w for w in kube.writes if w[0] == "create"]
    # The clear's status and spec, its wording once more (no longer "verified ... at"), then nothing.
    assert len(kube.writes) <= 3


def test_a_record_without_a_mark_is_not_deleted_while_its_taint_is_there(monkeypatch: pytest.MonkeyPatch) -> None:
    cache, kube, controller = _setup(timedelta(hours=2))
    cache.policies = [cache.policy(_rule(count=3))]  # never reached by one taint
    for _ in range(3):
        asyncio.run(controller.reconcile(REF))
    assert _effect(cache) == "None"
    assert [w[0] for w in kube.writes] == ["create", "patch"]  # created once, its status once; no delete loop
    cache.devices[0]["taints"] = []  # the driver removed it: now nothing is signalled
    asyncio.run(controller.reconcile(REF))  # writes the removal
    later = timestamps.now() + timedelta(hours=1)
    monkeypatch.setattr(signals_controller, "now", lambda: later)
    asyncio.run(controller.reconcile(REF))  # nothing new, nothing signalled, the window over
    assert _effect(cache) is None and ("delete",) in kube.writes


def test_time_alone_looks_again_only_at_what_may_be_deleted() -> None:
    cache, _, controller = _setup(timedelta(hours=2))
    asyncio.run(controller.reconcile(REF))
    record = cache.recs[NAME]
    history = signal_records.record_history(record)
    assert history.marked_since is not None  # a held mark: nothing but a signal changes it
    from claimwarden.signals import decide, observations
    merged = signal_records.record_observations(record)
    held = decide.decide(None, merged, history, lambda *a: 1, timestamps.now())
    assert signals_lifetime.next_look(merged, held, None, timestamps.now(), deletable=True) is None
    assert held.effect == "NoExecute"  # and the mark holds without its policy
    assert observations.SOURCE_TAINT in {o.source for o in merged}


def test_a_mark_whose_rule_is_gone_holds_with_an_event() -> None:
    cache, kube, controller = _setup(timedelta(minutes=1))
    asyncio.run(controller.reconcile(REF))
    assert _effect(cache) == "NoExecute"
    cache.policies = [cache.policy(_rule(name="renamed", effect="NoSchedule"))]
    asyncio.run(controller.reconcile(REF))
    assert _effect(cache) == "NoExecute"
    assert signals_controller.ORPHANED_MARK in kube.events


def test_a_device_no_slice_lists_is_left_as_it_is() -> None:
    cache, kube, controller = _setup(timedelta(minutes=1))
    asyncio.run(controller.reconcile(REF))
    cache.devices = []  # its slice re-created without it (a driver restart, 1.37's new names)
    kube.writes.clear()
    with pytest.raises(Retry):
        asyncio.run(controller.reconcile(REF))
    assert kube.writes == [] and _effect(cache) == "NoExecute"


def test_a_verified_clear_stamped_by_a_clock_behind_covers_what_the_record_showed() -> None:
    cache, kube, controller = _setup(timedelta(minutes=1))
    asyncio.run(controller.reconcile(REF))
    _verify(kube, timestamps.now() - timedelta(minutes=5))  # a laptop 5 minutes behind: before the taint
    asyncio.run(controller.reconcile(REF))
    asyncio.run(controller.reconcile(REF))
    assert _effect(cache) == "None"


def test_the_fleet_view_counts_devices_by_signal() -> None:
    _, _, controller = _setup(None)
    fleet = controller.fleet
    from claimwarden.signals.observations import UNHEALTHY, Observation
    at = timestamps.now()

    def fault(value: str, seconds: int) -> Observation:
        return Observation("DriverTaint", KEY, value, UNHEALTHY, at - timedelta(seconds=seconds), f"{value}@{seconds}")

    fleet.replace(REF, [fault("79", 10), fault("48", 100)])
    other = DeviceRef(DRIVER, POOL, "gpu-1")
    fleet.replace(other, [fault("79", 50)])
    assert fleet.count("DriverTaint", KEY, "79", at - timedelta(seconds=60)) == 2
    assert fleet.count("DriverTaint", KEY, "79", at - timedelta(seconds=20)) == 1
    assert fleet.count("DriverTaint", KEY, "48", at - timedelta(seconds=60)) == 0
    assert fleet.devices("DriverTaint", KEY) == [REF, other]
    fleet.replace(REF, [])
    assert fleet.count("DriverTaint", KEY, "79", at - timedelta(seconds=60)) == 1
    assert fleet.devices("DriverTaint", KEY) == [other]
