"""The eviction budget: tokens for the eviction calls of the process, handed out fairly (docs/concepts/safety.md "The
eviction budget").

A token bucket: `qps` tokens are added per second up to `burst`; the bucket starts full, so a burst
of evictions (one broken node: 8 pods) goes out at once. `qps <= 0` means no budget.

Fairness: when the bucket runs dry, an eviction asking for a token is parked in its namespace's line,
and the tokens that come later go round-robin over the namespaces with a parked eviction, one token
per namespace per turn (``FairBudget``). One team with 300 pods to evict then delays another team's
one pod by at most one token per namespace waiting, not by 300. Parking and handing out cost O(1)
per eviction; a parked eviction costs no API call until its token is there.

Two budgets, two lines: an eviction whose last call a PodDisruptionBudget refused (HTTP 429) asks a
small budget of its own (`--eviction-retry-qps`), not the shared one. Its refusals are the PDB doing
its job; retrying them must not take the tokens of other namespaces' evictions (300 protected pods on
a broken device retrying every 30 s are 10 calls a second, the whole default budget). A refused
eviction that goes through sends its namespace's next refused one back to the shared budget
(evictions.py ``_promote_next``), so a relaxed PDB is not drained at the retry budget's pace.

Pure: the clock is passed in, so unit tests drive it with plain numbers; the caller re-queues the
keys ``FairBudget.grant`` hands out.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Hashable

from ..tokenbucket import TokenBucket

DEFAULT_QPS = 10.0
DEFAULT_BURST = 20
DEFAULT_RETRY_QPS = 1.0
RETRY_BURST = 2
GRANT_TTL = 60.0
"""Seconds a token handed to a parked eviction stays reserved for it; one not claimed by then (its key
never came back: a closed queue) goes back to the bucket."""


class FairBudget:
    """A token bucket whose tokens go round-robin over namespaces once evictions have to wait."""

    def __init__(self, bucket: TokenBucket, *, grant_ttl: float = GRANT_TTL) -> None:
        self.bucket = bucket
        self._clock = bucket.clock
        self._grant_ttl = grant_ttl
        # namespace -> its parked keys, oldest first; the namespace first in the ring is served next.
        self._ring: OrderedDict[str, deque[tuple[Hashable, int]]] = OrderedDict()
        # key -> the ticket of its place in the ring; an entry whose ticket differs was withdrawn.
        self._parked: dict[Hashable, int] = {}
        self._tickets = 0
        self._granted: OrderedDict[Hashable, float] = OrderedDict()  # key -> when its token was reserved

    @property
    def unlimited(self) -> bool:
        return self.bucket.unlimited

    def __len__(self) -> int:
        """Evictions parked, waiting for a token."""
        return len(self._parked)

    def is_parked(self, key: Hashable) -> bool:
        return key in self._parked

    def ask(self, key: Hashable, namespace: str) -> bool:
        """True: the key may call now (its token is taken). False: it is parked in its namespace's line,
        and ``grant`` hands it out when its turn comes."""
        if self._granted.pop(key, None) is not None:
            return True
        if key in self._parked:
            return False
        if not self._parked and self.bucket.take() == 0.0:
            return True
        self._tickets += 1
        self._parked[key] = self._tickets
        line = self._ring.get(namespace)
        if line is None:
            line = self._ring[namespace] = deque()  # a namespace new to the ring is served last in this round
        line.append((key, self._tickets))
        return False

    def grant(self) -> list[Hashable]:
        """Hand the tokens there now to parked keys, one namespace after the other; each token is reserved
        for its key until it asks again (``ask``) or GRANT_TTL passes. The keys to look at again."""
        self._expire_grants()
        granted: list[Hashable] = []
        while self._parked and self.bucket.take() == 0.0:
            key = self._next_parked()
            self._granted[key] = self._clock()
            granted.append(key)
        return granted

    def next_grant_in(self) -> float | None:
        """Seconds until ``grant`` would hand out a token (None: nothing is parked)."""
        if not self._parked:
            return None
        return self.bucket.wait()

    def give_back(self) -> None:
        """The token of a key that asked (``ask`` said True) was not used."""
        self.bucket.give_back()

    def withdraw(self, key: Hashable) -> None:
        """The key needs no token any more: drop its place in line, or its reserved token."""
        self._parked.pop(key, None)
        if not self._parked:
            self._ring.clear()  # only withdrawn entries are left in it
        if self._granted.pop(key, None) is not None:
            self.bucket.give_back()

    def _next_parked(self) -> Hashable:
        """Take the next key out of line: the oldest of the namespace whose turn it is (withdrawn entries are
        skipped; called only while a key is parked)."""
        while True:
            namespace, line = next(iter(self._ring.items()))
            key, ticket = line.popleft()
            if line:
                self._ring.move_to_end(namespace)
            else:
                del self._ring[namespace]
            if self._parked.get(key) == ticket:
                del self._parked[key]
                return key

    def _expire_grants(self) -> None:
        moment = self._clock()
        while self._granted:
            key, at = next(iter(self._granted.items()))
            if moment - at < self._grant_ttl:
                return
            del self._granted[key]
            self.bucket.give_back()
