"""Fresh reads shared by a burst (kube/next_read.py) and how evictions read their records with them
(health/eviction_reads.py)."""

from __future__ import annotations

import asyncio
from typing import Any

from claimwarden.health import breaker
from claimwarden.health.budget import FairBudget, TokenBucket
from claimwarden.health.evictions import Evictions
from claimwarden.kube.errors import ApiError
from claimwarden.kube.next_read import NextRead


async def _turns() -> None:
    """Let every task that can run, run."""
    for _ in range(10):
        await asyncio.sleep(0)


class _Gated:
    """A read that answers when told to; counts its calls."""

    def __init__(self) -> None:
        self.calls = 0
        self.release = asyncio.Event()
        self.fail: Exception | None = None

    async def __call__(self) -> int:
        self.calls += 1
        await self.release.wait()
        self.release.clear()
        if self.fail is not None:
            raise self.fail
        return self.calls


def test_callers_share_the_next_read_and_never_one_under_way() -> None:
    async def run() -> None:
        read = _Gated()
        shared = NextRead(read)
        first = [asyncio.ensure_future(shared.get()) for _ in range(3)]
        await _turns()
        assert read.calls == 1 and shared.busy
        late = asyncio.ensure_future(shared.get())  # asks while the first read is under way
        await _turns()
        assert read.calls == 1, "one read at a time"
        read.release.set()
        assert await asyncio.gather(*first) == [1, 1, 1]
        await _turns()
        assert read.calls == 2, "the late caller gets a read that began after it asked"
        read.release.set()
        assert await late == 2
        await _turns()
        assert not shared.busy
    asyncio.run(run())


def test_a_failed_read_fails_its_callers_and_the_next_one_reads_again() -> None:
    async def run() -> None:
        read = _Gated()
        read.fail = ApiError(500, "InternalError", "etcd is sad")
        shared = NextRead(read)
        callers = [asyncio.ensure_future(shared.get()) for _ in range(2)]
        await _turns()
        read.release.set()
        results = await asyncio.gather(*callers, return_exceptions=True)
        assert all(isinstance(r, ApiError) for r in results)
        read.fail = None
        again = asyncio.ensure_future(shared.get())
        await _turns()
        read.release.set()
        assert await again == 2
    asyncio.run(run())


class _Records:
    """A cache holding each record at resourceVersion "1"."""

    def __init__(self, *names: str) -> None:
        self.bodies = {n: {"metadata": {"name": n, "resourceVersion": "1"}, "spec": {}} for n in names}

    def record(self, name: str) -> dict[str, Any] | None:
        return self.bodies.get(name)

    def record_count(self) -> int:
        return len(self.bodies)


class _Kube:
    def __init__(self, versions: dict[str, str], *, fail: bool = False) -> None:
        self.versions = versions
        self.fail = fail
        self.lists = 0
        self.gets: list[str] = []

    async def list_metadata(self, api: str, plural: str) -> list[dict[str, Any]]:
        self.lists += 1
        if self.fail:
            raise ApiError(429, "TooManyRequests", "slow down")
        return [{"name": n, "resourceVersion": v} for n, v in self.versions.items()]

    async def get_cluster_object(self, api: str, plural: str, name: str) -> dict[str, Any] | None:
        self.gets.append(name)
        if name not in self.versions:
            return None
        return {"metadata": {"name": name, "resourceVersion": self.versions[name]}, "spec": {}}


def _evictions(kube: _Kube, cache: _Records) -> Evictions:
    async def post(*_: Any) -> None:
        return None
    return Evictions(kube=kube, cache=cache, post_event=post, on_evicted=lambda *_: None,  # type: ignore[arg-type]
                     breaker_settings=breaker.Settings(max_fraction=1.0),
                     budget=FairBudget(TokenBucket(qps=0, burst=1)),
                     retry_budget=FairBudget(TokenBucket(qps=0, burst=1)))


