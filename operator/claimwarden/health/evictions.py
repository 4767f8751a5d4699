"""Evicting the pods of a marked device, one pod per key, through the Eviction API.

A key is (record, namespace, pod, pod UID, claim). Each attempt decides on a fresh read of the
record, because the indices may hold a record cleared while a watch was down, and on the cached
pod, pinned by the eviction's preconditions: its UID and resourceVersion. The server refuses the
eviction with 409 when the pod changed since the cache saw it; the pod is then read and the
decision made again. A pod is evicted only while the record still says so and its claim holds the
device reserved for it (or for the pod's PodGroup, with the pod using it: groups.py).

A burst costs little more than the evictions themselves (docs/concepts/safety.md "The eviction budget",
throughput): evictions that wait for a read together share one metadata-only LIST of the records
(a single eviction reads its record by name); the claim is taken from the cache when
it agrees (a claim reserved for the running pod keeps its allocation) and read only to confirm a
no; pods this process evicted are not read again; one Event goes on the pod, posted beside the
evictions rather than before the next one (``EventPoster``); and the record's counts are written
by its reconcile, paced (counts.py), or, while the breaker is on, ahead of the call in a write of
their own that evictions of one record share (window.py, ahead.py); a new leader then starts the
counts from one live LIST of the records (``seed``). PodDisruptionBudgets hold: a refusal is retried with
back-off until the budget allows it or the mark is cleared.

Right before the call the blast-radius breaker applies (breaker.py, docs/concepts/safety.md "What claimwarden will
not do without asking"): unless the record's approval counts (approval.py), an
eviction starts only while the driver's evictions in the window plus those in flight stay within
its limit; the room taken is tracked in ``_in_flight`` until the eviction is counted in the window
(ahead of the call, or right after it with the breaker off), so concurrent workers cannot overshoot.
An eviction the breaker holds back is dropped here; its record is looked at again when the window
frees room (approvals and cleared marks wake it through their own events).

The eviction budget (budget.py) is asked first, before any read: one token per call, handed out
round-robin over namespaces once evictions wait for tokens, so a parked eviction costs nothing until
its turn (``_pump`` re-queues it then). A key whose last call a PodDisruptionBudget refused asks the
retry budget instead of the shared one. A token not spent on a call goes back.
"""

from __future__ import annotations

import asyncio
import datetime
import itertools
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Hashable
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from typing import Any, cast

from .. import metrics
from ..cache import Body, Cache
from ..kube.api import Kube
from ..kube.errors import ApiError
from ..kube.next_read import NextRead
from ..objects.claims import is_reserved_for
from ..objects.meta import is_being_deleted
from ..objects.pods import TERMINAL_PHASES
from ..runtime.workqueue import Requeue, WorkQueue
from ..timestamps import now, parse_rfc3339
from . import breaker, groups, plan, records, window
from .ahead import AheadWrites, RecordGone
from .budget import FairBudget
from .counts import CountWrites
from .wave import HOLD_MAX, HOLD_RECHECK

log = logging.getLogger("claimwarden.health")

RECORDS_API = f"{records.GROUP}/{records.VERSION}"
EVICTED = "EvictedUnhealthyDevice"
EVICTION_BLOCKED = "EvictionBlocked"
# Back-off for evictions refused by a PodDisruptionBudget (HTTP 429): 1 s doubling to 30 s.
PDB_RETRY_FIRST, PDB_RETRY_MAX = 1.0, 30.0
EVICTED_MEMORY_SECONDS = 600.0
CONFLICT_RETRY = 0.5  # seconds before an eviction whose pod changed twice meanwhile is tried again
PDB_API = "/apis/policy/v1"
EVENT_POSTERS = 4
FLUSH_SECONDS, FLUSH_WRITERS = 10.0, 8  # at shutdown: the counts still in memory, written 8 at once within 10 s
SEED_RETRY = 5.0  # seconds: keys that waited for a live LIST of the records that failed come back without one
PUMP_MIN = 0.01  # seconds: the shortest wait before parked evictions are looked at for a token again
EVENTS_PENDING_MAX = 10_000  # Events posted at once: enough to keep up, few enough that evictions go first
RECORD_LIST_ITEMS_PER_GET = 20  # assumed: a metadata-only LIST item costs about 1/20 of a GET, either side

