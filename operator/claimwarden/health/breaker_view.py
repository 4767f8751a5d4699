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

Pure: no I/O, no clock; the controller feeds it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta

from .breaker import DriverView, Recent

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
