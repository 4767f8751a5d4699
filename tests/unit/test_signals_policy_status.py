"""A HealthPolicy's status: what is written (counts, Accepted with the errors in words, observedGeneration),
that it is written only on change, and that a CEL error on a device is reported once per policy and device."""

from __future__ import annotations

import asyncio
import copy
import itertools
from datetime import UTC, datetime, timedelta
from typing import Any

from claimwarden.signals import policy as hp
from claimwarden.signals.policy_status import PolicyStatuses

from .test_signals_controller import REF, FakeCache, FakeKube, _rule, _setup

T0 = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)
RULE = {"name": "xid", "source": "DriverTaint", "signal": "gpu.example.com/xid", "effect": "NoExecute",
        "mode": "Enforce"}
_versions = itertools.count(1000)


def _policy(generation: int = 1, status: dict[str, Any] | None = None, **spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": "p", "uid": "u", "generation": generation, "resourceVersion": str(next(_versions))},
            "spec": {"rules": [RULE, {**RULE, "name": "shadow", "mode": "Shadow"}], **spec},
            "status": status or {}}


def test_an_accepted_policy_says_its_counts_and_the_generation_read() -> None:
    status = hp.desired_status(_policy(generation=3), None, T0)
    assert status == {"rules": 2, "enforced": 1, "observedGeneration": 3, "conditions": [
        {"type": "Accepted", "status": "True", "reason": "Accepted", "message": "2 rules, 1 enforced",
         "lastTransitionTime": "2026-12-02T12:00:00Z", "observedGeneration": 3}]}


def test_an_invalid_or_unroutable_policy_says_why_in_words() -> None:
    invalid = hp.desired_status(_policy(rules=[{**RULE, "effect": "Evict"}]), None, T0)
    assert (invalid["rules"], invalid["enforced"]) == (0, 0)
    accepted = invalid["conditions"][0]
    assert (accepted["status"], accepted["reason"]) == ("False", "Invalid")
    assert "spec.rules[0].effect: 'Evict' is not one of" in accepted["message"]
    unroutable = hp.desired_status(_policy(), "DeviceClass gpu does not exist", T0)["conditions"][0]
    assert (unroutable["status"], unroutable["reason"], unroutable["message"]) == (
        "False", "NotRoutable", "DeviceClass gpu does not exist")


def test_the_transition_time_moves_only_when_accepted_changes() -> None:
    first = hp.desired_status(_policy(), None, T0)
    later = T0 + timedelta(hours=1)
    # a new generation with another rule count: same status, the time of the transition kept
    again = hp.desired_status(_policy(generation=2, status=first, rules=[RULE]), None, later)
    assert again["conditions"][0]["lastTransitionTime"] == "2026-12-02T12:00:00Z"
    assert again["conditions"][0]["message"] == "1 rules, 1 enforced"
    broken = hp.desired_status(_policy(generation=3, status=again), "spec.selector: compile error", later)
    assert broken["conditions"][0]["lastTransitionTime"] == "2026-12-02T13:00:00Z"


def test_other_writers_conditions_are_kept() -> None:
    theirs = {"type": "Reviewed", "status": "True", "reason": "ByHand", "message": "ok",
              "lastTransitionTime": "2026-01-01T00:00:00Z"}
    status = hp.desired_status(_policy(status={"conditions": [theirs]}), None, T0)
    assert status["conditions"][0] == theirs and status["conditions"][1]["type"] == "Accepted"


def test_a_status_that_already_says_it_is_not_written() -> None:
    desired = hp.desired_status(_policy(), None, T0)
    assert hp.status_patch(desired, desired) is None
    assert hp.status_patch({**desired, "enforced": 2}, desired) == {"status": desired}


class _PolicyCache:
    def __init__(self) -> None:
        self.body = _policy()

    def health_policies(self) -> list[dict[str, Any]]:
        return [self.body]