EvictionKey = tuple[str, str, str, str, str]
PostEvent = Callable[[Body, str, str, str], Awaitable[None]]
Decide = Callable[[str], breaker.Decision]


class Evictions:
    """The eviction queue, the PDB refusals per key, and each record's count of evicted pods."""

    def __init__(self, *, kube: Kube, cache: Cache | None, post_event: PostEvent,
                 on_evicted: Callable[[str, float], None],
                 breaker_settings: breaker.Settings, budget: FairBudget, retry_budget: FairBudget,
                 decide: Decide | None = None,
                 approved: Callable[[Body], str | None] | None = None,
                 on_paused: Callable[[str, breaker.Decision], None] | None = None,
                 on_recent: Callable[[str, breaker.Recent], None] | None = None) -> None:
        """`on_evicted(record, delay)`: look at the record again after `delay` seconds (its counts changed);
        `budget`: tokens for the Eviction API calls; `retry_budget`: the same for retries of calls a
        PodDisruptionBudget refused (budget.py); `decide(driver)`: the breaker's decision now;
        `approved(record)`: who approved the record's evictions past the breaker, when that counts (None: no
        approval counts); `on_paused(record, decision)`: an eviction of the record was held back, look at it
        again when there may be room (both None: no breaker); `on_recent(record, eviction)`: an eviction was
        added to the record's recent ones (the breaker's totals, breaker_view.py)."""
        self.kube = kube
        self.cache = cache  # None in unit tests: every claim is then read from the API
        self.queue = WorkQueue("health-evictions")
        self.breaker_settings = breaker_settings
        self.budget = budget
        self.retry_budget = retry_budget
        self._pump_handle: asyncio.TimerHandle | None = None
        self.decide = decide
        self._approved = approved or (lambda _record: None)
        self._post_event = post_event
        self._on_evicted = on_evicted
        self._on_paused = on_paused
        self._on_recent = on_recent
        self._pdb_attempts: dict[Hashable, int] = {}  # key -> refusals in a row
        self._blocked_records: Counter[str] = Counter()  # record -> its keys in _pdb_attempts
        # namespace -> its keys in _pdb_attempts, oldest refusal first; and those promoted back to the shared
        # budget after another of the namespace's refused evictions went through (``_promote_next``).
        self._refused_in: dict[str, dict[Hashable, None]] = {}
        self._promoted: set[Hashable] = set()
        self._evicted: dict[str, int] = {}
        # pod UID -> when claimwarden evicted it: a key still queued for it then finds the pod gone,
        # which is no eviction attempt of its own to count as "gone".
        self._evicted_pods: dict[str, float] = {}
        self._recent: dict[str, list[breaker.Recent]] = {}
        self._in_flight: dict[str, int] = {}
        # While the breaker is on, each eviction's entry is written to its record before the call (window.py).
        self.ahead = AheadWrites(kube=kube, window=breaker_settings.window) \
            if decide is not None and breaker_settings.enabled else None
        # name -> podsEvicted and recentEvictions from one live LIST of the records, taken when this process
        # first needs them (``seed``): its cache may not hold the previous leader's last writes yet.
        self._live: dict[str, dict[str, Any]] | None = None
        self._seeding = asyncio.Lock()
        self._seed_failed = -SEED_RETRY  # monotonic time of the last LIST that failed
        self.counts = CountWrites()
        self._record_versions = NextRead(self._read_asked_records)
        self._records_asked: set[str] = set()  # the names the read being gathered will answer
        self._guarded_namespaces = NextRead(self._list_guarded_namespaces)
        self.events = EventPoster(post_event, hold=lambda: self.queue.busy)

    def schedule(self, record_name: str, eviction: plan.Eviction, moment: datetime.datetime) -> None:
        key: EvictionKey = (record_name, eviction.namespace, eviction.pod, eviction.uid, eviction.claim)
        if key in self._pdb_attempts:
            # A PodDisruptionBudget refused its last call: its back-off (``_blocked``) or a promotion brings it
            # back. Queued now, a record looked at every second (drain Node) would retry it every second.
            return
        self.queue.add_after(key, max((eviction.due - moment).total_seconds(), 0))

    def evicted(self, record: Body) -> int:
        """Pods evicted for the record; after a restart the count starts from its status (``seed``)."""
        name = record["metadata"]["name"]
        if name not in self._evicted:
            self._start(record)
        return self._evicted[name]

    def recent(self, record: Body) -> list[breaker.Recent]:
        """The record's evictions (any age); after a restart they start from its status.recentEvictions
        (``seed``)."""
        name = record["metadata"]["name"]
        if name not in self._recent:
            self._start(record)
        return self._recent[name]

    def _start(self, record: Body) -> None:
        """The record's counts in this process start from the live LIST and the cached record together."""
        name = record["metadata"]["name"]
        live = self._live.pop(name, None) if self._live is not None else None  # used once: kept in memory now
        evicted, recent = window.start(live, record.get("status") or {})
        self._evicted[name] = max(self._evicted.get(name, 0), evicted)
        self._recent.setdefault(name, recent)

    async def seed(self) -> None:
        """Before this process first decides on a record's counts (a new leader, the breaker on): one live LIST of
        the records. A failed LIST raises, so that the caller's key is retried; nothing is decided on the cache
        alone. The keys that waited for a LIST that failed do not each send another: for SEED_RETRY seconds they
        are put back without one (a slow apiserver at a failover would otherwise get a LIST of every record per
        waiting worker). With the breaker off nothing reads the window, and the counts start from the cache."""
        if self._live is not None or self.ahead is None:
            return
        async with self._seeding:
            if self._live is None:
                since = time.monotonic() - self._seed_failed
                if since < SEED_RETRY:
                    raise Requeue(SEED_RETRY - since, "seed")
                try:
                    listed = await self.kube.list_cluster_objects(RECORDS_API, records.PLURAL)
                except Exception:
                    self._seed_failed = time.monotonic()
                    raise
                self._live = window.seed(listed)
                # A record whose counts this process started from the cache before the LIST (a breaker decision
                # came first) takes in what the LIST holds too.
                for name in [name for name in self._live if name in self._recent or name in self._evicted]:
                    self._take_in(name, *window.start(self._live.pop(name), {}))
                if self.ahead is not None:
                    for record in listed:
                        self.ahead.note(record)
                log.info("eviction counts of %d records read live", len(self._live))

    def evicted_pods(self) -> AbstractSet[str]:
        """UIDs of the pods this process evicted in the last EVICTED_MEMORY_SECONDS (a live view, not a copy:
        a copy per record reconcile was quadratic in a burst)."""
        return self._evicted_pods.keys()

    def blocked(self, record_name: str) -> bool:
        """True while a PodDisruptionBudget refuses one of the record's evictions."""
        return self._blocked_records[record_name] > 0

    def in_flight(self, driver: str) -> int:
        return self._in_flight.get(driver, 0)

    def forget(self, record_name: str) -> None:
        # A record of the same device gets the same name: it must not inherit this one's refusals (blocked()).
        for key in [key for key in self._pdb_attempts if cast(EvictionKey, key)[0] == record_name]:
            self._unblock(key)
        self._evicted.pop(record_name, None)
        self._recent.pop(record_name, None)
        self.counts.forget(record_name)
        if self._live is not None:
            self._live.pop(record_name, None)
        if self.ahead is not None:
            self.ahead.forget(record_name)

    async def reconcile(self, key: Hashable) -> None:
        record_name, namespace, pod_name, uid, claim_name = cast(EvictionKey, key)
        # The token first (budget.py): an eviction parked behind other namespaces' costs no read until its turn.
        budget = self._budget_for(key)
        if not budget.unlimited:
            parked = budget.is_parked(key)
            if not budget.ask(key, namespace):
                if not parked:
                    metrics.EVICTIONS_DEFERRED.labels("budget").inc()
                self._pump()
                return
        token = _Token()
        try:
            await self._attempt(key, token, record_name, namespace, pod_name, uid, claim_name)
        finally:
            if not token.spent and not budget.unlimited:
                budget.give_back()
                self._pump()

    async def _attempt(self, key: Hashable, token: _Token, record_name: str, namespace: str, pod_name: str,
                       uid: str, claim_name: str) -> None:
        """One eviction attempt with its token taken; `token.spent` once the Eviction API is called."""
        target = await self._still_due(record_name, namespace, pod_name, uid, claim_name)
        if target is None:
            self._unblock(key)
            return
        record, pod, ref, pinned = target
        wait = _drain_wait(record)
        if wait is None:
            self._unblock(key)
            return
        if wait > 0:
            raise Requeue(wait, "drain")
        await self.seed()
        pod_ref = f"{namespace}/{pod_name}"
        # A pod counted by an earlier attempt in the window (a PodDisruptionBudget refused it) takes no new room.
        counted = self.ahead is not None and window.counted(self.recent(record), pod_ref, now(),
                                                            self.breaker_settings.window)
        # From here to the call no `await` may come between taking room and using it (see the docstring),
        # but the write of its entry ahead of the call, which keeps the room taken until the entry is counted.
        if not counted and not self._breaker_room(record, ref.driver):
            return
        holds_room = not counted

        def let_go() -> None:
            nonlocal holds_room
            if holds_room:
                holds_room = False
                self._release(ref.driver)

        if self.ahead is not None and not counted:
            try:
                await self._write_ahead(record, window.entry(pod_ref, now()))
            except RecordGone:
                let_go()
                self._unblock(key)
                return
            except BaseException:
                let_go()
                raise
            let_go()  # counted in the window now
        token.spent = True
        try:
            evicted = await self._evict(namespace, pod_name, uid, pod, pinned=pinned)
        except ApiError as exc:
            let_go()
            if exc.disruption_budget:
                raise await self._blocked(key, pod, ref, exc) from None
            if exc.throttled:  # API Priority and Fairness shedding load: not the budget, no Event
                metrics.EVICTIONS.labels("throttled").inc()
                if exc.retry_after is not None:
                    raise Requeue(exc.retry_after, "throttled") from None
                raise  # the queue's own back-off
            self._unblock(key)
            if exc.status in (404, 409):
                metrics.EVICTIONS.labels("gone").inc()
                return
            metrics.EVICTIONS.labels("error").inc()
            raise
        except BaseException:  # a timeout or cancellation: the room is not used
            let_go()
            raise
        if evicted is None:  # the pod read after a conflict is gone, replaced or terminating
            let_go()
            self._unblock(key)
            return
        pod = evicted
        was_refused = key in self._pdb_attempts
        if self.ahead is None:
            entry = window.entry(pod_ref, now())
            self.recent(record).append(entry)
            self._evicted[record_name] = self.evicted(record) + 1
            if self._on_recent is not None:
                self._on_recent(record_name, entry)
        let_go()
        self._unblock(key)
        if was_refused:
            self._promote_next(namespace)
        self._remember_evicted(uid)
        metrics.EVICTIONS.labels("evicted").inc()
        marked_at = parse_rfc3339((record.get("status") or {}).get("markedAt")) or parse_rfc3339(
            record["metadata"].get("creationTimestamp"))
        if marked_at is not None:
            metrics.EVICTION_LATENCY.observe(max((now() - marked_at).total_seconds(), 0.0))
        # The record's reconcile writes the count (counts.py: at most once per interval, and at shutdown), or with
        # the breaker on, podsPending only (the count is written ahead).
        self._on_evicted(record_name, self.counts.changed(record_name, time.monotonic()))
        reason = record["spec"].get("reason", "")
        # One Event, on the pod: the record's status counts its evictions and names the recent ones.
        node_mode = records.record_drain(record).mode == records.DRAIN_NODE
        whole_node = " (drain Node: its node is emptied)" if node_mode else ""
        self.events.post(pod, "Warning", EVICTED, f"evicted: device {ref} is unhealthy{whole_node}: {reason}")
        log.info("pod %s/%s evicted from unhealthy device %s (%s)", namespace, pod_name, ref, reason)

    def _budget_for(self, key: Hashable) -> FairBudget:
        """The retry budget for a key whose last call a PodDisruptionBudget refused; the shared one otherwise."""
        return self.retry_budget if key in self._pdb_attempts and key not in self._promoted else self.budget

    def _promote_next(self, namespace: str) -> None:
        """A refused eviction of the namespace went through: its PodDisruptionBudget may allow more now. The
        namespace's next refused eviction goes at once, from the shared budget; each one that goes through
        promotes the next, one at a time, so a budget that allows one disruption costs one refusal per
        eviction, and one relaxed for all drains at the shared budget's pace, not the retry budget's."""
        for key in self._refused_in.get(namespace, {}):
            if key not in self._promoted:
                self._promoted.add(key)
                self.retry_budget.withdraw(key)
                self.queue.add(key)
                return

    def _pump(self) -> None:
        """Re-queue the parked evictions whose token is there, and come back when the next one will be."""
        if self.queue.closed:
            return
        waits = []
        for budget in (self.budget, self.retry_budget):
            for key in budget.grant():
                self.queue.add(key)
            wait = budget.next_grant_in()
            if wait is not None:
                waits.append(wait)
        if not waits:
            return
        loop = asyncio.get_running_loop()
        due = loop.time() + max(min(waits), PUMP_MIN)
        if self._pump_handle is not None and not self._pump_handle.cancelled() and \
                loop.time() < self._pump_handle.when() <= due:
            return
        if self._pump_handle is not None:
            self._pump_handle.cancel()
        self._pump_handle = loop.call_at(due, self._pump)

    async def _write_ahead(self, record: Body, entry: breaker.Recent) -> None:
        """Store the eviction's entry in the record before the call (window.py); the window and count in memory
        become what the record holds then."""
        assert self.ahead is not None
        name = record["metadata"]["name"]
        self.recent(record)  # started from the LIST and the cache before it is replaced
        written = await self.ahead.add(record, entry)
        self._take_in(name, window.pods_evicted(written), breaker.parse_recent(written))

    def _take_in(self, name: str, evicted: int, recent: list[breaker.Recent]) -> None:
        """What the record holds (a write's answer, a live LIST) joins the counts in memory: podsEvicted the
        higher; the window its own entries still in it and `recent` together, the entries new to it going to
        the breaker's totals (``on_recent``)."""
        self._evicted[name] = max(self._evicted.get(name, 0), evicted)
        before = self._recent.get(name, [])
        kept = breaker.in_window(before, now(), self.breaker_settings.window)  # older: dropped
        self._recent[name] = window.union(kept, recent)
        if self._on_recent is not None:
            for entry in set(recent) - set(before):
                self._on_recent(name, entry)

    async def _evict(self, namespace: str, pod_name: str, uid: str, pod: Body, *, pinned: bool) -> Body | None:
        """Evict the pod. `pinned`: `pod` is the cached pod, and the eviction is pinned to its resourceVersion
        (only where no PodDisruptionBudget may count it: the server spends a budget's disruption before it
        compares the version); on a conflict the pod is read and, while it is the same pod still to evict,
        evicted as read. The pod evicted, or None."""
        try:
            await self.kube.evict_pod(namespace, pod_name, uid, pod["metadata"].get("resourceVersion") if pinned
                                      else None)
            return pod
        except ApiError as exc:
            if exc.status != 409 or not pinned:
                raise
        # The cached pod was not the latest (its status moved on, or it is gone): decide on a fresh read.
        fresh = await self.kube.get_pod(namespace, pod_name)
        if fresh is None or fresh["metadata"].get("uid") != uid:
            metrics.EVICTIONS.labels("gone").inc()
            return None
        if is_being_deleted(fresh) or (fresh.get("status") or {}).get("phase") in TERMINAL_PHASES:
            return None
        try:
            await self.kube.evict_pod(namespace, pod_name, uid, fresh["metadata"].get("resourceVersion"))
        except ApiError as exc:
            if exc.status == 409:  # changed again meanwhile: try again shortly, not counted as gone
                raise Requeue(CONFLICT_RETRY, "conflict") from None
            raise
        return fresh

    def _breaker_room(self, record: Body, driver: str) -> bool:
        """Take room for one eviction, or say no (and have the record looked at again when room frees)."""
        if self.decide is None or not self.breaker_settings.enabled:
            return True
        if self._approved(record) is None:
            decision = self.decide(driver)
            if not decision.allows():
                metrics.EVICTIONS_DEFERRED.labels("breaker").inc()
                if self._on_paused is not None:
                    self._on_paused(record["metadata"]["name"], decision)
                return False
        self._in_flight[driver] = self._in_flight.get(driver, 0) + 1
        return True

    def _release(self, driver: str) -> None:
        if self.decide is None or not self.breaker_settings.enabled:
            return
        left = self._in_flight.get(driver, 0) - 1
        if left > 0:
            self._in_flight[driver] = left
        else:
            self._in_flight.pop(driver, None)

    async def _still_due(self, record_name: str, namespace: str, pod_name: str, uid: str,
                         claim_name: str) -> tuple[Body, Body, records.DeviceRef, bool] | None:
        """(record read fresh, pod, device, pinned) when the pod is still to be evicted; else None.

        In a burst, the record comes from a shared LIST and, where no PodDisruptionBudget is in the pod's
        namespace, the pod from the cache, pinned (``_evict``); otherwise both are read by name."""
        if uid in self._evicted_pods:  # evicted by this process: its cached pod may not say so yet
            return None
        cached_pod = self.cache.pod(namespace, pod_name) if self.cache is not None else None
        burst = len(self.queue) > 0 or self._record_versions.busy
        pinned = False
        pod: Body | None
        if burst and cached_pod is not None and cached_pod["metadata"].get("uid") == uid:
            record, guarded = await asyncio.gather(self._read_record(record_name, shared=True),
                                                   self._guarded(namespace))
            pinned = not guarded
            pod = cached_pod if pinned else await self.kube.get_pod(namespace, pod_name)
        else:
            record, pod = await asyncio.gather(self._read_record(record_name, shared=burst),
                                               self.kube.get_pod(namespace, pod_name))
        ref = records.record_ref(record) if record is not None else None
        if record is None or ref is None or records.record_effect(record) != "NoExecute" or \
                is_being_deleted(record):
            return None
        if pod is None or pod["metadata"].get("uid") != uid:
            metrics.EVICTIONS.labels("gone").inc()
            return None
        if is_being_deleted(pod):
            return None
        if records.record_drain(record).mode == records.DRAIN_NODE and self._on_device_node(pod, ref):
            return record, pod, ref, pinned  # drain Node: any pod of the device's node goes
        # The claim from the cache is enough when it says yes: the pod is evicted only as it was seen
        # (running with this UID), and a claim reserved for a running pod keeps its allocation. Only a no is
        # confirmed with a read.
        cached = self.cache.claim(namespace, claim_name) if self.cache is not None else None
        if cached is not None and plan.holds_device(cached, ref) and (
                is_reserved_for(cached, uid) or groups.holds_through_group(cached, pod)):
            return record, pod, ref, pinned
        claim = await self.kube.get_claim(namespace, claim_name)
        if claim is None or not plan.holds_device(claim, ref):
            return None
        if not is_reserved_for(claim, uid) and not groups.holds_through_group(claim, pod):
            return None
        return record, pod, ref, pinned

    def _on_device_node(self, pod: Body, ref: records.DeviceRef) -> bool:
        """True when the pod runs on the node the device is tied to. A device tied to no one node (network-attached)
        drains as Immediate (controller._drain_node), so its pods keep the check that their claim holds it."""
        if self.cache is None:
            return False
        node = plan.slice_node(self.cache.resource_slices_of_pool(ref.driver, ref.pool), ref)
        return node is not None and (pod.get("spec") or {}).get("nodeName") == node

    async def _read_record(self, name: str, *, shared: bool) -> Body | None:
        """The record as it is now in the API. `shared` (a burst): through a read that waiting evictions
        share (``NextRead``, `_read_asked_records`): a record answered at the resourceVersion the cache holds
        is the cached record, one missing is gone, one read whole is that, any other is read by name; if the
        shared read fails, by name too. Otherwise the record is read by name."""
        cached = self.cache.record(name) if self.cache is not None else None
        if cached is None or not shared:
            return await self.kube.get_cluster_object(RECORDS_API, records.PLURAL, name)
        self._records_asked.add(name)
        try:
            answered = await self._record_versions.get()
        except ApiError as exc:
            log.warning("reading the records failed (%s); reading them one by one", exc)
            return await self.kube.get_cluster_object(RECORDS_API, records.PLURAL, name)
        if name not in answered:
            return None
        found, whole = answered[name]
        if found["metadata"].get("resourceVersion") == cached["metadata"].get("resourceVersion"):
            return cached
        if whole:
            return found
        return await self.kube.get_cluster_object(RECORDS_API, records.PLURAL, name)

    async def _read_asked_records(self) -> dict[str, tuple[Body, bool]]:
        """name -> (the record now, whether whole or its metadata alone) for the names asked since the last read; a
        record missing or being deleted is left out. One metadata-only LIST of every record when that costs
        less than reading the asked ones by name (RECORD_LIST_ITEMS_PER_GET listed items cost about one GET):
        at 5,000 records, LISTs shared by a few evictions each had cost a third of claimwarden's CPU and
        more of the apiserver's (make bench at 2,500 and 5,000 pods)."""
        asked, self._records_asked = self._records_asked, set()
        total = self.cache.record_count() if self.cache is not None else 0
        if len(asked) * RECORD_LIST_ITEMS_PER_GET >= total:
            return {str(meta.get("name")): ({"metadata": meta}, False)
                    for meta in await self.kube.list_metadata(f"/apis/{RECORDS_API}", records.PLURAL)
                    if not meta.get("deletionTimestamp")}
        names = sorted(asked)
        bodies = await asyncio.gather(*(self.kube.get_cluster_object(RECORDS_API, records.PLURAL, name)
                                        for name in names))
        return {name: (body, True) for name, body in zip(names, bodies, strict=True)
                if body is not None and not is_being_deleted(body)}

    async def _guarded(self, namespace: str) -> bool:
        """True when a PodDisruptionBudget may count the namespace's pods (or that cannot be told)."""
        try:
            return namespace in await self._guarded_namespaces.get()
        except ApiError as exc:
            log.warning("listing PodDisruptionBudgets failed (%s); pods are read before their eviction", exc)
            return True

    async def _list_guarded_namespaces(self) -> frozenset[str]:
        return frozenset(str(meta.get("namespace"))
                         for meta in await self.kube.list_metadata(PDB_API, "poddisruptionbudgets"))

    def _remember_evicted(self, uid: str) -> None:
        moment = time.monotonic()
        # Oldest first (insertion order): drop the expired from the front, not a copy per eviction.
        for old, _at in list(itertools.takewhile(lambda item: moment - item[1] >= EVICTED_MEMORY_SECONDS,
                                                self._evicted_pods.items())):
            del self._evicted_pods[old]
        self._evicted_pods.pop(uid, None)
        self._evicted_pods[uid] = moment

    async def _blocked(self, key: Hashable, pod: Body, ref: records.DeviceRef, exc: ApiError) -> Requeue:
        """Count a refusal, say so once on the pod, and back off."""
        metrics.EVICTIONS.labels("pdb_blocked").inc()
        attempts = self._pdb_attempts.get(key, 0) + 1
        self._pdb_attempts[key] = attempts
        self._promoted.discard(key)
        if attempts == 1:
            self._blocked_records[cast(EvictionKey, key)[0]] += 1
            self._refused_in.setdefault(cast(EvictionKey, key)[1], {})[key] = None
        if attempts == 1:
            self._on_evicted(cast(EvictionKey, key)[0], 0.0)  # its status says so now (controller._settling)
            await self._post_event(pod, "Warning", EVICTION_BLOCKED,
                                   f"eviction for unhealthy device {ref} is blocked: {exc.message}")
        delay = min(PDB_RETRY_FIRST * 2 ** (attempts - 1), PDB_RETRY_MAX)
        return Requeue(max(delay, exc.retry_after or 0.0), "blocked")

    def _unblock(self, key: Hashable) -> None:
        """The key is done with PodDisruptionBudgets: evicted, gone, or no longer due."""
        if self._pdb_attempts.pop(key, None) is None:
            return
        self._promoted.discard(key)
        record_name, namespace = cast(EvictionKey, key)[:2]
        refused = self._refused_in.get(namespace, {})
        refused.pop(key, None)
        if not refused:
            self._refused_in.pop(namespace, None)
        self._blocked_records[record_name] -= 1
        if self._blocked_records[record_name] <= 0:
            del self._blocked_records[record_name]

    def counts_status(self, record: Body) -> dict[str, Any]:
        """The record's counts as its status should carry them: podsEvicted and recentEvictions (with the breaker
        on, both are written ahead by ``_write_ahead`` alone, never by the record's status write)."""
        return {"podsEvicted": self.evicted(record),
                "recentEvictions": breaker.format_recent(self.recent(record), now(), self.breaker_settings.window)}

    def counts_written(self, record_name: str, version: int) -> None:
        """A status write with the record's counts as of `version` (counts.version) succeeded."""
        self.counts.written(record_name, time.monotonic(), version)

    async def flush_counts(self, timeout: float = FLUSH_SECONDS) -> None:
        """Write every count still only in memory (at shutdown, after the workers have stopped), FLUSH_WRITERS at
        once and for at most `timeout` seconds in all, and let the Events still going out finish meanwhile: a
        pod has 30 s to stop, and 5,000 records written one by one took longer than that."""
        # With the breaker on the counts are in the records already (written ahead).
        pending = [name for name in self.counts.unsaved() if name in self._evicted] if self.ahead is None else []
        writers = asyncio.Semaphore(FLUSH_WRITERS)
        written = 0
        refused: list[ApiError] = []  # reported in one line: a lost fence refuses them all

        async def write(name: str) -> None:
            nonlocal written
            version = self.counts.version(name)
            status = {"podsEvicted": self._evicted[name], "recentEvictions": breaker.format_recent(
                self._recent.get(name, []), now(), self.breaker_settings.window)}
            async with writers:
                try:
                    await self.kube.merge_patch_cluster_object(RECORDS_API, records.PLURAL, name, {"status": status},
                                                               subresource="status")
                except ApiError as exc:
                    if not exc.not_found:
                        refused.append(exc)
                    return
            self.counts_written(name, version)
            written += 1

        deadline = time.monotonic() + timeout
        if pending:
            tasks = [asyncio.ensure_future(write(name)) for name in pending]
            _, late = await asyncio.wait(tasks, timeout=timeout)
            for task in late:
                task.cancel()
            if late:
                log.warning("shutting down: %d of %d records' eviction counts not written within %.0f s (the next "
                            "leader counts from the records' status)", len(pending) - written, len(pending), timeout)
        if refused:
            log.warning("shutting down: %d records' eviction counts could not be stored (first: %s)",
                        len(refused), refused[0])
        await self.events.drain(max(deadline - time.monotonic(), 0.0))


