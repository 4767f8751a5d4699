"""The breaker's view of each driver, kept up to date as claims, records and evictions change.

breaker.py decides on one driver's totals: the pods holding its devices, the pods its NoExecute
records would evict now, and the evictions of the window. They used to be gathered per decision, and
a decision is made for every record reconcile and again before every eviction: a walk over every
record and its evictions, and over every claim once a second. In a burst of 2,000 marks that was
quadratic, on the event loop that also renews the lease (code review 2a798de, section 9).

Here each input updates the totals it changes, when it changes: a claim its holders (a claim event,
or a pod event for the claims a pod uses), a record reconcile its pending pods, an eviction its
entry in the window. A decision then costs O(the driver's evictions in the window), plus the
evictions that left the window since the last one. The pods holding devices are also rebuilt from
all claims now and then (``Population.reset``), so a missed event is not kept for long.

``BreakerView`` is pure (no I/O, no clock). ``Breakers`` owns it and feeds it: from the cache (once, every
record; every POPULATION_RESYNC s, every claim's holders), from the controller's events, and from the
evictions (``add_recent``); it makes the decisions and says when a driver's breaker opens or closes
(metric, log, one Warning Event, and every record of the driver looked at again for its condition).
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta

from .. import metrics
from ..cache import Body, Cache
from ..timestamps import now as wall_clock
from . import breaker, groups, plan, records
from .breaker import DriverView, Recent
from .record_status import condition_true
from .records import DeviceRef

log = logging.getLogger("claimwarden.health")

BREAKER_OPEN = "EvictionBreakerOpen"
POPULATION_RESYNC = 60.0  # seconds between rebuilds of the pods holding devices from all claims (missed events)

ClaimKey = tuple[str, str]  # (namespace, name)


def _shift(totals: dict[str, Counter[str]], driver: str, *, added: Iterable[str] = (),
           removed: Iterable[str] = ()) -> None:
    """Count `added` once more and `removed` once less among the driver's pods; a pod at 0 leaves, and so does
    a driver left with none."""
    counts = totals.setdefault(driver, Counter())
    for pod in added:
        counts[pod] += 1
    for pod in removed:
        counts[pod] -= 1
        if counts[pod] <= 0:
            del counts[pod]
    if not counts:
        del totals[driver]


class Population:
    """driver -> the pods holding its devices, as the claims count them (breaker.claim_holders)."""

    def __init__(self) -> None:
        self._by_claim: dict[ClaimKey, Mapping[str, frozenset[str]]] = {}
        self._pods: dict[str, Counter[str]] = {}  # driver -> pod -> claims counting it

    def set_claim(self, key: ClaimKey, holders: Mapping[str, frozenset[str]]) -> None:
        """The pods the claim counts for now, per driver ({}: none, or the claim is gone)."""
        before = self._by_claim.pop(key, {})
        if holders:
            self._by_claim[key] = holders
        for driver in before.keys() | holders.keys():
            old, new = before.get(driver, frozenset()), holders.get(driver, frozenset())
            if old == new:
                continue
            _shift(self._pods, driver, added=new - old, removed=old - new)

    def reset(self, claims: Mapping[ClaimKey, Mapping[str, frozenset[str]]]) -> None:
        """Every claim's holders at once (a rebuild from the cache)."""
        self._by_claim.clear()
        self._pods.clear()
        for key, holders in claims.items():
            self.set_claim(key, holders)

    def pods(self, driver: str) -> Counter[str]:
        """The driver's holding pods (the keys; a live view, not a copy)."""
        return self._pods.get(driver) or Counter()


@dataclass
class _Record:
    driver: str
    approved: bool
    generation: int  # entries of the window carry it: those of a forgotten or re-registered record are dropped


