"""The breaker's window written ahead of each eviction (health/window.py, health/ahead.py) and seeded from a live
LIST (health/eviction_counts.py): what is merged, what is never lost, and how many writes it takes."""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from claimwarden.health import breaker, window
from claimwarden.health.ahead import AheadWrites, RecordGone
from claimwarden.health.breaker import Recent
from claimwarden.health.budget import FairBudget, TokenBucket
from claimwarden.health.evictions import Evictions
from claimwarden.kube.errors import ApiError
from claimwarden.timestamps import format_rfc3339

NOW = datetime(2026, 12, 2, 12, 0, 0, tzinfo=UTC)
WINDOW = timedelta(minutes=10)


def _status(*entries: tuple[str, int], evicted: int | None = None) -> dict[str, Any]:
    """A record's status with entries (pod, seconds before NOW)."""
    return {"podsEvicted": len(entries) if evicted is None else evicted,
            "recentEvictions": [{"pod": p, "at": format_rfc3339(NOW - timedelta(seconds=s))} for p, s in entries]}


def _at(seconds: int) -> datetime:
    return NOW - timedelta(seconds=seconds)


def test_an_entry_keeps_whole_seconds_so_that_it_equals_itself_read_back() -> None:
    made = window.entry("ns/a", NOW + timedelta(microseconds=123456))
    read_back = breaker.parse_recent({"recentEvictions": breaker.format_recent([made], NOW, WINDOW)})
    assert read_back == [made]


def test_a_write_adds_to_what_the_record_holds_and_drops_nothing_another_leader_wrote() -> None:
    held = _status(("ns/old-leader-1", 30), ("ns/old-leader-2", 20), evicted=7)
    status = window.ahead_status(held, [Recent("ns/mine", _at(1))], NOW, WINDOW)
    assert [e["pod"] for e in status["recentEvictions"]] == ["ns/old-leader-1", "ns/old-leader-2", "ns/mine"]
    assert status["podsEvicted"] == 8


def test_an_entry_the_record_holds_already_is_not_added_or_counted_twice() -> None:
    held = _status(("ns/a", 5))
    again = window.ahead_status(held, [Recent("ns/a", _at(5)), Recent("ns/b", _at(1))], NOW, WINDOW)
    assert [e["pod"] for e in again["recentEvictions"]] == ["ns/a", "ns/b"]
    assert again["podsEvicted"] == 2


def test_entries_older_than_the_window_leave_it_but_podsevicted_never_goes_back() -> None:
    held = _status(("ns/ancient", 3600), ("ns/recent", 60), evicted=40)
    status = window.ahead_status(held, [Recent("ns/new", _at(0))], NOW, WINDOW)
    assert [e["pod"] for e in status["recentEvictions"]] == ["ns/recent", "ns/new"]
    assert status["podsEvicted"] == 41


def test_a_pod_already_in_the_window_is_counted() -> None:
    recent = [Recent("ns/a", _at(30)), Recent("ns/b", _at(3600))]
    assert window.counted(recent, "ns/a", NOW, WINDOW)
    assert not window.counted(recent, "ns/b", NOW, WINDOW), "out of the window: counted again when it goes"
    assert not window.counted(recent, "ns/c", NOW, WINDOW)


def test_a_new_leader_starts_from_the_live_list_and_the_cache_together() -> None:
    live = window.seed([{"metadata": {"name": "r"}, "status": _status(("ns/a", 10), ("ns/b", 5), evicted=9)}])
    stale_cache = _status(("ns/a", 10), evicted=8)
    evicted, recent = window.start(live["r"], stale_cache)
    assert evicted == 9 and [r.pod for r in recent] == ["ns/a", "ns/b"]
    # A record the LIST did not have (created since): its cached status alone.
    assert window.start(None, stale_cache) == (8, [Recent("ns/a", _at(10))])


def test_malformed_counts_read_as_zero() -> None:
    assert window.pods_evicted({"podsEvicted": "lots"}) == 0
    assert window.pods_evicted({"podsEvicted": -3}) == 0


# --- the writes ---------------------------------------------------------------------------------

