"""Evictions read their records fresh: in a burst through shared metadata-only LISTs, each eviction
joining the next LIST to start and never one already under way (health/evictions.py)."""

from __future__ import annotations

import asyncio
from typing import Any

from claimwarden.health import breaker
from claimwarden.health.budget import TokenBucket
from claimwarden.health.evictions import Evictions


class _Records:
    """A cache holding each record at resourceVersion "1"."""

    def __init__(self, *names: str) -> None:
        self.bodies = {n: {"metadata": {"name": n, "resourceVersion": "1"}, "spec": {}} for n in names}

    def record(self, name: str) -> dict[str, Any] | None:
        return self.bodies.get(name)


class _Kube:
    """Answers metadata LISTs when told to; counts every read."""

    def __init__(self, versions: dict[str, str]) -> None:
        self.versions = versions
        self.lists = 0
        self.gets: list[str] = []
        self.release = asyncio.Event()

    async def list_metadata(self, api: str, plural: str) -> list[dict[str, Any]]:
        self.lists += 1
        await self.release.wait()
        self.release.clear()
        return [{"name": n, "resourceVersion": v} for n, v in self.versions.items()]

    async def get_cluster_object(self, api: str, plural: str, name: str) -> dict[str, Any] | None:
        self.gets.append(name)
        return {"metadata": {"name": name, "resourceVersion": self.versions.get(name, "")}}


async def _turns() -> None:
    """Let every task that can run, run."""
    for _ in range(10):
        await asyncio.sleep(0)


def _evictions(kube: _Kube, cache: _Records) -> Evictions:
    async def post(*_: Any) -> None:
        return None
    evictions = Evictions(kube=kube, cache=cache, post_event=post, on_evicted=lambda *_: None,  # type: ignore[arg-type]
                          breaker_settings=breaker.Settings(max_fraction=1.0), budget=TokenBucket(qps=0, burst=1))
    evictions.queue.add("another key")  # a burst: more evictions are waiting
    return evictions


def test_a_burst_shares_one_list_and_a_later_read_waits_for_the_next() -> None:
    async def run() -> None:
        kube = _Kube({"a": "1", "b": "1", "c": "2"})
        evictions = _evictions(kube, _Records("a", "b", "c", "d"))
        first = [asyncio.ensure_future(evictions._read_record(n)) for n in ("a", "b")]
        await _turns()
        assert kube.lists == 1
        late = asyncio.ensure_future(evictions._read_record("a"))  # asks while the first LIST is under way
        await _turns()
        assert kube.lists == 1, "one LIST at a time"
        kube.release.set()
        a, b = await asyncio.gather(*first)
        assert a is not None and b is not None and a["metadata"]["name"] == "a"
        await _turns()
        assert kube.lists == 2, "the late read gets a LIST that began after it asked"
        kube.release.set()
        assert (await late) is not None
        # Listed at another version than the cache's: read by name. Not listed: gone.
        mixed = [asyncio.ensure_future(evictions._read_record(n)) for n in ("c", "d")]
        await _turns()
        kube.release.set()
        c, d = await asyncio.gather(*mixed)
        assert kube.gets == ["c"] and c is not None and c["metadata"]["resourceVersion"] == "2"
        assert d is None
    asyncio.run(run())


def test_a_lone_eviction_reads_its_record_by_name() -> None:
    async def run() -> None:
        kube = _Kube({"a": "1"})
        evictions = _evictions(kube, _Records("a"))
        evictions.queue = type(evictions.queue)("empty")
        assert (await evictions._read_record("a")) is not None
        assert (kube.lists, kube.gets) == (0, ["a"])
    asyncio.run(run())
