"""The runtime is built with its collaborators (runtime/assembly.py) and started by `Runtime.start`."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
from kubernetes.aio import client as aio

from claimwarden.cache import POD_BY_PODGROUP, Cache, index_views
from claimwarden.cli import ALL_CONTROLLERS
from claimwarden.handoff.controller import HandoffSettings
from claimwarden.health.controller import HealthSettings
from claimwarden.health.records import DeviceRef
from claimwarden.kube.api import Kube
from claimwarden.kube.errors import NotLeader
from claimwarden.leader.elector import ElectionSettings
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


def _connect_offline(monkeypatch: pytest.MonkeyPatch) -> None:
    """Kube.connect without a kubeconfig: a client of nothing, built with what build_runtime hands it."""
    async def connect(*_: Any, fence: Callable[[], float] | None = None, **__: Any) -> Kube:
        return Kube(aio.ApiClient(aio.Configuration(host="http://127.0.0.1:9")), fence=fence)

    monkeypatch.setattr(assembly.Kube, "connect", staticmethod(connect))


def test_writes_are_fenced_by_the_elector_from_construction_and_never_without_an_election(
        monkeypatch: pytest.MonkeyPatch) -> None:
    _connect_offline(monkeypatch)

    async def scenario(election: ElectionSettings | None) -> tuple[Runtime, bool]:
        runtime = await assembly.build_runtime(settings=_settings(controllers=("claims",), election=election),
                                               cache=_cache([]), kopf_state=None, signals=False)  # type: ignore[arg-type]
        try:
            runtime.kube._time_for(True, "POST", "/x")
            refused = False
        except NotLeader:
            refused = True
        await runtime.kube.close()
        if runtime.elector is not None:
            await runtime.elector.kube.close()
        return runtime, refused

    elected, refused = asyncio.run(scenario(ElectionSettings(namespace="cw", identity="me")))
    assert elected.elector is not None and refused, "a standby (not leading yet) sends no write"
    alone, refused = asyncio.run(scenario(None))
    assert alone.elector is None and not refused


def test_the_hand_off_is_the_signals_repair_gate_from_construction_and_queues_their_devices(
        monkeypatch: pytest.MonkeyPatch) -> None:
    _connect_offline(monkeypatch)

    async def no_tasks(*_: Any) -> None:
        return None

    monkeypatch.setattr(assembly, "_start_health_tasks", no_tasks)

    async def scenario(signals: bool) -> Runtime:
        runtime = await assembly.build_runtime(settings=_settings(controllers=("health",)), cache=_cache([]),
                                               kopf_state=None, signals=signals)  # type: ignore[arg-type]
        await runtime.kube.close()
        return runtime

    runtime = asyncio.run(scenario(True))
    assert runtime.signals is not None and runtime.handoff is not None
    assert runtime.signals.repair_gate is runtime.handoff
    ref = DeviceRef("gpu.example.com", "node-0", "gpu-0")
    assert runtime.handoff.on_cleared is not None
    runtime.handoff.on_cleared(ref)
    assert _keys(runtime.signals.queue) == [ref]
    without = asyncio.run(scenario(False))
    assert without.signals is None and without.handoff is not None and without.handoff.on_cleared is None


def test_a_build_that_fails_closes_the_connections_it_opened(monkeypatch: pytest.MonkeyPatch) -> None:
    """Kopf retries a start-up handler that raised: a failed build must not leave its connections open."""
    opened: list[Kube] = []

    async def connect(*_: Any, fence: Callable[[], float] | None = None, **__: Any) -> Kube:
        kube = Kube(aio.ApiClient(aio.Configuration(host="http://127.0.0.1:9")), fence=fence)
        opened.append(kube)
        return kube

    def broken(**_: Any) -> Any:
        raise RuntimeError("a controller could not be built")

    monkeypatch.setattr(assembly.Kube, "connect", staticmethod(connect))
    monkeypatch.setattr(assembly, "_claims_controllers", broken)
    closed: list[Kube] = []
    original_close = Kube.close

    async def close(self: Kube) -> None:
        closed.append(self)
        await original_close(self)

    monkeypatch.setattr(Kube, "close", close)
    with pytest.raises(RuntimeError, match="could not be built"):
        asyncio.run(assembly.build_runtime(
            settings=_settings(controllers=("claims",), election=ElectionSettings(namespace="cw", identity="me")),
            cache=_cache([]), kopf_state=None, signals=False))  # type: ignore[arg-type]
    assert len(opened) == 2, "the lease's connections and the controllers'"
    assert sorted(map(id, closed)) == sorted(map(id, opened))
