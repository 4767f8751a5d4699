"""The parts the signals controller is made of: the fleet view, what a record keeps, a record's lifetime."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from claimwarden.health.records import DeviceRef
from claimwarden.signals import decide, keeping, lifetime
from claimwarden.signals import observations as obs
from claimwarden.signals.fleet import FleetView
from claimwarden.signals.observations import Observation
from claimwarden.signals.policy import Policy, Recovery, Rule

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
XID = "gpu.nvidia.com/xid"
REF = DeviceRef("gpu.nvidia.com", "node-1", "gpu-0")
POLICY = Policy("gpu", rules=(Rule("xid", obs.SOURCE_TAINT, XID, ("79",), "NoExecute", "Enforce"),),
                recovery=Recovery(refault_window=timedelta(hours=1)))


def taint(value: str, state: str = obs.UNHEALTHY, at: datetime = T0) -> Observation:
    return Observation(obs.SOURCE_TAINT, XID, value, state, at, f"{XID}={value}/{state}@{obs.format_at(at)}")


def quiet(history: decide.History | None = None) -> decide.Decision:
    return decide.Decision(effect="None", would="None", policy="gpu", rule=None, mode="", why="", escalated=False,
                           recovered=False, workload_fault=False, drain=None, history=history or decide.History())


def test_the_fleet_view_forgets_a_signal_once_no_device_saw_it() -> None:
    fleet = FleetView()
    fleet.replace(REF, [taint("79"), taint("79", at=T0 + timedelta(seconds=5))])
    assert fleet.count(obs.SOURCE_TAINT, XID, "79", T0 + timedelta(seconds=1)) == 1  # the newest counts
    fleet.replace(REF, [taint("48")])
    assert fleet.count(obs.SOURCE_TAINT, XID, "79", T0) == 0
    assert fleet.devices(obs.SOURCE_TAINT, XID) == [REF]
    fleet.replace(REF, [])
    assert fleet.devices(obs.SOURCE_TAINT, XID) == []


def test_no_record_is_made_for_healthy_observations_alone() -> None:
    healthy = taint("", obs.HEALTHY)
    alone = keeping.sort_observations([healthy], written=[], remembered=[], device_policy=POLICY, has_record=False)
    assert alone.kept == [] and alone.dropped == [healthy] and alone.fresh == [healthy]
    on_record = keeping.sort_observations([healthy], written=[], remembered=[], device_policy=POLICY,
                                          has_record=True)
    assert on_record.kept == [healthy], "the removal of a watched taint: recovery needs it"


def test_what_was_remembered_is_written_once_a_policy_matches_it_and_counted_once() -> None:
    other = taint("48")
    first = keeping.sort_observations([other], written=[], remembered=[], device_policy=POLICY, has_record=True)
    assert first.dropped == [other] and first.fresh == [other]
    matching = Policy("gpu", rules=(Rule("any", obs.SOURCE_TAINT, XID, (), "NoSchedule", "Enforce"),))
    again = keeping.sort_observations([other], written=[], remembered=first.dropped, device_policy=matching,
                                      has_record=True)
    assert again.fresh == [] and again.kept == [other] and again.dropped == []


def test_a_quiet_record_is_deleted_after_the_refault_window_and_a_day_after_a_verified_clear() -> None:
    merged = [taint("79")]
    later = T0 + timedelta(hours=2)
    assert lifetime.is_done(merged, quiet(), POLICY, busy=False, moment=later)
    assert not lifetime.is_done(merged, quiet(), POLICY, busy=True, moment=later)
    assert not lifetime.is_done(merged, quiet(), POLICY, busy=False, moment=T0 + timedelta(minutes=30))
    cleared = quiet(decide.History(boundary=T0 + timedelta(hours=1)))
    assert not lifetime.is_done(merged, cleared, POLICY, busy=False, moment=later)
    assert lifetime.next_look(merged, cleared, POLICY, later, deletable=True) == lifetime.REQUEUE_MAX
    assert lifetime.is_done(merged, cleared, POLICY, busy=False, moment=later + lifetime.BOUNDARY_KEPT)
