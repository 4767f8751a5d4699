"""When a record's first status waits for its device to change hands, and what its Quarantined condition
says meanwhile (health/record_status.py)."""

from __future__ import annotations

from claimwarden.health.plan import RecordPlan
from claimwarden.health.record_status import quarantined as _quarantined
from claimwarden.health.record_status import settling as _settling


def _plan(**kwargs: object) -> RecordPlan:
    return RecordPlan(quarantine_needed=True, exclusive_holders=("ns/claim",), holders=("ns/claim",),
                      **kwargs)  # type: ignore[arg-type]


def test_the_first_status_waits_while_the_pods_are_evicted_and_their_claims_let_go() -> None:
    assert _settling(_plan(pending=1), evicting_now=True, held_back=False)
    assert _settling(_plan(pending=0), evicting_now=False, held_back=False)  # evicted, releasing


def test_the_first_status_goes_out_at_once_when_nothing_is_changing_hands_soon() -> None:
    # Evictions held back by a PodDisruptionBudget or the breaker: the status says so now.
    assert not _settling(_plan(pending=1), evicting_now=True, held_back=True)
    assert not _settling(_plan(pending=1), evicting_now=True, held_back=True)
    # Evictions due later (a drain deadline, tolerationSeconds) or never (AllowCompletion).
    assert not _settling(_plan(pending=1), evicting_now=False, held_back=False)
    # Nothing to quarantine, or nothing holding the device.
    assert not _settling(RecordPlan(), evicting_now=True, held_back=False)
    assert not _settling(RecordPlan(quarantine_needed=True), evicting_now=False, held_back=False)


def test_the_quarantined_condition_names_what_holds_the_device() -> None:
    assert _quarantined("NoExecute", ["q-1"], _plan()) == ("True", "QuarantineClaimAllocated", "held by q-1")
    held = _quarantined("NoExecute", [], _plan())
    assert held[:2] == ("True", "HeldByClaims") and "ns/claim" in held[2]
    assert _quarantined("NoExecute", [], RecordPlan(quarantine_needed=True))[:2] == ("False", "QuarantinePending")
    assert _quarantined("None", [], RecordPlan())[:2] == ("False", "NotQuarantined")