@dataclass
class _Token:
    """Whether the token an eviction attempt took was spent on a call (else it goes back to its budget)."""

    spent: bool = False


def _drain_wait(record: Body) -> float | None:
    """Seconds the record's drain mode still lets its pods run (0: evict now; None: never evict)."""
    drain = records.record_drain(record)
    if drain.mode == records.DRAIN_ALLOW_COMPLETION:
        return None
    if drain.mode != records.DRAIN_EVICT_AFTER or drain.after is None:
        return 0.0
    marked_at = parse_rfc3339((record.get("status") or {}).get("markedAt")) or parse_rfc3339(
        record["metadata"].get("creationTimestamp"))
    if marked_at is None:
        return 0.0
    return max((marked_at + drain.after - now()).total_seconds(), 0.0)


class EventPoster:
    """Posts Events beside the work that causes them: at most EVENT_POSTERS at once, and never waited for
    by the caller, so a burst of evictions is not slowed by its own Events. `drain` (at shutdown) waits a
    little for those still going out."""

    def __init__(self, post: PostEvent, limit: int = EVENT_POSTERS, *,
                 hold: Callable[[], bool] = lambda: False) -> None:
        """`hold()`: Events wait while it says so (a wave of evictions, wave.py), each at most HOLD_MAX s."""
        self._post = post
        self._hold = hold
        self._slots = asyncio.Semaphore(limit)
        self._tasks: set[asyncio.Task[None]] = set()

    def post(self, involved: Body, event_type: str, reason: str, message: str) -> None:
        if len(self._tasks) >= EVENTS_PENDING_MAX:  # the apiserver is far behind: Events are the first to go
            log.warning("dropped event %s on %s: %d events still going out", reason,
                        involved["metadata"].get("name"), len(self._tasks))
            return
        task = asyncio.get_running_loop().create_task(self._send(involved, event_type, reason, message))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _send(self, involved: Body, event_type: str, reason: str, message: str) -> None:
        deadline = time.monotonic() + HOLD_MAX
        while self._hold() and time.monotonic() < deadline:
            await asyncio.sleep(HOLD_RECHECK)
        async with self._slots:
            try:
                await self._post(involved, event_type, reason, message)
            except Exception as exc:  # an Event is worth a log line, never a lost eviction
                log.warning("could not post event %s on %s: %s", reason, involved["metadata"].get("name"), exc)

    async def drain(self, timeout: float = 5.0) -> None:
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=timeout)