class _Records:
    """An apiserver holding records; a merge patch with metadata.resourceVersion is refused with 409 unless it
    names the current version (as the apiserver does). `delay`: seconds each patch takes."""

    def __init__(self, **statuses: dict[str, Any]) -> None:
        self.bodies = {n: {"metadata": {"name": n, "resourceVersion": "1"}, "status": s} for n, s in statuses.items()}
        self.patches: list[dict[str, Any]] = []
        self.gets = self.lists = 0
        self.delay = 0.0
        self.fail: ApiError | None = None

    def change(self, name: str, status: dict[str, Any]) -> None:
        """Another writer (the previous leader, say)."""
        body = self.bodies[name]
        body["status"] = status
        body["metadata"]["resourceVersion"] = str(int(body["metadata"]["resourceVersion"]) + 1)

    async def merge_patch_cluster_object(self, api: str, plural: str, name: str, patch: dict[str, Any],
                                         subresource: str = "") -> dict[str, Any]:
        self.patches.append(copy.deepcopy(patch))
        await asyncio.sleep(self.delay)
        if self.fail is not None:
            raise self.fail
        body = self.bodies.get(name)
        if body is None:
            raise ApiError(404, "NotFound", "gone")
        if patch["metadata"]["resourceVersion"] != body["metadata"]["resourceVersion"]:
            raise ApiError(409, "Conflict", "the object has been modified")
        self.change(name, {**body["status"], **patch["status"]})
        return copy.deepcopy(body)

    async def get_cluster_object(self, api: str, plural: str, name: str) -> dict[str, Any] | None:
        self.gets += 1
        return copy.deepcopy(self.bodies.get(name))

    async def list_cluster_objects(self, api: str, plural: str) -> list[dict[str, Any]]:
        self.lists += 1
        return copy.deepcopy(list(self.bodies.values()))


def _record(name: str, status: dict[str, Any], version: str = "1") -> dict[str, Any]:
    return {"metadata": {"name": name, "resourceVersion": version}, "status": status}


def _pods(recent: list[dict[str, str]]) -> list[str]:
    return [e["pod"] for e in recent]


def test_evictions_of_one_record_waiting_together_share_one_write() -> None:
    async def run() -> tuple[_Records, list[dict[str, Any]]]:
        api = _Records(r={})
        api.delay = 0.01
        ahead = AheadWrites(kube=api, window=WINDOW)  # type: ignore[arg-type]
        moment = datetime.now(UTC)
        together = await asyncio.gather(*(ahead.add(_record("r", {}), window.entry(f"ns/p{i}", moment))
                                          for i in range(8)))
        assert len(api.patches) == 1 and together[0]["podsEvicted"] == 8
        # One more while a write is under way: the ones that come meanwhile go out together in the next.
        first = asyncio.ensure_future(ahead.add(_record("r", {}), window.entry("ns/q0", moment)))
        await asyncio.sleep(0.002)
        later = await asyncio.gather(*(ahead.add(_record("r", {}), window.entry(f"ns/q{i}", moment))
                                       for i in range(1, 4)))
        await first
        return api, later

    api, results = asyncio.run(run())
    assert len(api.patches) == 3
    assert api.bodies["r"]["status"]["podsEvicted"] == 12
    assert len(api.bodies["r"]["status"]["recentEvictions"]) == 12
    assert all(r["podsEvicted"] == 12 for r in results)


def test_a_conflict_reads_the_record_and_merges_what_another_leader_stored() -> None:
    async def run() -> _Records:
        moment = datetime.now(UTC)
        api = _Records(r=_record("r", {})["status"])
        ahead = AheadWrites(kube=api, window=WINDOW)  # type: ignore[arg-type]
        seen = _record("r", {})  # as this process read it, at version 1
        # Meanwhile the previous leader stored two evictions (version 2).
        stamp = format_rfc3339(moment)
        api.change("r", {"podsEvicted": 2, "recentEvictions": [{"pod": "ns/theirs-1", "at": stamp},
                                                               {"pod": "ns/theirs-2", "at": stamp}]})
        await ahead.add(seen, window.entry("ns/mine", moment))
        return api

    api = asyncio.run(run())
    assert len(api.patches) == 2 and api.gets == 1, "refused once, read, written again"
    assert api.patches[0]["metadata"]["resourceVersion"] == "1" and api.patches[1]["metadata"]["resourceVersion"] == "2"
    status = api.bodies["r"]["status"]
    assert sorted(_pods(status["recentEvictions"])) == ["ns/mine", "ns/theirs-1", "ns/theirs-2"]
    assert status["podsEvicted"] == 3


