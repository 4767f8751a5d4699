"""Bookkeeping waits while a wave of evictions is under way, so that the evictions go first.

When a rack fails, every write that is not an eviction competes with the evictions for the same
apiserver: the records' status, the Events on the evicted pods, and the release of the evicted pods'
claims. None of them protects anything while the wave lasts. A status or an Event can come seconds
later. A claim on a quarantined device keeps its allocation until it is deleted (rule 2 in the
package docstring), so the device stays held while its release waits, and its quarantine claim
follows the release anyway. So each of them waits while evictions are queued or in flight, each for
at most HOLD_MAX seconds, so that a wave that never ends starves nothing. What protects a device
(a new quarantine claim, its allocation) never waits.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable

HOLD_MAX = 30.0  # seconds one piece of bookkeeping may wait for a wave of evictions
HOLD_RECHECK = 1.0  # seconds between two looks at whether the wave is over


class Wave:
    """Whether bookkeeping should wait now, per key (a record, a claim), with the wait bounded per key."""

    def __init__(self, busy: Callable[[], bool], *, hold_max: float = HOLD_MAX,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._busy = busy
        self._hold_max = hold_max
        self._clock = clock
        self._since: dict[Hashable, float] = {}

    def holds(self, key: Hashable) -> bool:
        """True when the key's bookkeeping should wait (come back in HOLD_RECHECK seconds)."""
        if not self._busy():
            self._since.clear()
            return False
        first = self._since.setdefault(key, self._clock())
        if self._clock() - first >= self._hold_max:
            self._since.pop(key, None)
            return False
        return True
