"""The cluster's state as metric samples, computed from the cache on a scrape.

`metrics.py` defines the series and how they are served; this module says what is counted: each
claim's state, source, age while pending and nearness to the reservedFor limit, and health's view
of the devices. The cluster's state is reported by the leader only, so that sums over replicas stay
true, and a computed result is served again for a while (the gauges walk every claim, slice and
record). Scrapes run in prometheus_client's thread; the indices may only be read on the loop.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from . import metrics
from .cache import Cache
from .health.plan import is_quarantine_claim
from .objects.claims import claim_source, is_allocated
from .reservations.plan import is_near_limit
from .runtime.operator import Runtime
from .timestamps import now, parse_rfc3339

T = TypeVar("T")


def claim_samples(cache: Cache, namespace: str) -> list[metrics.ClaimSample]:
    """One sample per cached claim; `namespace` is claimwarden's own (where its quarantine claims live)."""
    samples = []
    current = now()
    for claim in cache.claims():
        reserved = len((claim.get("status") or {}).get("reservedFor") or [])
        state = "reserved" if reserved else "allocated" if is_allocated(claim) else "pending"
        source = "quarantine" if is_quarantine_claim(claim, namespace) else claim_source(claim)
        created = parse_rfc3339(claim["metadata"].get("creationTimestamp")) if state == "pending" else None
        age = max(0.0, (current - created).total_seconds()) if created else 0.0
        samples.append(metrics.ClaimSample(state, source, is_near_limit(reserved), age))
    return samples


def register_gauges(runtime: Runtime, *, namespace: str, cache_seconds: float) -> None:
    """Register the claims' collector, and the devices' where health runs. Scrapes run on the event loop
    (runtime/server.py), between events; the gauges walk every claim, slice and record, so a result is
    reused for `cache_seconds`."""
    def gauge(fn: Callable[[], T]) -> Callable[[], T]:
        return metrics.cached(metrics.guarded(fn), cache_seconds)

    metrics.REGISTRY.register(metrics.ClaimCollector(
        gauge(lambda: claim_samples(runtime.cache, namespace) if runtime.leading else [])))
    health = runtime.health
    if health is not None:
        metrics.REGISTRY.register(metrics.DeviceCollector(
            gauge(lambda: health.device_samples() if runtime.leading else []),
            gauge(lambda: health.record_effects() if runtime.leading else []),
            gauge(lambda: health.pending_evictions() if runtime.leading else 0),
            gauge(lambda: health.unselective_taint_rules() if runtime.leading else None)))