def test_a_deleted_record_stops_its_evictions_and_a_failed_write_fails_every_waiter() -> None:
    async def run() -> tuple[BaseException | None, list[Any]]:
        api = _Records()
        ahead = AheadWrites(kube=api, window=WINDOW)  # type: ignore[arg-type]
        moment = datetime.now(UTC)
        gone: BaseException | None = None
        try:
            await ahead.add(_record("r", {}), window.entry("ns/a", moment))
        except RecordGone as exc:
            gone = exc
        api.bodies["s"] = _record("s", {})
        api.fail = ApiError(500, "InternalError", "etcd is sad")
        api.delay = 0.01
        failed = await asyncio.gather(*(ahead.add(_record("s", {}), window.entry(f"ns/p{i}", moment))
                                        for i in range(3)), return_exceptions=True)
        return gone, failed

    gone, failed = asyncio.run(run())
    assert isinstance(gone, RecordGone)
    assert len(failed) == 3 and all(isinstance(f, ApiError) and f.status == 500 for f in failed)


def _evictions(api: _Records, *, breaker_on: bool,
               on_recent: Callable[[str, Recent], None] | None = None) -> Evictions:
    async def post(*_: Any) -> None:
        return None
    settings = breaker.Settings(max_pods=3) if breaker_on else breaker.Settings(max_fraction=1.0)
    return Evictions(kube=api, cache=None, post_event=post, on_evicted=lambda *_: None,  # type: ignore[arg-type]
                     breaker_settings=settings, budget=FairBudget(TokenBucket(qps=0, burst=1)),
                     retry_budget=FairBudget(TokenBucket(qps=0, burst=1)),
                     decide=lambda driver: breaker.Decision(driver=driver), on_recent=on_recent)


def test_a_new_leader_seeds_from_one_live_list_not_from_its_stale_cache() -> None:
    """The old leader stored 2 evictions (write-ahead); the new leader's cache still shows the record without
    them. The window and podsEvicted come from the live LIST, and its write keeps them."""
    async def run() -> tuple[_Records, Evictions, dict[str, Any]]:
        moment = datetime.now(UTC)
        live = {"podsEvicted": 2, "recentEvictions": [{"pod": "ns/a", "at": format_rfc3339(moment)},
                                                      {"pod": "ns/b", "at": format_rfc3339(moment)}]}
        api = _Records(r=live)
        api.bodies["r"]["metadata"]["resourceVersion"] = "5"
        evictions = _evictions(api, breaker_on=True)
        stale = _record("r", {}, version="3")
        await evictions.seed()
        await evictions.seed()
        assert api.lists == 1, "one LIST, once"
        assert evictions.evicted(stale) == 2 and [r.pod for r in evictions.recent(stale)] == ["ns/a", "ns/b"]
        await evictions.tally.write_ahead(stale, window.entry("ns/c", moment))
        return api, evictions, stale

    api, evictions, stale = asyncio.run(run())
    assert len(api.patches) == 1 and api.gets == 0, "the LIST gave the version to guard the write with"
    status = api.bodies["r"]["status"]
    assert _pods(status["recentEvictions"]) == ["ns/a", "ns/b", "ns/c"] and status["podsEvicted"] == 3
    assert evictions.evicted(stale) == 3 and len(evictions.recent(stale)) == 3


def test_counts_started_from_the_cache_before_the_live_list_take_in_what_the_list_holds() -> None:
    """A breaker decision came first and started the record's window from a stale cache: the LIST that follows
    adds the old leader's evictions to it, and to the breaker's totals (on_recent)."""
    async def run() -> tuple[Evictions, dict[str, Any], list[str]]:
        moment = datetime.now(UTC)
        api = _Records(r={"podsEvicted": 2, "recentEvictions": [{"pod": "ns/a", "at": format_rfc3339(moment)},
                                                                {"pod": "ns/b", "at": format_rfc3339(moment)}]})
        told: list[str] = []
        evictions = _evictions(api, breaker_on=True, on_recent=lambda name, entry: told.append(entry.pod))
        stale = _record("r", {"podsEvicted": 1, "recentEvictions": [{"pod": "ns/a", "at": format_rfc3339(moment)}]})
        assert [r.pod for r in evictions.recent(stale)] == ["ns/a"]
        await evictions.seed()
        return evictions, stale, told

    evictions, stale, told = asyncio.run(run())
    assert evictions.evicted(stale) == 2 and [r.pod for r in evictions.recent(stale)] == ["ns/a", "ns/b"]
    assert told == ["ns/b"], "only the entry new to this process goes to the breaker's totals"


