"""A signal record's lifetime: when it may be deleted, and when time alone may change its decision (pure).

A record is created only for an Unhealthy observation a rule matched. A recovered record stays (effect
None, its history kept, so that a re-fault escalates) and is deleted once its policy's refaultWindow has
passed without a new observation, nothing is signalled now (else the fault would come back as new,
without the record's history), and no person's verified clear is younger than ``BOUNDARY_KEPT``.
A record waiting for time to pass (a PodStatus healthy hold, its deletion) is looked at again then; a
held mark is not: only a change of its signals changes it.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta

from . import decide, policy
from .observations import Observation

REQUEUE_MAX = 300.0  # seconds between looks at a record that waits for time to pass (hold, deletion)
REQUEUE_MIN = 1.0
BOUNDARY_KEPT = timedelta(hours=24)
"""A record with a person's verified clear is kept this long after it: what it cleared (an alert sent again by
Alertmanager, older than the boundary) must not come back as new on a fresh record."""


def recovery_of(device_policy: policy.Policy | None) -> policy.Recovery:
    """The device's policy's recovery settings (the defaults for a device no policy routes)."""
    return device_policy.recovery if device_policy else policy.Recovery()


def is_done(merged: Sequence[Observation], decision: decide.Decision, device_policy: policy.Policy | None, *,
            busy: bool, moment: datetime) -> bool:
    """May the record be deleted? Only a recovered (or never marked) record with no observation for
    refaultWindow, no fault signalled now (`busy`: also when something was just added) and no verified clear
    within BOUNDARY_KEPT."""
    history = decision.history
    if busy or decision.effect != "None" or history.marked_since is not None or history.escalated:
        return False
    newest = max((o.at for o in merged), default=None)
    if newest is not None and moment - newest < recovery_of(device_policy).refault_window:
        return False
    # A verified clear is kept BOUNDARY_KEPT: an alert still firing is sent again (Alertmanager's
    # repeat_interval) and is older than the clear.
    return history.boundary is None or moment - history.boundary >= BOUNDARY_KEPT


def next_look(merged: Sequence[Observation], decision: decide.Decision, device_policy: policy.Policy | None,
              moment: datetime, *, deletable: bool) -> float | None:
    """Seconds until time alone may change the decision: a PodStatus hold running out, the record's deletion
    (only for a record that may be deleted: no mark held, no fault signalled now; else a change of its signals
    brings the device back, and a look every second at a held mark was a loop)."""
    recovery = recovery_of(device_policy)
    waits: list[timedelta] = []
    if decision.recheck_at is not None:
        waits.append(decision.recheck_at - moment)
    newest = max((o.at for o in merged), default=None)
    history = decision.history
    if deletable and newest is not None and decision.effect == "None" and history.marked_since is None \
            and not history.escalated:
        deletion = newest + recovery.refault_window
        if history.boundary is not None:
            deletion = max(deletion, history.boundary + BOUNDARY_KEPT)
        waits.append(deletion - moment)
    if not waits:
        return None
    return min(max(min(waits).total_seconds(), REQUEUE_MIN), REQUEUE_MAX)
