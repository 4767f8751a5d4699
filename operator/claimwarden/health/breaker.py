"""The blast-radius breaker: one bad mark or script must not empty the cluster (docs/concepts/safety.md "What
claimwarden will not do without asking"). Pure decisions, no I/O.

Per driver, claimwarden counts the pods that its NoExecute records would evict now (`pending`)
plus the pods it evicted in the last `window` (`recent`, kept in the records' status, so a restart
computes the same). The limit is a fraction of the pods holding devices of that driver
(`--breaker-max-fraction`) or an absolute count (`--breaker-max-pods`), whichever is lower.

- `pending` plus `recent` (each pod once) above the limit: the breaker is **open** for the driver. It is reported
  (condition EvictionPaused on the records, a Warning Event, a metric), and new evictions start
  only while `recent + in flight` stays within the limit: a mark of 40 % of the devices with a
  limit of 30 % evicts exactly 30 %, then pauses.
- It closes by itself when marks are cleared (pending drops) or evictions leave the window.
- An approved record is outside the breaker: its pods are neither counted nor held back. Which
  approvals count (an approver's, for the record's current generation, with the admission policy
  installed) is approval.py's to decide; the callers pass the answer in.

The "pods holding devices" of a driver are those in `reservedFor` of the claims allocated one of
its devices (for a PodGroup entry: the group's pods that use the claim; admin-access results, which
claimwarden never evicts, do not count), plus the pods evicted in
the window, approved or not (they held one until claimwarden evicted them; without them the limit
would shrink with every eviction). Pods are identified by "namespace/name",
so a pod being evicted is never counted twice.

Each device weighs at most one pod (``CLAIM_PODS_PER_DEVICE``): a claim counts at most as many of
its pods as it was allocated devices of the driver (the first by name), and a record's evicted pods
count as one. Pods that share a claim share its devices; without the cap, one tenant's claim
reserved for 256 pods would add 256 to the population, and so raise every other tenant's limit
(issue 20, finding 8). A pod holding several devices still counts once.

Small clusters: the fraction never allows fewer than `min_pods` (default 8, one node's worth of
GPUs), so one broken node is always emptied at once; `--breaker-max-pods` is a hard limit.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from claimwarden.claims.podgroups import is_podgroup_reservation
from claimwarden.objects.claims import is_pod_reservation, reserved_for, used_devices
from claimwarden.objects.meta import metadata
from claimwarden.timestamps import format_rfc3339, parse_rfc3339

DEFAULT_MAX_FRACTION = 0.3
DEFAULT_MIN_PODS = 8
DEFAULT_WINDOW = timedelta(minutes=10)
CONDITION = "EvictionPaused"
RECENT_MAX = 256
"""At most this many recent evictions are kept in one record's status (a device with more
consumers is not evicted faster than the window can remember anyway)."""
CLAIM_PODS_PER_DEVICE = 1
"""A claim counts at most this many of its pods per device of the driver it was allocated."""


@dataclass(frozen=True)
class Settings:
    max_fraction: float = DEFAULT_MAX_FRACTION
    max_pods: int | None = None
    min_pods: int = DEFAULT_MIN_PODS
    window: timedelta = DEFAULT_WINDOW

    @property
    def enabled(self) -> bool:
        """`--breaker-max-fraction=1` and no `--breaker-max-pods` turn the breaker off."""
        return self.max_fraction < 1 or self.max_pods is not None

    def limit(self, population: int) -> int | None:
        """How many pods of a driver with `population` pods may be evicted in one window; None: no limit."""
        limits = []
        if self.max_fraction < 1:
            limits.append(max(math.floor(self.max_fraction * population + 1e-9), self.min_pods))
        if self.max_pods is not None:
            limits.append(self.max_pods)
        return min(limits) if limits else None


@dataclass(frozen=True)
class Recent:
    """One eviction made for a record, as kept in its status.recentEvictions."""

    pod: str  # "namespace/name"
    at: datetime


@dataclass(frozen=True)
class DriverView:
    """What the breaker decides one driver on."""

    holding: AbstractSet[str] = frozenset()
    """Pods ("namespace/name") holding a device of the driver now."""
    pending: AbstractSet[str] = frozenset()
    """Pods that unapproved NoExecute records would evict now (tolerated pods excluded)."""
    recent: tuple[Recent, ...] = ()
    """Evictions made for unapproved records (older ones are dropped here)."""
    approved_recent: tuple[Recent, ...] = ()
    """Evictions made for approved records: not counted, but those pods held devices too."""
    in_flight: int = 0
    """Evictions started (slot taken) and not yet in `recent`."""
    departed: tuple[str, ...] | None = None
    """The evicted pods that count in the population (one per record); None: every pod in `recent` and
    `approved_recent`."""


@dataclass(frozen=True)
class Decision:
    driver: str
    open: bool = False
    limit: int | None = None
    population: int = 0
    pending: int = 0
    recent: int = 0
    room: int | None = None
    """New evictions that may start now; None: no limit."""
    frees_at: datetime | None = None
    """When the oldest eviction in the window leaves it (the room may grow then)."""
    reason: str = ""
    counted: int = 0
    """Pods pending or evicted in the window, each once."""

    def allows(self) -> bool:
        return self.room is None or self.room > 0


def in_window(recent: Iterable[Recent], now: datetime, window: timedelta) -> list[Recent]:
    """The evictions at most `window` old, oldest first."""
    return sorted((r for r in recent if now - r.at < window), key=lambda r: r.at)


def decide(driver: str, view: DriverView, settings: Settings, now: datetime) -> Decision:
    """Open or closed, and how many new evictions may start, for one driver."""
    if not settings.enabled:
        return Decision(driver=driver)
    # Sizes of unions without building them: holding and pending may be large, the window is short.
    recent = in_window(view.recent, now, settings.window)
    recent_pods = {r.pod for r in recent}
    departed = set(view.departed) if view.departed is not None else \
        recent_pods | {r.pod for r in in_window(view.approved_recent, now, settings.window)}
    population = len(view.holding) + sum(1 for pod in departed if pod not in view.holding)
    limit = settings.limit(population)
    also_pending = sum(1 for pod in recent_pods if pod in view.pending)
    counted = len(view.pending) + len(recent_pods) - also_pending
    if limit is None:
        return Decision(driver=driver, population=population, pending=len(view.pending), recent=len(recent))
    is_open = counted > limit
    room = max(limit - len(recent) - view.in_flight, 0)
    frees_at = recent[0].at + settings.window if recent else None
    reason = ""
    if is_open:
        waiting = len(view.pending) - also_pending
        reason = (f"eviction breaker for driver {driver} is open: {counted} pod(s) would be or were evicted "
                  f"within {_duration(settings.window)} ({waiting} pending, {len(recent)} evicted), more than "
                  f"the limit of {limit} ({_limit_text(settings, population)}); {waiting} pod(s) wait. An approver "
                  f"may approve a record (`kubectl claimwarden approve <pool>/<device>`), or clear the marks that "
                  f"are wrong")
    return Decision(driver=driver, open=is_open, limit=limit, population=population, pending=len(view.pending),
                    recent=len(recent), room=room, frees_at=frees_at, reason=reason, counted=counted)


def _limit_text(settings: Settings, population: int) -> str:
    parts = []
    if settings.max_fraction < 1:
        parts.append(f"{settings.max_fraction:g} of {population} pod(s) holding its devices, at least "
                     f"{settings.min_pods}")
    if settings.max_pods is not None:
        parts.append(f"--breaker-max-pods={settings.max_pods}")
    return "; ".join(parts)


def _duration(window: timedelta) -> str:
    seconds = int(window.total_seconds())
    return f"{seconds // 60}m" if seconds % 60 == 0 else f"{seconds}s"


# --- the inputs, from plain objects -------------------------------------------------------------

def holding_pods(claims: Iterable[dict[str, Any]], skip_namespace: str,
                 podgroup_pods: Callable[[dict[str, Any]], Iterable[str]] | None = None) -> dict[str, set[str]]:
    """driver -> pods ("namespace/name") the claims count for (``claim_holders``), in one pass."""
    found: dict[str, set[str]] = {}
    for claim in claims:
        for driver, pods in claim_holders(claim, skip_namespace, podgroup_pods).items():
            found.setdefault(driver, set()).update(pods)
    return found


def claim_holders(claim: dict[str, Any], skip_namespace: str,
                  podgroup_pods: Callable[[dict[str, Any]], Iterable[str]] | None = None) -> dict[str, frozenset[str]]:
    """driver -> the pods ("namespace/name") the claim counts for in the driver's population: those in its
    reservedFor, at most CLAIM_PODS_PER_DEVICE per device of the driver it was allocated without admin
    access, the first by name.

    A claim in `skip_namespace` (claimwarden's own: quarantine claims hold no pods) counts for none.
    `podgroup_pods(claim)`: the names of the pods holding the claim through a PodGroup entry of its
    reservedFor (health/groups.py); None counts pod entries only.
    """
    namespace = str(metadata(claim).get("namespace") or "")
    if namespace == skip_namespace:
        return {}
    names = {str(e.get("name") or "") for e in reserved_for(claim) if is_pod_reservation(e)}
    if podgroup_pods is not None and any(is_podgroup_reservation(e) for e in reserved_for(claim)):
        names.update(podgroup_pods(claim))
    if not names:
        return {}
    devices: dict[str, int] = {}
    for driver, _pool, _device in used_devices(claim):
        devices[driver] = devices.get(driver, 0) + 1
    ordered = sorted(names)
    return {driver: frozenset(f"{namespace}/{name}" for name in ordered[:count * CLAIM_PODS_PER_DEVICE])
            for driver, count in devices.items()}


def parse_recent(status: Mapping[str, Any]) -> list[Recent]:
    """status.recentEvictions ([{pod, at}]) as Recent, skipping malformed entries."""
    found = []
    for entry in status.get("recentEvictions") or []:
        if not isinstance(entry, Mapping):
            continue
        at = parse_rfc3339(entry.get("at"))
        if at is not None and entry.get("pod"):
            found.append(Recent(str(entry["pod"]), at))
    return found


def format_recent(recent: Iterable[Recent], now: datetime, window: timedelta) -> list[dict[str, str]]:
    """The evictions still in the window, newest `RECENT_MAX`, for status.recentEvictions."""
    kept = in_window(recent, now, window)[-RECENT_MAX:]
    return [{"pod": r.pod, "at": format_rfc3339(r.at)} for r in kept]
