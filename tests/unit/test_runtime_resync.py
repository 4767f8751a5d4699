"""The resync: the first round after leading forgets stale objects without queueing everything again."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from claimwarden.runtime import operator as runtime_module
from claimwarden.runtime.operator import KopfState, Runtime


def make_runtime() -> tuple[Runtime, list[str]]:
    rt = Runtime(cache=None, kube=None, workers_per_queue=1, resync_seconds=300,  # type: ignore[arg-type]
                 kopf_state=KopfState())
    calls: list[str] = []
    rt.enqueue_all = lambda: calls.append("enqueue_all")  # type: ignore[method-assign]
    return rt, calls


def test_the_first_round_queues_nothing_when_nothing_was_stale(monkeypatch: pytest.MonkeyPatch) -> None:
    async def nothing_stale(*_: Any) -> list[dict[str, Any]]:
        return []

    monkeypatch.setattr(runtime_module.staleness, "prune_stale", nothing_stale)
    rt, calls = make_runtime()
    asyncio.run(rt.resync_once(requeue=False))
    assert calls == []
    asyncio.run(rt.resync_once())
    assert calls == ["enqueue_all"]  # every later round queues every key


def test_the_first_round_queues_everything_once_something_was_forgotten(monkeypatch: pytest.MonkeyPatch) -> None:
    gone = {"kind": "Pod", "metadata": {"name": "p", "namespace": "ns", "uid": "old"}}

    async def one_stale(*_: Any) -> list[dict[str, Any]]:
        return [gone]

    monkeypatch.setattr(runtime_module.staleness, "prune_stale", one_stale)
    rt, calls = make_runtime()
    asyncio.run(rt.resync_once(requeue=False))
    assert calls == ["enqueue_all"]


def test_the_resync_loop_skips_only_its_first_full_requeue(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runtime_module, "FIRST_RESYNC_SECONDS", 0.0)
    rt, _ = make_runtime()
    rt.resync_seconds = 0.0
    rounds: list[bool] = []

    async def record(*, requeue: bool = True) -> None:
        rounds.append(requeue)
        if len(rounds) == 3:
            raise asyncio.CancelledError

    rt.resync_once = record  # type: ignore[method-assign]
    with pytest.raises(asyncio.CancelledError):
        asyncio.run(rt._resync())
    assert rounds == [False, True, True]