class BreakerView:
    """Per-driver totals for the breaker: holding pods, pending pods, evictions in the window."""

    def __init__(self) -> None:
        self.population = Population()
        self._records: dict[str, _Record] = {}
        self._driver_records: dict[str, set[str]] = {}
        self._pending_of: dict[str, tuple[str, frozenset[str]]] = {}  # record -> (driver, its pending pods)
        self._pending: dict[str, Counter[str]] = {}  # driver -> pod -> records that would evict it
        self._window: dict[str, list[tuple[str, int, Recent]]] = {}  # driver -> (record, generation, eviction)
        self._generations = 0

    # --- records -------------------------------------------------------------------------------

    def register(self, name: str, driver: str, *, approved: bool, recent: Callable[[], Iterable[Recent]]) -> None:
        """The record names a device of `driver`; `recent()`: its evictions so far (read at the first
        registration only: later ones come through ``add_recent``)."""
        known = self._records.get(name)
        if known is not None and known.driver == driver:
            known.approved = approved
            return
        self.forget(name)
        self._generations += 1
        self._records[name] = _Record(driver, approved, self._generations)
        self._driver_records.setdefault(driver, set()).add(name)
        self._window.setdefault(driver, []).extend((name, self._generations, entry) for entry in recent())

    def records_of(self, driver: str) -> list[str]:
        return sorted(self._driver_records.get(driver, ()))

    def forget(self, name: str) -> None:
        """The record is gone: its pending pods and its evictions leave the driver's totals."""
        self.set_pending(name, None, frozenset())
        known = self._records.pop(name, None)
        if known is not None:
            names = self._driver_records.get(known.driver, set())
            names.discard(name)
            if not names:
                self._driver_records.pop(known.driver, None)

    def set_pending(self, name: str, driver: str | None, pods: frozenset[str]) -> None:
        """The pods the record would evict now and that the breaker counts (None or empty: none)."""
        before = self._pending_of.pop(name, None)
        if before is not None:
            _shift(self._pending, before[0], removed=before[1])
        if driver is None or not pods:
            return
        self._pending_of[name] = (driver, pods)
        _shift(self._pending, driver, added=pods)

    def add_recent(self, name: str, entry: Recent) -> None:
        """The record evicted a pod (a record not registered yet brings its evictions when it is)."""
        known = self._records.get(name)
        if known is not None:
            self._window.setdefault(known.driver, []).append((name, known.generation, entry))

    # --- the view --------------------------------------------------------------------------------

    def driver_view(self, driver: str, *, now: datetime, window: timedelta, in_flight: int) -> DriverView:
        """What breaker.decide needs for the driver; drops the evictions that left the window."""
        recent: list[Recent] = []
        approved: list[Recent] = []
        departed: dict[str, str] = {}  # record -> one of its evicted pods (each device weighs one pod)
        kept = []
        for name, generation, entry in self._window.get(driver, ()):
            known = self._records.get(name)
            if known is None or known.generation != generation or now - entry.at >= window:
                continue
            kept.append((name, generation, entry))
            (approved if known.approved else recent).append(entry)
            departed.setdefault(name, entry.pod)
        if kept:
            self._window[driver] = kept
        else:
            self._window.pop(driver, None)
        return DriverView(holding=self.population.pods(driver).keys(),
                          pending=(self._pending.get(driver) or Counter()).keys(),
                          recent=tuple(recent), approved_recent=tuple(approved), in_flight=in_flight,
                          departed=tuple(departed.values()))


