"""When a record's status is written: at most once per interval, not once per pod.

An eviction changes the record's ``status.podsEvicted`` and ``status.recentEvictions``, and each pod
that leaves changes ``podsPending``. Writing them after every pod costs one PATCH per pod and makes a
burst of evictions wait on its own bookkeeping; so the counts stay in memory, and the record's status
is written once the interval since its last write has passed (the first write after a quiet spell
goes out at once). While the breaker is on, podsEvicted and recentEvictions are not among them: they
are written ahead of each eviction (window.py), and the pacing here covers the rest of the status.
Pure: the caller passes the clock (monotonic seconds) and does the writing; on shutdown it writes
whatever counts are still unsaved.
"""

from __future__ import annotations

from dataclasses import dataclass, field

COUNT_INTERVAL = 2.0  # seconds between two status writes of one record


@dataclass
class CountWrites:
    """Which records have counts not yet in their status, and when each status may be written next."""

    interval: float = COUNT_INTERVAL
    _last_write: dict[str, float] = field(default_factory=dict)
    _unsaved: set[str] = field(default_factory=set)
    _changes: dict[str, int] = field(default_factory=dict)
    _first_asked: dict[str, float] = field(default_factory=dict)

    def changed(self, record: str, now: float) -> float:
        """The record's counts changed: seconds until they should be written (0: now)."""
        self._unsaved.add(record)
        self._changes[record] = self._changes.get(record, 0) + 1
        return self.wait(record, now)

    def wait(self, record: str, now: float, *, settle: float = 0.0) -> float:
        """Seconds until the record's status may be written again (0: now). `settle`: a first write waits
        that long after it was first asked for (so that it carries what is about to change)."""
        last = self._last_write.get(record)
        if last is None:
            first = self._first_asked.setdefault(record, now)
            return max(first + settle - now, 0.0)
        return max(last + self.interval - now, 0.0)

    def version(self, record: str) -> int:
        """Taken when a status is built: `written` then knows whether the counts changed meanwhile."""
        return self._changes.get(record, 0)

    def written(self, record: str, now: float, version: int) -> None:
        """A status write built at `version` succeeded at `now`; counts changed since stay unsaved."""
        self._last_write[record] = now
        if self._changes.get(record, 0) == version:
            self._unsaved.discard(record)

    def unsaved(self) -> list[str]:
        """Records whose counts are only in memory, sorted."""
        return sorted(self._unsaved)

    def is_unsaved(self, record: str) -> bool:
        return record in self._unsaved

    def forget(self, record: str) -> None:
        self._unsaved.discard(record)
        self._last_write.pop(record, None)
        self._changes.pop(record, None)
        self._first_asked.pop(record, None)
