"""The token bucket: claimwarden's one rate limiter, for API requests, evictions and alert intake alike.

``qps`` tokens are added a second, up to ``burst``; the bucket starts full, so a burst goes out at
once and what follows is spaced at ``1 / qps`` seconds. ``qps`` 0 or less means no limit. Callers
spend in one of three ways:

- `reserve` (kube/api.py, client-go's ``--kube-api-qps``/``--kube-api-burst``): takes a token even
  one not refilled yet, and says how long to wait before using it, so waiting requests keep their
  order;
- `take`, `wait` and `give_back` (health/budget.py, the eviction budget): a token is taken only when
  one is there, and one taken but not used goes back;
- `take_batch` (signals/webhook.py, alert intake): ``count`` tokens at once or none; a batch larger
  than ``burst`` takes the whole bucket, so the biggest batches still get through, one at a time.

Pure apart from the clock, which is injected. Every method also takes the moment explicitly
(``now``), as golang.org/x/time/rate's ``...N(t, n)`` methods do, for callers that already read it.
"""

from __future__ import annotations

import time
from collections.abc import Callable

Clock = Callable[[], float]


class TokenBucket:
    def __init__(self, *, qps: float, burst: int, clock: Clock = time.monotonic, now: float | None = None) -> None:
        """``now``: the moment the bucket starts full (default: the clock's reading)."""
        self.qps = qps
        self.burst = max(int(burst), 1)
        self.clock = clock
        self._tokens = float(self.burst)
        self._at = clock() if now is None else now

    @property
    def unlimited(self) -> bool:
        return self.qps <= 0

    def reserve(self, now: float | None = None) -> float:
        """Take one token, in debt if none is there; return the seconds to wait before using it."""
        if self.unlimited:
            return 0.0
        self._refill(now)
        self._tokens -= 1.0
        return 0.0 if self._tokens >= 0 else -self._tokens / self.qps

    def take(self, now: float | None = None) -> float:
        """Take one token: 0.0 when taken, else the seconds until one will be there (nothing taken)."""
        wait = self.wait(now)
        if wait == 0.0 and not self.unlimited:
            self._tokens -= 1.0
        return wait

    def wait(self, now: float | None = None) -> float:
        """Seconds until a token is there (0.0: now); takes nothing."""
        if self.unlimited:
            return 0.0
        self._refill(now)
        if self._tokens >= 1.0:
            return 0.0
        return (1.0 - self._tokens) / self.qps

    def give_back(self, now: float | None = None) -> None:
        """A token taken and not used goes back (never above ``burst``)."""
        if not self.unlimited:
            self._refill(now)
            self._tokens = min(float(self.burst), self._tokens + 1.0)

    def take_batch(self, count: int, now: float | None = None) -> bool:
        """Take ``count`` tokens (the whole bucket for more than ``burst``) if they are there; else none."""
        if self.unlimited:
            return True
        self._refill(now)
        need = min(count, self.burst)
        if self._tokens < need:
            return False
        self._tokens -= need
        return True

    def _refill(self, now: float | None) -> None:
        moment = self.clock() if now is None else now
        if moment > self._at:
            self._tokens = min(float(self.burst), self._tokens + (moment - self._at) * self.qps)
            self._at = moment
