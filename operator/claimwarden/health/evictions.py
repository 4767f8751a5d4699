"""Evicting the pods of a marked device, one pod per key, through the Eviction API.

A key is (record, namespace, pod, pod UID, claim). An attempt goes in this order, each step in the
module that owns it:

1. a token from the eviction budget (budget.py), before any read: one token per call, handed out
   round-robin over namespaces once evictions wait for tokens, so a parked eviction costs nothing until
   its turn (``_pump`` re-queues it then); a key whose last call a PodDisruptionBudget refused asks the
   retry budget instead (refusals.py). A token not spent on a call goes back;
2. whether the pod is still due, on reads a burst shares (eviction_reads.py), and whether the drain
   mode lets it go now; pods this process evicted are not read again;
3. room from the blast-radius breaker (breaker_room.py, docs/concepts/safety.md "What claimwarden will not
   do without asking"), unless the record's approval counts (approval.py). An eviction the breaker holds
   back is dropped here; its record is looked at again when the window frees room;
4. while the breaker is on, the eviction's entry written ahead to its record (window.py, ahead.py);
5. the call, pinned to the cached pod's resourceVersion where no PodDisruptionBudget may count it (on a
   409 the pod is read and the decision made again); a PodDisruptionBudget's refusal is retried with
   back-off until the budget allows it or the mark is cleared (refusals.py);
6. the bookkeeping: the record's counts, written by its reconcile, paced (counts.py), or with the breaker
   on already written ahead; a new leader starts the counts from one live LIST of the records (``seed``);
   one Event on the pod, posted beside the evictions rather than before the next one (event_poster.py).
"""

from __future__ import annotations

import asyncio
import datetime
import itertools
import logging
import time
from collections.abc import Callable, Hashable
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from typing import Any, cast

from .. import metrics
from ..cache import Body, Cache
from ..kube.api import Kube
from ..kube.errors import ApiError
from ..objects.meta import is_being_deleted
from ..objects.pods import TERMINAL_PHASES
from ..runtime.workqueue import Requeue, WorkQueue
from ..timestamps import now
from . import breaker, plan, records, refusals, window
from .ahead import RecordGone
from .breaker_room import BreakerRoom, Decide
from .budget import FairBudget
from .event_poster import EventPoster, PostEvent
from .eviction_counts import FLUSH_SECONDS, EvictionCounts
from .eviction_reads import EvictionReads
from .refusals import EvictionKey, Refusals

log = logging.getLogger("claimwarden.health")

EVICTED = "EvictedUnhealthyDevice"
EVICTION_BLOCKED = "EvictionBlocked"
EVICTED_MEMORY_SECONDS = 600.0
CONFLICT_RETRY = 0.5  # seconds before an eviction whose pod changed twice meanwhile is tried again
PUMP_MIN = 0.01  # seconds: the shortest wait before parked evictions are looked at for a token again