def test_in_a_burst_records_listed_at_the_cached_version_are_not_read_again() -> None:
    async def run() -> None:
        kube = _Kube({"a": "1", "b": "1", "c": "2"})
        evictions = _evictions(kube, _Records("a", "b", "c", "d"))
        a, b, c, d = await asyncio.gather(*(evictions.reads.record(n, shared=True) for n in "abcd"))
        assert kube.lists == 1
        cache = evictions.reads.cache
        assert a is cache.record("a") and b is cache.record("b")  # type: ignore[union-attr]
        # Listed at another version than the cache's: read by name. Not listed: gone.
        assert kube.gets == ["c"] and c is not None and c["metadata"]["resourceVersion"] == "2"
        assert d is None
    asyncio.run(run())


def test_a_failed_list_falls_back_to_reading_each_record() -> None:
    async def run() -> None:
        kube = _Kube({"a": "1"}, fail=True)
        evictions = _evictions(kube, _Records("a"))
        assert (await evictions.reads.record("a", shared=True)) is not None
        assert kube.gets == ["a"]
    asyncio.run(run())


def test_a_lone_eviction_reads_its_record_by_name() -> None:
    async def run() -> None:
        kube = _Kube({"a": "1"})
        evictions = _evictions(kube, _Records("a"))
        assert (await evictions.reads.record("a", shared=False)) is not None
        assert (kube.lists, kube.gets) == (0, ["a"])
    asyncio.run(run())


class _SlowWrites(_Kube):
    """Each status write takes `seconds`; counts the writes under way at once."""

    def __init__(self, seconds: float) -> None:
        super().__init__({})
        self.seconds = seconds
        self.at_once = self.most_at_once = self.done = 0

    async def merge_patch_cluster_object(self, *_: Any, **__: Any) -> dict[str, Any]:
        self.at_once += 1
        self.most_at_once = max(self.most_at_once, self.at_once)
        try:
            await asyncio.sleep(self.seconds)
        finally:
            self.at_once -= 1
        self.done += 1
        return {}


def test_the_counts_flushed_at_shutdown_are_written_several_at_once_and_give_up_in_time() -> None:
    """A pod has 30 s to stop: 5,000 records' counts written one by one took longer (make bench, 5,000 pods)."""
    from claimwarden.health import eviction_counts as module

    async def run() -> tuple[_SlowWrites, float]:
        kube = _SlowWrites(0.05)
        evictions = _evictions(kube, _Records())
        for i in range(100):
            name = f"r{i}"
            evictions.tally.evicted_by_record[name] = 1
            evictions.counts.changed(name, 0.0)
        started = asyncio.get_running_loop().time()
        await evictions.flush_counts(timeout=0.3)
        return kube, asyncio.get_running_loop().time() - started

    kube, took = asyncio.run(run())
    assert kube.most_at_once == module.FLUSH_WRITERS
    assert took < 0.6, "gave up after its timeout"
    assert 0 < kube.done < 100


def test_a_few_evictions_among_many_records_read_theirs_by_name_not_every_record() -> None:
    """At 5,000 records a LIST shared by a few evictions read 5,000 items for each few (make bench)."""
    from claimwarden.health.eviction_reads import RECORD_LIST_ITEMS_PER_GET

    async def run() -> None:
        many = [f"r{i}" for i in range(3 * RECORD_LIST_ITEMS_PER_GET + 1)]
        kube = _Kube({"r0": "1", "r1": "2"})  # r1 changed since it was cached; r2 is gone
        evictions = _evictions(kube, _Records(*many))
        r0, r1, r2 = await asyncio.gather(*(evictions.reads.record(n, shared=True) for n in ("r0", "r1", "r2")))
        assert kube.lists == 0 and sorted(kube.gets) == ["r0", "r1", "r2"], "one GET each, none twice"
        assert r0 is evictions.reads.cache.record("r0")  # type: ignore[union-attr]
        assert r1 is not None and r1["metadata"]["resourceVersion"] == "2"
        assert r2 is None
    asyncio.run(run())
