"""Evictions a PodDisruptionBudget refused: their back-off, their budget, and which one goes next.

A refused eviction (HTTP 429 with a disruption budget's cause) is retried with back-off, from 1 s
doubling to 30 s, until the budget allows it or the mark is cleared; its retries take tokens from a
budget of their own (budget.py), not the shared one. While one of a record's evictions is refused, the
record says so (``blocked``) and its taint rule does not wait for it.

When a refused eviction of a namespace goes through, its PodDisruptionBudget may allow more: the
namespace's next refused eviction is promoted back to the shared budget and goes at once, one at a time
(``promote_next``), so a budget that allows one disruption costs one refusal per eviction, and one relaxed
for all drains at the shared budget's pace, not the retry budget's. Pure bookkeeping: no I/O, no clock.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable
from typing import cast

PDB_RETRY_FIRST, PDB_RETRY_MAX = 1.0, 30.0

EvictionKey = tuple[str, str, str, str, str]
"""(record, namespace, pod, pod UID, claim)."""


class Refusals:
    """The keys a PodDisruptionBudget refused, per record and per namespace."""

    def __init__(self) -> None:
        self.attempts: dict[Hashable, int] = {}  # key -> refusals in a row
        self._blocked_records: Counter[str] = Counter()  # record -> its keys in attempts
        # namespace -> its keys in attempts, oldest refusal first; and those promoted back to the shared
        # budget after another of the namespace's refused evictions went through (``promote_next``).
        self._refused_in: dict[str, dict[Hashable, None]] = {}
        self._promoted: set[Hashable] = set()

    def __contains__(self, key: Hashable) -> bool:
        return key in self.attempts

    def refused(self, key: Hashable) -> int:
        """Count a refusal of the key; the refusals in a row, this one included."""
        attempts = self.attempts.get(key, 0) + 1
        self.attempts[key] = attempts
        self._promoted.discard(key)
        if attempts == 1:
            self._blocked_records[cast(EvictionKey, key)[0]] += 1
            self._refused_in.setdefault(cast(EvictionKey, key)[1], {})[key] = None
        return attempts

    def done(self, key: Hashable) -> None:
        """The key is done with PodDisruptionBudgets: evicted, gone, or no longer due."""
        if self.attempts.pop(key, None) is None:
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

    def keys_of(self, record_name: str) -> list[Hashable]:
        return [key for key in self.attempts if cast(EvictionKey, key)[0] == record_name]

    def blocked(self, record_name: str) -> bool:
        """True while a PodDisruptionBudget refuses one of the record's evictions."""
        return self._blocked_records[record_name] > 0

    def takes_retry_budget(self, key: Hashable) -> bool:
        """True for a key whose last call a PodDisruptionBudget refused and that was not promoted since."""
        return key in self.attempts and key not in self._promoted

    def promote_next(self, namespace: str) -> Hashable | None:
        """The namespace's next refused key to go at once from the shared budget (None: none left)."""
        for key in self._refused_in.get(namespace, {}):
            if key not in self._promoted:
                self._promoted.add(key)
                return key
        return None


def backoff(attempts: int) -> float:
    """Seconds before the next try of a key refused `attempts` times in a row."""
    return min(PDB_RETRY_FIRST * 2 ** (attempts - 1), PDB_RETRY_MAX)
