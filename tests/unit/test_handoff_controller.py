"""The hand-off controller against an in-memory cache and API (review of issue 22, part 3): a restart does not
release a held recovery, a failing hand-off still writes the recommendation, two workers open one request per node,
and the gauge forgets a record deleted while no event came."""

from __future__ import annotations

import asyncio
import copy
from typing import Any, cast

import pytest

from claimwarden import metrics
from claimwarden.handoff import actions, externalfaults
from claimwarden.handoff.actions import Recommendation, recommend
from claimwarden.handoff.controller import HandoffController, HandoffSettings
from claimwarden.kube.errors import ApiError

NODE = "node-a"
DRIVER = "gpu.example.com"


def _record(device: str, uid: str, *, action: str | None = "NodeReboot") -> dict[str, Any]:
    spec: dict[str, Any] = {"driver": DRIVER, "pool": NODE, "device": device, "effect": "NoSchedule",
                            "reason": "broken"}
    if action is not None:
        spec["recommendedAction"] = action
    return {"metadata": {"name": f"rec-{device}", "uid": uid, "creationTimestamp": "2026-12-02T11:00:00Z",
                         "resourceVersion": "1"}, "spec": spec, "status": {}}


SLICE = {"metadata": {"name": "s"}, "spec": {"driver": DRIVER, "pool": {"name": NODE}, "nodeName": NODE, "devices": [
    {"name": f"gpu-{i}", "attributes": {"uuid": {"string": f"GPU-{i}"}}} for i in range(4)]}}


class FakeCache:
    def __init__(self, *records: dict[str, Any]) -> None:
        self.by_name = {r["metadata"]["name"]: r for r in records}

    def record(self, name: str) -> dict[str, Any] | None:
        return self.by_name.get(name)

    def records(self) -> list[dict[str, Any]]:
        return list(self.by_name.values())

    def health_policies(self) -> list[dict[str, Any]]:
        return []

    def resource_slices_of_pool(self, driver: str, pool: str) -> list[dict[str, Any]]:
        return [SLICE] if (driver, pool) == (DRIVER, NODE) else []


class FakeKube:
    def __init__(self) -> None:
        self.faults: dict[str, dict[str, Any]] = {}
        self.list_error: ApiError | None = None
        self.patches: list[tuple[str, dict[str, Any]]] = []
        self.events: list[str] = []
        self.create_entered = asyncio.Event()
        self.create_gate: asyncio.Event | None = None  # set: the first create waits for it

    async def served_version(self, group: str, plural: str, versions: tuple[str, ...]) -> str | None:
        await asyncio.sleep(0)
        return "v1"

    async def list_cluster_objects(self, group_version: str, plural: str) -> list[dict[str, Any]]:
        await asyncio.sleep(0)
        if self.list_error is not None:
            raise self.list_error
        return copy.deepcopy(list(self.faults.values()))

    async def create_cluster_object(self, group_version: str, plural: str, body: dict[str, Any]) -> dict[str, Any]:
        self.create_entered.set()
        gate, self.create_gate = self.create_gate, None
        if gate is not None:
            await gate.wait()
        name = body["metadata"]["name"]
        if name in self.faults:
            raise ApiError(409, "AlreadyExists", name)
        self.faults[name] = copy.deepcopy(body)
        return body

    async def merge_patch_cluster_object(self, group_version: str, plural: str, name: str, patch: dict[str, Any],
                                         subresource: str | None = None) -> dict[str, Any]:
        self.patches.append((name, patch))
        return {"metadata": {"name": name, "resourceVersion": "2"}}

    async def post_event(self, involved: dict[str, Any], event_type: str, reason: str, message: str) -> None:
        self.events.append(reason)


def _controller(cache: FakeCache, kube: FakeKube, cleared: list[Any] | None = None) -> HandoffController:
    return HandoffController(cache=cast(Any, cache), kube=cast(Any, kube),
                             settings=HandoffSettings(nvsentinel=True, poll_seconds=60),
                             on_cleared=cleared.append if cleared is not None else None)


def test_a_restart_does_not_release_a_held_recovery_before_nvsentinel_is_read() -> None:
    """After a restart (or a failover) the signals controller may ask before the hand-off has read NVSentinel's
    objects: the verified clear must still wait, and apply once the hand-off has looked."""
    record = _record("gpu-1", "u1")

    async def scenario() -> None:
        kube, cleared = FakeKube(), []
        controller = _controller(FakeCache(record), kube, cleared)
        assert controller.recovery_hold(record), "held until NVSentinel's objects are read"
        await controller.held(record, controller.recovery_hold(record) or "")
        await controller.reconcile(record["metadata"]["name"])
        assert controller.recovery_hold(record), "handed off now, not cleared: still held"
        [fault] = kube.faults.values()
        fault["status"] = {"completionTime": "2026-12-02T12:00:00Z",
                           "conditions": [{"type": "FaultCleared", "status": "True"}]}
        controller._listed_at = float("-inf")
        await controller.reconcile(record["metadata"]["name"])
        assert controller.recovery_hold(record) is None and len(cleared) == 1

    asyncio.run(scenario())


