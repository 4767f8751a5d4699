"""Which of a device's observations its record keeps (pure).

A reconcile collects the device's observations (level-based from the caches, pushed by the webhook).
Only what a rule of the device's policy matches is written to the record, with the healthy and unknown
side of a signal a rule watches (recovery and its hold are decided on them). The rest is remembered in
memory, unwritten, so that it is counted once, and looked at again on the next reconcile: a policy that
matches it may have come since. A record is created only for an Unhealthy observation a rule matched.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from . import policy
from .observations import HEALTHY, UNHEALTHY, UNKNOWN, Observation


@dataclass(frozen=True)
class Sorted:
    """A reconcile's observations, sorted."""

    fresh: list[Observation]
    """Seen for the first time (neither written nor remembered): counted and logged once."""
    kept: list[Observation]
    """To write to the record."""
    dropped: list[Observation]
    """To remember unwritten."""


def sort_observations(collected: Iterable[Observation], *, written: Sequence[Observation],
                      remembered: Sequence[Observation], device_policy: policy.Policy | None,
                      has_record: bool) -> Sorted:
    """`collected` against what the record holds (`written`) and what was remembered unwritten."""
    fresh = unique(o for o in collected if not is_present(o, [*written, *remembered]))
    candidates = unique(o for o in [*remembered, *fresh] if not is_present(o, written))
    kept = [o for o in candidates if is_kept(o, device_policy)]
    if not has_record:  # a record is made for an Unhealthy observation a rule matched, never for the rest
        kept = kept if any(o.state == UNHEALTHY for o in kept) else []
    return Sorted(fresh=fresh, kept=kept, dropped=[o for o in candidates if o not in kept])


def unique(found: Iterable[Observation]) -> list[Observation]:
    """Each (key, state) once, the first kept."""
    seen: set[tuple[str, str]] = set()
    kept = []
    for o in found:
        if (o.key, o.state) not in seen:
            seen.add((o.key, o.state))
            kept.append(o)
    return kept


def is_present(o: Observation, among: Iterable[Observation]) -> bool:
    return any(o.key == other.key and o.state == other.state for other in among)


def is_kept(o: Observation, device_policy: policy.Policy | None) -> bool:
    """Written to the record: a rule of the device's policy matches it, or it is the healthy or unknown side of
    a signal a rule watches (a taint removed, Healthy after Unhealthy, Unknown: recovery and its hold are decided
    on them, whatever values the rule names)."""
    if device_policy is None:
        return False
    if any(rule.matches(o) for rule in device_policy.rules):
        return True
    return o.state in (HEALTHY, UNKNOWN) and any(rule.source == o.source and rule.signal == o.signal
                                                 for rule in device_policy.rules)