def test_without_the_breaker_nothing_is_written_ahead_and_the_counts_stay_paced() -> None:
    assert _evictions(_Records(), breaker_on=False).ahead is None
    assert _evictions(_Records(), breaker_on=True).ahead is not None


# --- the eviction worker ------------------------------------------------------------------------

class _Cluster(_Records):
    """One record, its pod and the pod's claim on the record's device; logs the calls in order."""

    def __init__(self, *, refuse: ApiError | None = None) -> None:
        super().__init__()
        self.bodies["r"] = {"metadata": {"name": "r", "resourceVersion": "1"},
                            "spec": {"driver": "gpu.example.com", "pool": "node-0", "device": "gpu-0",
                                     "effect": "NoExecute", "reason": "broken"}, "status": {}}
        self.calls: list[str] = []
        self.refuse = refuse

    async def merge_patch_cluster_object(self, api: str, plural: str, name: str, patch: dict[str, Any],
                                         subresource: str = "") -> dict[str, Any]:
        self.calls.append("write ahead")
        return await super().merge_patch_cluster_object(api, plural, name, patch, subresource)

    async def get_pod(self, namespace: str, name: str) -> dict[str, Any]:
        return {"metadata": {"namespace": namespace, "name": name, "uid": "u1", "resourceVersion": "7"},
                "status": {"phase": "Running"}}

    async def get_claim(self, namespace: str, name: str) -> dict[str, Any]:
        return {"metadata": {"namespace": namespace, "name": name}, "status": {
            "allocation": {"devices": {"results": [
                {"request": "gpu", "driver": "gpu.example.com", "pool": "node-0", "device": "gpu-0"}]}},
            "reservedFor": [{"resource": "pods", "name": "p", "uid": "u1"}]}}

    async def evict_pod(self, namespace: str, name: str, uid: str, resource_version: str | None = None) -> None:
        self.calls.append("evict")
        if self.refuse is not None:
            raise self.refuse


def _worker(cluster: _Cluster, decisions: list[str]) -> Evictions:
    async def post(*_: Any) -> None:
        return None

    def decide(driver: str) -> breaker.Decision:
        decisions.append(driver)
        return breaker.Decision(driver=driver, room=1)
    return Evictions(kube=cluster, cache=None, post_event=post, on_evicted=lambda *_: None,  # type: ignore[arg-type]
                     breaker_settings=breaker.Settings(max_pods=1), budget=FairBudget(TokenBucket(qps=0, burst=1)),
                     retry_budget=FairBudget(TokenBucket(qps=0, burst=1)),
                     decide=decide)


def test_the_entry_is_stored_before_the_eviction_call() -> None:
    cluster, decisions = _Cluster(), []
    asyncio.run(_worker(cluster, decisions).reconcile(("r", "ns", "p", "u1", "c")))
    assert cluster.calls == ["write ahead", "evict"]
    status = cluster.bodies["r"]["status"]
    assert status["podsEvicted"] == 1 and _pods(status["recentEvictions"]) == ["ns/p"]


def test_a_pod_refused_by_a_budget_counts_once_and_its_retry_takes_no_room_and_no_write() -> None:
    from claimwarden.runtime.workqueue import Requeue

    cluster = _Cluster(refuse=ApiError(429, "TooManyRequests", "Cannot evict pod as it would violate the pod's "
                                       "disruption budget.", causes=("DisruptionBudget",)))
    decisions: list[str] = []
    worker = _worker(cluster, decisions)

    for _ in range(2):
        with pytest.raises(Requeue):  # refused: retried with back-off
            asyncio.run(worker.reconcile(("r", "ns", "p", "u1", "c")))
    assert cluster.calls == ["write ahead", "evict", "evict"], "one write, two attempts"
    assert len(decisions) == 1, "the retry asked the breaker for no room: the pod is counted"
    assert cluster.bodies["r"]["status"]["podsEvicted"] == 1
