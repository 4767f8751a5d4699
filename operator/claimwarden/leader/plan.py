"""What a candidate does with the Lease it just read: pure decisions, no I/O.

The rules are client-go's (``tools/leaderelection``): a candidate takes a lease over only when its
holder has not changed it for a whole ``leaseDurationSeconds`` *as observed by this candidate's own
clock* (never by comparing the renewTime written by another machine with ours: clocks differ), or
when the holder released it (empty ``holderIdentity``). The holder renews; a takeover counts one
more ``leaseTransitions``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

CREATE, RENEW, TAKE_OVER, WAIT = "create", "renew", "take-over", "wait"


@dataclass(frozen=True)
class Observed:
    """The lease's record as last seen, and when (this process's monotonic clock) it last changed."""

    record: tuple[Any, ...]
    changed_at: float


@dataclass(frozen=True)
class Decision:
    action: str
    """CREATE, RENEW, TAKE_OVER or WAIT."""
    spec: dict[str, Any] | None = None
    """The Lease spec to write (None for WAIT)."""
    observed: Observed | None = None
    """The observation to keep for the next round."""


def record_of(lease: dict[str, Any]) -> tuple[Any, ...]:
    """The parts of a Lease whose change shows that its holder is alive."""
    spec = lease.get("spec") or {}
    return (spec.get("holderIdentity") or "", spec.get("leaseDurationSeconds"), spec.get("acquireTime"),
            spec.get("renewTime"), spec.get("leaseTransitions"))


def decide(lease: dict[str, Any] | None, *, identity: str, observed: Observed | None, now: float,
           wall_now: str, lease_seconds: int) -> Decision:
    """What to do with `lease` (None when it does not exist yet).

    `now`: when the read of `lease` returned, by this process's monotonic clock. A changed record is
    dated then: a renewal seen in the answer may have happened at any time while the read was on its
    way, and only its return is surely after it (client-go sets observedTime after its Get too).
    `wall_now`: the current time as an RFC 3339 micro time, written into acquireTime/renewTime for
    people and tools reading the Lease.
    """
    if lease is None:
        return Decision(CREATE, {"holderIdentity": identity, "leaseDurationSeconds": lease_seconds,
                                 "acquireTime": wall_now, "renewTime": wall_now, "leaseTransitions": 0})
    spec = lease.get("spec") or {}
    record = record_of(lease)
    if observed is None or observed.record != record:
        observed = Observed(record, now)
    holder = spec.get("holderIdentity") or ""
    transitions = int(spec.get("leaseTransitions") or 0)
    if holder == identity:
        return Decision(RENEW, {**spec, "leaseDurationSeconds": lease_seconds, "renewTime": wall_now,
                                "acquireTime": spec.get("acquireTime") or wall_now}, observed)
    duration = int(spec.get("leaseDurationSeconds") or lease_seconds)
    if holder and now < observed.changed_at + duration:
        return Decision(WAIT, None, observed)
    return Decision(TAKE_OVER, {"holderIdentity": identity, "leaseDurationSeconds": lease_seconds,
                                "acquireTime": wall_now, "renewTime": wall_now,
                                "leaseTransitions": transitions + 1}, observed)


def released(spec: dict[str, Any], wall_now: str) -> dict[str, Any]:
    """The spec that hands the lease back at once (as client-go's ReleaseOnCancel writes it)."""
    return {**spec, "holderIdentity": "", "leaseDurationSeconds": 1, "renewTime": wall_now}
