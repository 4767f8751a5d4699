"""The breaker's room taken by evictions in flight, per driver.

Right before an eviction's call the breaker is asked again (breaker_view.Breakers.decision): unless the
record's approval counts, the eviction starts only while the driver's evictions in the window plus those
in flight stay within its limit. The room taken is held here from that moment until the eviction is
counted in the window (ahead of the call, or right after it with the breaker off), so that concurrent
workers cannot overshoot. An eviction refused room is dropped by its worker; its record is looked at
again when the window may have room (``on_paused``).
"""

from __future__ import annotations

from collections.abc import Callable

from .. import metrics
from ..cache import Body
from . import breaker

Decide = Callable[[str], breaker.Decision]


class BreakerRoom:
    """driver -> evictions in flight, each holding room the breaker gave."""

    def __init__(self, *, settings: breaker.Settings, decide: Decide | None,
                 approved: Callable[[Body], str | None],
                 on_paused: Callable[[str, breaker.Decision], None] | None) -> None:
        """`decide(driver)`: the breaker's decision now (None: no breaker); `approved(record)`: who approved the
        record's evictions past it; `on_paused(record, decision)`: an eviction of the record was held back."""
        self._enabled = decide is not None and settings.enabled
        self._decide = decide
        self._approved = approved
        self._on_paused = on_paused
        self._in_flight: dict[str, int] = {}

    def in_flight(self, driver: str) -> int:
        return self._in_flight.get(driver, 0)

    def take(self, record: Body, driver: str) -> bool:
        """Take room for one eviction, or say no (and have the record looked at again when room frees)."""
        if not self._enabled:
            return True
        if self._approved(record) is None:
            assert self._decide is not None
            decision = self._decide(driver)
            if not decision.allows():
                metrics.EVICTIONS_DEFERRED.labels("breaker").inc()
                if self._on_paused is not None:
                    self._on_paused(record["metadata"]["name"], decision)
                return False
        self._in_flight[driver] = self._in_flight.get(driver, 0) + 1
        return True

    def release(self, driver: str) -> None:
        """The room taken for one eviction is let go (counted in the window, or not used)."""
        if not self._enabled:
            return
        left = self._in_flight.get(driver, 0) - 1
        if left > 0:
            self._in_flight[driver] = left
        else:
            self._in_flight.pop(driver, None)