class Evictions:
    """The eviction queue and its worker, composing what each attempt needs: the budgets, the reads
    (``reads``), the breaker's room (``room``), the PodDisruptionBudget refusals (``refusals``), the counts
    (``tally``) and the Events (``events``)."""

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
        self.queue = WorkQueue("health-evictions")
        self.breaker_settings = breaker_settings
        self.budget = budget
        self.retry_budget = retry_budget
        self._pump_handle: asyncio.TimerHandle | None = None
        self._post_event = post_event
        self._on_evicted = on_evicted
        self.room = BreakerRoom(settings=breaker_settings, decide=decide,
                                approved=approved or (lambda _record: None), on_paused=on_paused)
        self.refusals = Refusals()
        self.reads = EvictionReads(kube=kube, cache=cache)
        # pod UID -> when claimwarden evicted it: a key still queued for it then finds the pod gone,
        # which is no eviction attempt of its own to count as "gone".
        self._evicted_pods: dict[str, float] = {}
        self.tally = EvictionCounts(kube=kube, window=breaker_settings.window,
                                    write_ahead=decide is not None and breaker_settings.enabled,
                                    on_recent=on_recent or (lambda _record, _entry: None))
        self.ahead = self.tally.ahead  # None with the breaker off
        self.counts = self.tally.writes
        self.events = EventPoster(post_event, hold=lambda: self.queue.busy)

    def schedule(self, record_name: str, eviction: plan.Eviction, moment: datetime.datetime) -> None:
        key: EvictionKey = (record_name, eviction.namespace, eviction.pod, eviction.uid, eviction.claim)
        if key in self.refusals:
            # A PodDisruptionBudget refused its last call: its back-off (``_blocked``) or a promotion brings it
            # back. Queued now, a record looked at every second (drain Node) would retry it every second.
            return
        self.queue.add_after(key, max((eviction.due - moment).total_seconds(), 0))

    def evicted(self, record: Body) -> int:
        """Pods evicted for the record; after a restart the count starts from its status (``seed``)."""
        return self.tally.evicted(record)

    def recent(self, record: Body) -> list[breaker.Recent]:
        """The record's evictions (any age), started from its status.recentEvictions (``seed``)."""
        return self.tally.recent(record)

    async def seed(self) -> None:
        """Before this process first decides on a record's counts: one live LIST of the records (eviction_counts.py)."""
        await self.tally.seed()

    def counts_status(self, record: Body) -> dict[str, Any]:
        """The record's podsEvicted and recentEvictions as its status should carry them (eviction_counts.py)."""
        return self.tally.status(record)

    def counts_written(self, record_name: str, version: int) -> None:
        """A status write with the record's counts as of `version` (counts.version) succeeded."""
        self.tally.written(record_name, version)

    async def flush_counts(self, timeout: float = FLUSH_SECONDS) -> None:
        """At shutdown, after the workers have stopped: the counts still only in memory written within `timeout`
        seconds (eviction_counts.py), and the Events still going out let finish meanwhile."""
        deadline = time.monotonic() + timeout
        await self.tally.flush(timeout)
        await self.events.drain(max(deadline - time.monotonic(), 0.0))

    def evicted_pods(self) -> AbstractSet[str]:
        """UIDs of the pods this process evicted in the last EVICTED_MEMORY_SECONDS (a live view, not a copy:
        a copy per record reconcile was quadratic in a burst)."""
        return self._evicted_pods.keys()

    def blocked(self, record_name: str) -> bool:
        """True while a PodDisruptionBudget refuses one of the record's evictions."""
        return self.refusals.blocked(record_name)

    def in_flight(self, driver: str) -> int:
        return self.room.in_flight(driver)

    def forget(self, record_name: str) -> None:
        # A record of the same device gets the same name: it must not inherit this one's refusals (blocked()).
        for key in self.refusals.keys_of(record_name):
            self.refusals.done(key)
        self.tally.forget(record_name)

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
        target = None if uid in self._evicted_pods else await self.reads.still_due(  # evicted by this process: its
            record_name, namespace, pod_name, uid, claim_name, burst=len(self.queue) > 0)  # cached pod may lag
        if target is None:
            self.refusals.done(key)
            return
        record, pod, ref, pinned = target
        wait = _drain_wait(record)
        if wait is None:
            self.refusals.done(key)
            return
        if wait > 0:
            raise Requeue(wait, "drain")
        await self.seed()
        pod_ref = f"{namespace}/{pod_name}"
        # A pod counted by an earlier attempt in the window (a PodDisruptionBudget refused it) takes no new room.
        counted = self.ahead is not None and window.counted(self.recent(record), pod_ref, now(),
                                                            self.breaker_settings.window)
        # From here to the call no `await` may come between taking room and using it (breaker_room.py),
        # but the write of its entry ahead of the call, which keeps the room taken until the entry is counted.
        if not counted and not self.room.take(record, ref.driver):
            return
        holds_room = not counted

        def let_go() -> None:
            nonlocal holds_room
            if holds_room:
                holds_room = False
                self.room.release(ref.driver)

        if self.ahead is not None and not counted:
            try:
                await self.tally.write_ahead(record, window.entry(pod_ref, now()))
            except RecordGone:
                let_go()
                self.refusals.done(key)
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
            self.refusals.done(key)
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
            self.refusals.done(key)
            return
        pod = evicted
        was_refused = key in self.refusals
        if self.ahead is None:
            self.tally.add(record, window.entry(pod_ref, now()))
        let_go()
        self.refusals.done(key)
        if was_refused:
            self._promote_next(namespace)
        self._remember_evicted(uid)
        metrics.EVICTIONS.labels("evicted").inc()
        marked_at = records.marked_at(record)
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
        return self.retry_budget if self.refusals.takes_retry_budget(key) else self.budget

    def _promote_next(self, namespace: str) -> None:
        """A refused eviction of the namespace went through: its next one goes at once (refusals.py)."""
        key = self.refusals.promote_next(namespace)
        if key is not None:
            self.retry_budget.withdraw(key)
            self.queue.add(key)

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

    def _remember_evicted(self, uid: str) -> None:
        moment = time.monotonic()
        # Oldest first (insertion order): drop the expired from the front, not a copy per eviction.
        for old, _at in list(itertools.takewhile(lambda item: moment - item[1] >= EVICTED_MEMORY_SECONDS,
                                                self._evicted_pods.items())):
            del self._evicted_pods[old]
        self._evicted_pods.pop(uid, None)
        self._evicted_pods[uid] = moment

    async def _blocked(self, key: Hashable, pod: Body, ref: records.DeviceRef, exc: ApiError) -> Requeue:
        """Count a refusal, say so once on the pod, and back off (refusals.py)."""
        metrics.EVICTIONS.labels("pdb_blocked").inc()
        attempts = self.refusals.refused(key)
        if attempts == 1:
            self._on_evicted(cast(EvictionKey, key)[0], 0.0)  # its status says so now (record_status.settling)
            await self._post_event(pod, "Warning", EVICTION_BLOCKED,
                                   f"eviction for unhealthy device {ref} is blocked: {exc.message}")
        return Requeue(max(refusals.backoff(attempts), exc.retry_after or 0.0), "blocked")

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
    marked_at = records.marked_at(record)
    if marked_at is None:
        return 0.0
    return max((marked_at + drain.after - now()).total_seconds(), 0.0)
