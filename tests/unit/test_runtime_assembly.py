"""The runtime is built with its collaborators (runtime/assembly.py) and started by `Runtime.start`."""

from __future__ import annotations

import asyncio
from typing import Any

from claimwarden.cache import POD_BY_PODGROUP, Cache, index_views
from claimwarden.cli import ALL_CONTROLLERS
from claimwarden.handoff.controller import HandoffSettings
from claimwarden.health.controller import HealthSettings
from claimwarden.runtime import assembly
from claimwarden.runtime.operator import Runtime
from claimwarden.runtime.workqueue import WorkQueue
from claimwarden.settings import RunSettings


def _settings(**changes: Any) -> RunSettings:
    base: dict[str, Any] = dict(
        controllers=ALL_CONTROLLERS, metrics_address="127.0.0.1", metrics_port=0, kubeconfig=None, namespace="cw",
        workers=3, request_timeout=5.0, api_qps=0.0, api_burst=1, resync_seconds=300.0, metrics_cache_seconds=1.0,
        election=None, health=HealthSettings(), handoff=HandoffSettings())
    return RunSettings(**{**base, **changes})


def _cache(pods_in_group: list[str]) -> Cache:
    pods = {("ns", p): [{"metadata": {"name": p, "namespace": "ns"}}] for p in pods_in_group}
    pods.update({(POD_BY_PODGROUP, "ns", "team"): list(pods_in_group)})
    return Cache(index_views({"pods": pods, "claims": {}, "templates_by_name": {}}))


def _keys(queue: WorkQueue) -> list[Any]:
    keys = []
    while len(queue):
        keys.append(queue._queue.get_nowait())
    return keys


def test_the_podgroups_controller_is_handed_to_claims_at_construction_and_queues_its_members() -> None:
    loops: list[tuple[Any, ...]] = []
    claims, podgroups = assembly._claims_controllers(
        settings=_settings(podgroup_version="v1beta1"), cache=_cache(["p1", "p2"]), kube=None,  # type: ignore[arg-type]
        loop=lambda *loop: loops.append(loop))
    assert claims is not None and podgroups is not None
    assert claims.podgroups is podgroups
    assert [loop[0] for loop in loops] == [claims.queue, podgroups.queue]
    podgroups._on_claim("ns", "team")  # type: ignore[misc]
    assert _keys(claims.queue) == [("ns", "p1"), ("ns", "p2")]


def test_without_served_podgroups_or_without_claims_no_podgroups_controller() -> None:
    claims, podgroups = assembly._claims_controllers(settings=_settings(), cache=_cache([]), kube=None,  # type: ignore[arg-type]
                                                     loop=lambda *_: None)
    assert claims is not None and claims.podgroups is None and podgroups is None
    none = assembly._claims_controllers(settings=_settings(controllers=("health",), podgroup_version="v1beta1"),
                                        cache=_cache([]), kube=None, loop=lambda *_: None)  # type: ignore[arg-type]
    assert none == (None, None)


class _Elector:
    def __init__(self) -> None:
        self.ran = asyncio.Event()

    async def run(self) -> None:
        self.ran.set()


def test_start_leads_at_once_without_an_elector_and_runs_the_election_with_one() -> None:
    async def scenario() -> tuple[bool, bool, bool]:
        alone = Runtime(cache=_cache([]), kube=None, workers_per_queue=1, resync_seconds=300)  # type: ignore[arg-type]
        await alone.start()
        elector = _Elector()
        elected = Runtime(cache=_cache([]), kube=None, workers_per_queue=1, resync_seconds=300,  # type: ignore[arg-type]
                          elector=elector)  # type: ignore[arg-type]
        await elected.start()
        assert elected.election is not None
        await asyncio.wait_for(elector.ran.wait(), 1)
        for task in alone.background:
            task.cancel()
        return alone.leading, elected.leading, elected.election.done()

    assert asyncio.run(scenario()) == (True, False, True)