class Breakers:
    """Each driver's breaker: its view kept up to date, its decisions, and what was said of it."""

    def __init__(self, *, cache: Cache, namespace: str, settings: breaker.Settings,
                 approved: Callable[[Body], str | None], in_flight: Callable[[str], int],
                 recent: Callable[[Body], Iterable[Recent]], look_again: Callable[[str], None],
                 post_event: Callable[[Body, str, str, str], Awaitable[None]]) -> None:
        """`approved(record)`: who approved its evictions past the breaker (None: no approval counts);
        `in_flight(driver)`: its evictions under way; `recent(record)`: its evictions so far;
        `look_again(record)`: queue the record's reconcile."""
        self.cache = cache
        self.namespace = namespace
        self.settings = settings
        self._approved = approved
        self._in_flight = in_flight
        self._recent = recent
        self._look_again = look_again
        self._post_event = post_event
        self.view = BreakerView()
        self.records_seeded = False
        self._population_synced = -POPULATION_RESYNC
        self._open: dict[str, bool] = {}
        self._shown: dict[str, tuple[bool, int, int, int, int | None]] = {}  # driver -> what its records said

    def decision(self, driver: str) -> breaker.Decision:
        """The breaker's decision for the driver now, over all its NoExecute records."""
        if not self.settings.enabled:
            return breaker.Decision(driver=driver)
        self._seed()
        view = self.view.driver_view(driver, now=wall_clock(), window=self.settings.window,
                                     in_flight=self._in_flight(driver))
        return breaker.decide(driver, view, self.settings, wall_clock())

    def claim_changed(self, key: ClaimKey, claim: Body, *, deleted: bool) -> None:
        if self.settings.enabled:
            self.view.population.set_claim(key, {} if deleted else self._claim_holders(claim))

    def note_record(self, record: Body) -> None:
        """The record as the breaker's view knows it: its driver and whether it is approved."""
        name = record["metadata"]["name"]
        ref = records.record_ref(record)
        if ref is None:
            self.view.forget(name)
            return
        self.view.register(name, ref.driver, approved=self._approved(record) is not None,
                           recent=lambda: list(self._recent(record)))

    def for_record(self, record: Body, ref: DeviceRef, record_plan: plan.RecordPlan,
                   approved: str | None) -> breaker.Decision:
        """Leave the record's pending pods in the breaker's view, then decide for its driver."""
        name = record["metadata"]["name"]
        self._seed()
        self.note_record(record)
        if records.record_effect(record) == "NoExecute" and approved is None and record_plan.evict:
            self.view.set_pending(name, ref.driver, frozenset(f"{e.namespace}/{e.pod}" for e in record_plan.evict))
        else:
            self.view.set_pending(name, None, frozenset())
        return self.decision(ref.driver)

    def add_recent(self, record_name: str, entry: Recent) -> None:
        self.view.add_recent(record_name, entry)

    def forget(self, name: str) -> None:
        self.view.forget(name)

    async def record_gone(self) -> None:
        """Fewer marks in force (and the record's evictions leave the window with it): a breaker may close,
        even when no record of its driver is left to reconcile."""
        for driver in [d for d, is_open in self._open.items() if is_open]:
            await self.note(self.decision(driver), None)

    async def note(self, decision: breaker.Decision, record: Body | None) -> None:
        """On a change of the driver's breaker: metric, log, one Warning Event, and every record of the
        driver looked at again (their EvictionPaused conditions)."""
        driver = decision.driver
        # While open, a change in what its records' messages count (pending, evicted, the limit) refreshes them
        # too: with only (counted, limit) compared, a record paused before the last evictions kept saying
        # "5 pending, 11 evicted" once the count stood at 16 either way. Not the population: claim events move it
        # all the time, and every record of the driver would be written again for each.
        shown = (True, decision.counted, decision.pending, decision.recent, decision.limit) if decision.open \
            else (False, 0, 0, 0, None)
        if self._shown.get(driver, (False, 0, 0, 0, None)) == shown:
            return
        self._shown[driver] = shown
        for name in self.view.records_of(driver):
            self._look_again(name)
        if self._open.get(driver, False) == decision.open:
            return
        self._open[driver] = decision.open
        metrics.EVICTION_BREAKER_OPEN.labels(driver).set(1 if decision.open else 0)
        if not decision.open:
            log.info("eviction breaker for driver %s closed", driver)
            return
        log.warning("%s", decision.reason)
        # After a restart the breaker is found open again: a record still showing the condition says it
        # was reported already.
        reported = any(r is not None and condition_true(r, breaker.CONDITION)
                       for r in map(self.cache.record, self.view.records_of(driver)))
        if not reported and record is not None:
            await self._post_event(record, "Warning", BREAKER_OPEN, decision.reason)

    def _seed(self) -> None:
        """Once, every record the cache holds (their evictions in the window come from their status, so a
        restarted claimwarden decides as before); and now and then every claim's holders again."""
        if not self.records_seeded:
            self.records_seeded = True
            for record in self.cache.records():
                self.note_record(record)
        if time.monotonic() - self._population_synced >= POPULATION_RESYNC:
            self._population_synced = time.monotonic()
            self.view.population.reset({
                (str(claim["metadata"].get("namespace") or ""), str(claim["metadata"].get("name") or "")):
                    self._claim_holders(claim) for claim in self.cache.claims()})

    def _claim_holders(self, claim: Body) -> dict[str, frozenset[str]]:
        pods = self.cache.pods()
        return breaker.claim_holders(claim, self.namespace, lambda claim: [
            str(pod["metadata"]["name"]) for pod in groups.group_pods(claim, pods, self.cache.pods_in_podgroup)])
