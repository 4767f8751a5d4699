"""plan.quarantine_step: when a record's device gets a quarantine claim (the quarantine trap, health/__init__.py)."""

from __future__ import annotations

import pytest

from claimwarden.health.plan import QuarantineStep, keeps_device_allocated, quarantine_step
from claimwarden.health.records import DeviceRef


@pytest.mark.parametrize("claims,held,released", [(0, False, False), (1, True, True), (2, False, False)])
def test_a_record_that_no_longer_quarantines_releases_whatever_it_holds(claims: int, held: bool,
                                                                         released: bool) -> None:
    assert quarantine_step(needed=False, claims=claims, held=held, released=released) == QuarantineStep.RELEASE


def test_a_device_held_by_the_pods_to_evict_gets_no_quarantine_claim_yet() -> None:
    assert quarantine_step(needed=True, claims=0, held=True, released=False) == QuarantineStep.WAIT


def test_a_free_device_is_quarantined_at_once() -> None:
    assert quarantine_step(needed=True, claims=0, held=False, released=False) == QuarantineStep.ASSERT


def test_the_last_holder_letting_go_brings_the_quarantine_claim() -> None:
    assert quarantine_step(needed=True, claims=0, held=False, released=True) == QuarantineStep.ASSERT


def test_a_holder_letting_go_while_others_still_hold_the_device_reasserts() -> None:
    # The scheduler forgets the device on any release, whoever else holds it (rule 1).
    assert quarantine_step(needed=True, claims=0, held=True, released=True) == QuarantineStep.ASSERT
    assert quarantine_step(needed=True, claims=1, held=True, released=True) == QuarantineStep.ASSERT


def test_one_claim_and_nobody_letting_go_is_kept() -> None:
    assert quarantine_step(needed=True, claims=1, held=False, released=False) == QuarantineStep.KEEP
    assert quarantine_step(needed=True, claims=1, held=True, released=False) == QuarantineStep.KEEP


def test_several_claims_left_by_a_crash_are_replaced_by_one() -> None:
    assert quarantine_step(needed=True, claims=2, held=False, released=False) == QuarantineStep.ASSERT


def _claim(**result: object) -> dict[str, object]:
    return {"metadata": {"namespace": "ns", "name": "c"}, "status": {"allocation": {"devices": {"results": [
        {"request": "gpu", "driver": "gpu.example.com", "pool": "node-0", "device": "gpu-0", **result}]}}}}


def test_only_claims_the_scheduler_counts_keep_a_device_from_new_work() -> None:
    ref = DeviceRef("gpu.example.com", "node-0", "gpu-0")
    assert keeps_device_allocated(_claim(), ref)
    # kube-scheduler counts neither admin-access results nor shared consumable-capacity ones as allocating
    # the device: a quarantine claim must not wait for them to let go.
    assert not keeps_device_allocated(_claim(adminAccess=True), ref)
    assert not keeps_device_allocated(_claim(shareID="9b1c0e2a-0000-4000-8000-000000000000"), ref)
    assert not keeps_device_allocated(_claim(), DeviceRef("gpu.example.com", "node-0", "gpu-1"))
