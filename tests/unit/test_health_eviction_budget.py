"""Evictions and their tokens: a retry of an eviction a PodDisruptionBudget refused takes its token from
the retry budget, never the shared one (budget.py; issue 20 finding 8)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

import pytest

from claimwarden.health import breaker
from claimwarden.health.budget import FairBudget, TokenBucket
from claimwarden.health.evictions import Evictions
from claimwarden.health.plan import Eviction
from claimwarden.health.refusals import EvictionKey
from claimwarden.kube.errors import DISRUPTION_BUDGET_CAUSE, ApiError
from claimwarden.runtime.workqueue import Requeue

DEVICE = {"driver": "gpu.example.com", "pool": "node-0", "device": "gpu-0"}


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class _Kube:
    """Records, pods and claims by name; every pod of namespace `guarded` is protected by a PDB."""

    def __init__(self, guarded: str) -> None:
        self.guarded = guarded
        self.calls: list[str] = []

    async def get_cluster_object(self, api: str, plural: str, name: str) -> dict[str, Any]:
        return {"metadata": {"name": name, "resourceVersion": "1"},
                "spec": {**DEVICE, "effect": "NoExecute", "reason": "broken"}, "status": {}}

    async def list_cluster_objects(self, api: str, plural: str) -> list[dict[str, Any]]:
        return []  # a new leader's live read of the records' counts (none evicted yet)

    async def get_pod(self, namespace: str, name: str) -> dict[str, Any]:
        return {"metadata": {"namespace": namespace, "name": name, "uid": f"uid-{namespace}-{name}",
                             "resourceVersion": "1"}, "status": {"phase": "Running"}}

    async def get_claim(self, namespace: str, name: str) -> dict[str, Any]:
        return {"metadata": {"namespace": namespace, "name": name},
                "status": {"allocation": {"devices": {"results": [{**DEVICE, "request": "gpu"}]}},
                           "reservedFor": [{"resource": "pods", "name": n, "uid": f"uid-{namespace}-{n}"}
                                           for n in ("p0", "p1", "p2")]}}

    async def evict_pod(self, namespace: str, name: str, uid: str, resource_version: str | None = None) -> None:
        self.calls.append(f"{namespace}/{name}")
        if namespace == self.guarded:
            raise ApiError(429, "TooManyRequests", "Cannot evict pod as it would violate the pod's disruption budget.",
                           causes=(DISRUPTION_BUDGET_CAUSE,))

    async def post_event(self, *_: Any) -> None:
        return None


def _key(namespace: str, pod: str) -> EvictionKey:
    return ("record", namespace, pod, f"uid-{namespace}-{pod}", "claim")


def _evictions(kube: _Kube, clock: Clock, *, retry_qps: float) -> Evictions:
    async def post(*_: Any) -> None:
        return None
    return Evictions(kube=kube, cache=None, post_event=post, on_evicted=lambda *_: None,  # type: ignore[arg-type]
                     breaker_settings=breaker.Settings(max_fraction=1.0),
                     budget=FairBudget(TokenBucket(qps=1, burst=1, clock=clock)),
                     retry_budget=FairBudget(TokenBucket(qps=retry_qps, burst=1, clock=clock)))


def test_retries_of_refused_evictions_take_no_token_of_the_shared_budget() -> None:
    async def run() -> None:
        clock, kube = Clock(), _Kube(guarded="a")
        evictions = _evictions(kube, clock, retry_qps=0.01)
        with pytest.raises(Requeue):  # the first call takes the shared token and is refused
            await evictions.reconcile(_key("a", "p0"))
        clock.now += 1  # one shared token again
        with pytest.raises(Requeue):  # the retry: the retry budget's token
            await evictions.reconcile(_key("a", "p0"))
        await evictions.reconcile(_key("a", "p0"))  # the retry budget is empty now: parked there
        assert evictions.retry_budget.is_parked(_key("a", "p0"))
        assert kube.calls == ["a/p0", "a/p0"]
        await evictions.reconcile(_key("b", "p0"))  # the shared token is still there for another namespace
        assert kube.calls == ["a/p0", "a/p0", "b/p0"]
        assert evictions.blocked("record")
    asyncio.run(run())


def test_before_the_fix_refused_retries_would_have_spent_the_shared_token() -> None:
    """The same run with one budget for both (what main did): namespace b's eviction then waits."""
    async def run() -> None:
        clock, kube = Clock(), _Kube(guarded="a")
        evictions = _evictions(kube, clock, retry_qps=0.01)
        evictions.retry_budget = evictions.budget
        with pytest.raises(Requeue):
            await evictions.reconcile(_key("a", "p0"))
        clock.now += 1
        with pytest.raises(Requeue):
            await evictions.reconcile(_key("a", "p0"))
        await evictions.reconcile(_key("b", "p0"))
        assert kube.calls == ["a/p0", "a/p0"]  # b parked behind the refused retry
        assert evictions.budget.is_parked(_key("b", "p0"))
    asyncio.run(run())


