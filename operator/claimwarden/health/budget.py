"""The eviction budget: one token bucket for all eviction calls of the process (README "What
claimwarden will not do without asking").

A token is taken right before each Eviction API call, after claimwarden decided the pod is due
(and after the breaker let it through); PodDisruptionBudgets are then checked by the API server
as always. `qps` tokens are added per second up to `burst`; the bucket starts full, so a burst of
evictions (one broken node: 8 pods) goes out at once. `qps <= 0` means no budget.

Pure: the clock is passed in, so unit tests drive it with plain numbers.
"""

from __future__ import annotations

import time
from collections.abc import Callable

DEFAULT_QPS = 10.0
DEFAULT_BURST = 20


class TokenBucket:
    def __init__(self, *, qps: float, burst: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.qps = qps
        self.burst = max(int(burst), 1)
        self._clock = clock
        self._tokens = float(self.burst)
        self._last = clock()

    @property
    def unlimited(self) -> bool:
        return self.qps <= 0

    def take(self) -> float:
        """Take one token: 0.0 when taken, else the seconds until one will be there (nothing taken)."""
        if self.unlimited:
            return 0.0
        moment = self._clock()
        self._tokens = min(float(self.burst), self._tokens + (moment - self._last) * self.qps)
        self._last = moment
        if self._tokens >= 1.0:
            self._tokens -= 1.0
            return 0.0
        return (1.0 - self._tokens) / self.qps