def test_a_failing_hand_off_still_writes_the_recommendation() -> None:
    """ExternalFaults served but not granted (a 403 on list) or refused by NVSentinel's webhook: the record's
    status.recommendedAction, which any repair system reads, is written all the same; the error is retried."""
    record = _record("gpu-1", "u1")

    async def scenario() -> None:
        kube = FakeKube()
        kube.list_error = ApiError(403, "Forbidden", "externalfaults is forbidden")
        controller = _controller(FakeCache(record), kube)
        with pytest.raises(ApiError):
            await controller.reconcile(record["metadata"]["name"])
        assert [p["status"]["recommendedAction"] for _, p in kube.patches] == ["NodeReboot"]
        assert "RepairRecommended" in kube.events

    asyncio.run(scenario())


def test_two_workers_open_one_request_per_node() -> None:
    """Two records of one node reconciled at once (the queue has many workers) while the first one's create is in
    flight: the second must see the first's request, not plan its own under another name."""
    first, second = _record("gpu-1", "u2"), _record("gpu-2", "u1")  # the second's key sorts first: another name
    cache = FakeCache(first)

    async def scenario() -> None:
        kube = FakeKube()
        gate = kube.create_gate = asyncio.Event()
        controller = _controller(cache, kube)
        one = asyncio.create_task(controller.reconcile(first["metadata"]["name"]))
        await kube.create_entered.wait()
        cache.by_name[second["metadata"]["name"]] = second
        two = asyncio.create_task(controller.reconcile(second["metadata"]["name"]))
        for _ in range(20):
            await asyncio.sleep(0)
        gate.set()
        await asyncio.gather(one, two)
        open_requests = [f for f in kube.faults.values() if externalfaults.is_open(f)]
        assert len(open_requests) == 1, [f["metadata"]["name"] for f in open_requests]

    asyncio.run(scenario())


def test_the_gauge_forgets_a_record_deleted_while_no_event_came() -> None:
    record = _record("gpu-3", "u3")
    cache = FakeCache(record)

    async def scenario() -> None:
        controller = _controller(cache, FakeKube())
        controller.settings = HandoffSettings()
        await controller.reconcile(record["metadata"]["name"])
        del cache.by_name[record["metadata"]["name"]]  # its DELETED event was lost (a watch down)
        controller.enqueue_all()  # the resync
        while len(controller.queue):
            key = await controller.queue.get()
            assert key is not None
            await controller.reconcile(key)
            controller.queue.done(key)
        shown = metrics.REGISTRY.get_sample_value("claimwarden_repair_recommended", {"action": "NodeReboot"})
        assert shown == 0

    asyncio.run(scenario())


@pytest.mark.parametrize("asked", ["None", "GpuReset"])
def test_an_explicit_action_wins_over_a_node_condition(asked: str) -> None:
    """A person (or the rule) saying None or GpuReset: the status says so, and NVSentinel is not asked to take
    the node (a node's condition counts only when nothing names the repair)."""
    record = _record("gpu-1", "u1", action=asked)
    found = recommend(record, rule=None, policy=None, observations=[])
    assert found.action == asked
    assert not externalfaults.node_scoped(record, found, node_condition=True)
    assert externalfaults.node_scoped(_record("gpu-1", "u1", action=None), Recommendation(actions.NONE, "x"),
                                      node_condition=True)


def test_a_poll_of_a_handed_off_record_does_not_look_at_every_record() -> None:
    """Each record with an open request is read again every poll period: at ten thousand records, a scan of all of
    them per poll is quadratic. Only a fault that may open a request looks at the node's other records."""
    record, other = _record("gpu-1", "u1"), _record("gpu-2", "u2")
    cache = FakeCache(record)

    class Counting(FakeCache):
        scans = 0

        def records(self) -> list[dict[str, Any]]:
            Counting.scans += 1
            return super().records()

    async def scenario() -> None:
        controller = _controller(cache, FakeKube())
        await controller.reconcile(record["metadata"]["name"])
        counting = Counting(record, other)
        controller.cache = cast(Any, counting)
        controller._listed_at = float("-inf")
        await controller.reconcile(record["metadata"]["name"])  # covered: a poll
        await controller.reconcile(other["metadata"]["name"])   # the node's request is open: waits
        assert Counting.scans == 0

    asyncio.run(scenario())
    open_request = {"metadata": {"name": "x"}, "spec": {"healthEvent": {"nodeName": NODE}}}
    assert not externalfaults.may_open("u9@t", NODE, [open_request])
    assert externalfaults.may_open("u9@t", "node-b", [open_request])


def test_a_person_naming_the_repair_releases_a_hold_nvsentinel_will_never_clear() -> None:
    """NVSentinel uninstalled with its CRD kept: the request stays open for ever. The person's way out."""
    record = _record("gpu-1", "u1")

    async def scenario() -> None:
        controller = _controller(FakeCache(record), FakeKube())
        await controller.reconcile(record["metadata"]["name"])
        assert controller.recovery_hold(record)
        record["spec"]["recommendedAction"] = actions.GPU_RESET
        assert controller.recovery_hold(record) is None

    asyncio.run(scenario())