def test_a_token_not_spent_on_a_call_goes_back_to_its_budget() -> None:
    async def run() -> None:
        clock, kube = Clock(), _Kube(guarded="none")
        evictions = _evictions(kube, clock, retry_qps=1)

        async def gone(namespace: str, name: str) -> None:
            return None
        kube.get_pod = gone  # type: ignore[assignment,method-assign]
        await evictions.reconcile(_key("a", "p0"))  # the pod is gone: no call, the token goes back
        assert kube.calls == [] and evictions.budget.bucket.wait() == 0.0
    asyncio.run(run())


def test_a_refused_eviction_that_goes_through_promotes_the_namespaces_next_to_the_shared_budget() -> None:
    """A PodDisruptionBudget relaxed for all: the refused evictions drain at the shared budget's pace, one
    promoted by each that went through, not at the retry budget's."""
    async def run() -> None:
        clock, kube = Clock(), _Kube(guarded="a")
        evictions = _evictions(kube, clock, retry_qps=0.01)
        evictions.budget = FairBudget(TokenBucket(qps=100, burst=10, clock=clock))
        for pod in ("p0", "p1", "p2"):
            with pytest.raises(Requeue):
                await evictions.reconcile(_key("a", pod))
        assert evictions._budget_for(_key("a", "p1")) is evictions.retry_budget
        kube.guarded = "none"  # the budget now allows every disruption
        clock.now += 100  # one retry token
        await evictions.reconcile(_key("a", "p0"))
        assert kube.calls[-1] == "a/p0"
        assert evictions._budget_for(_key("a", "p1")) is evictions.budget  # promoted, and queued at once
        assert evictions._budget_for(_key("a", "p2")) is evictions.retry_budget
        assert len(evictions.queue) == 1
        await evictions.reconcile(_key("a", "p1"))  # no retry token left: it went on the shared budget
        assert kube.calls[-1] == "a/p1"
        assert evictions._budget_for(_key("a", "p2")) is evictions.budget
        assert evictions.refusals.attempts.keys() == {_key("a", "p2")}  # promoted, its retry still to come
    asyncio.run(run())


def test_a_refused_eviction_scheduled_again_waits_out_its_back_off() -> None:
    """A record looked at every second (drain Node, controller.NODE_DRAIN_RECHECK) schedules its evictions again
    each time: one a PodDisruptionBudget refused must still wait its back-off, not be retried every second."""
    async def run() -> None:
        clock, kube = Clock(), _Kube(guarded="a")
        evictions = _evictions(kube, clock, retry_qps=100)
        key = _key("a", "p0")
        with pytest.raises(Requeue) as refused:
            await evictions.reconcile(key)
        evictions.queue.add_after(key, refused.value.delay)  # what the worker does with the Requeue
        moment = datetime.now(UTC)
        evictions.schedule("record", Eviction("a", "p0", "uid-a-p0", "claim", moment), moment)
        assert len(evictions.queue) == 0  # still waiting for its back-off timer
        evictions.schedule("record", Eviction("b", "p0", "uid-b-p0", "claim", moment), moment)
        assert len(evictions.queue) == 1  # a key never refused goes at once
        evictions.queue.shutdown()
    asyncio.run(run())


class _NodeDrainKube(_Kube):
    """A drain Node record of DEVICE; every claim holds another device; every pod runs on node-0."""

    async def get_cluster_object(self, api: str, plural: str, name: str) -> dict[str, Any]:
        record = await super().get_cluster_object(api, plural, name)
        record["spec"]["drain"] = "Node"
        return record

    async def get_pod(self, namespace: str, name: str) -> dict[str, Any]:
        return {**await super().get_pod(namespace, name), "spec": {"nodeName": "node-0"}}

    async def get_claim(self, namespace: str, name: str) -> dict[str, Any]:
        claim = await super().get_claim(namespace, name)
        claim["status"]["allocation"]["devices"]["results"][0]["device"] = "gpu-9"
        return claim


class _Slices:
    """A cache holding only the slice of DEVICE's pool, `slice_spec` merged into its spec."""

    def __init__(self, **slice_spec: Any) -> None:
        self.slice = {"metadata": {"name": "s"}, "spec": {"driver": DEVICE["driver"], "pool": {"name": DEVICE["pool"]},
                                                          "devices": [{"name": DEVICE["device"]}], **slice_spec}}

    def resource_slices_of_pool(self, driver: str, pool: str) -> list[dict[str, Any]]:
        return [self.slice]

    def pod(self, namespace: str, name: str) -> None:
        return None

    def claim(self, namespace: str, name: str) -> None:
        return None

    def record(self, name: str) -> None:
        return None


@pytest.mark.parametrize(("slice_spec", "evicted"), [({"nodeName": "node-0"}, True), ({"allNodes": True}, False)])
def test_drain_node_skips_the_claim_check_only_for_pods_of_the_devices_node(slice_spec: dict[str, Any],
                                                                            evicted: bool) -> None:
    """drain Node evicts every pod of the device's node, whatever its claims hold; a device tied to no one node
    drains as Immediate, so a pod whose claim does not hold it stays."""
    async def run() -> None:
        clock, kube = Clock(), _NodeDrainKube(guarded="none")
        evictions = _evictions(kube, clock, retry_qps=1)
        evictions.reads.cache = _Slices(**slice_spec)  # type: ignore[assignment]
        await evictions.reconcile(_key("a", "p0"))
        assert kube.calls == (["a/p0"] if evicted else [])
    asyncio.run(run())