class _PolicyKube:
    def __init__(self, cache: _PolicyCache, *, watch_brings_it: bool) -> None:
        self.cache, self.watch_brings_it = cache, watch_brings_it
        self.patches: list[dict[str, Any]] = []

    async def merge_patch_cluster_object(self, api: str, plural: str, name: str, patch: dict[str, Any],
                                         subresource: str = "") -> dict[str, Any]:
        assert (api, plural, name, subresource) == ("claimwarden.io/v1alpha1", "healthpolicies", "p", "status")
        self.patches.append(patch)
        written = copy.deepcopy(self.cache.body)
        written["status"] = copy.deepcopy(patch["status"])
        written["metadata"]["resourceVersion"] = str(next(_versions))
        if self.watch_brings_it:
            self.cache.body = copy.deepcopy(written)
        return written


def _statuses(*, watch_brings_it: bool) -> tuple[_PolicyCache, _PolicyKube, PolicyStatuses]:
    cache = _PolicyCache()
    kube = _PolicyKube(cache, watch_brings_it=watch_brings_it)
    errors: dict[str, str] = {}
    return cache, kube, PolicyStatuses(cache=cache, kube=kube, route_errors=lambda: errors)  # type: ignore[arg-type]


def test_the_status_is_written_once_and_again_only_on_change() -> None:
    cache, kube, statuses = _statuses(watch_brings_it=True)
    for _ in range(3):
        asyncio.run(statuses.reconcile("p"))
    assert len(kube.patches) == 1
    assert cache.body["status"]["conditions"][0]["status"] == "True"
    cache.body = {**cache.body, "metadata": {**cache.body["metadata"], "generation": 2},
                  "spec": {"rules": [RULE]}}
    asyncio.run(statuses.reconcile("p"))
    asyncio.run(statuses.reconcile("p"))
    assert len(kube.patches) == 2
    assert (cache.body["status"]["observedGeneration"], cache.body["status"]["rules"]) == (2, 1)


def test_a_status_the_watch_has_not_brought_back_is_not_written_again() -> None:
    _, kube, statuses = _statuses(watch_brings_it=False)
    for _ in range(3):
        asyncio.run(statuses.reconcile("p"))
    assert len(kube.patches) == 1


def test_a_gone_policy_writes_nothing() -> None:
    _, kube, statuses = _statuses(watch_brings_it=True)
    asyncio.run(statuses.reconcile("other"))
    assert kube.patches == []


def _controller_with_a_strict_selector() -> tuple[FakeCache, FakeKube, Any]:
    cache, kube, controller = _setup(timedelta(minutes=1))
    strict = cache.policy(_rule())
    strict["metadata"].update(name="strict", uid="u-strict")
    strict["spec"].update(priority=5, selector="device.attributes['gpu.example.com'].cores > 2")
    cache.policies = [strict, cache.policy(_rule())]
    return cache, kube, controller


def test_a_cel_error_on_a_device_is_reported_once_per_policy_and_device() -> None:
    cache, kube, controller = _controller_with_a_strict_selector()

    async def twice() -> None:
        for _ in range(2):
            await controller.reconcile(REF)
        await asyncio.sleep(0)  # the events are posted by tasks of their own
        await asyncio.gather(*controller._tasks)

    asyncio.run(twice())
    assert kube.events.count("HealthPolicyEvaluationError") == 1
    assert cache.recs  # the device was routed to the other policy, and marked by it


def test_a_status_write_routes_no_device_again() -> None:
    _, _, controller = _setup(timedelta(minutes=1))  # one device signalled
    controller.policy_event("p", 1)
    assert (len(controller.queue), len(controller.statuses.queue)) == (1, 1)

    async def take() -> None:
        key = await controller.queue.get()
        controller.queue.done(key)

    asyncio.run(take())
    controller.policy_event("p", 1)  # what our own status write brings: the same generation
    assert len(controller.queue) == 0
    controller.policy_event("p", 2)  # a new spec: the devices are routed again
    assert len(controller.queue) == 1
