"""The signal record's name, status shape and patches (signals/records.py, signals/keeping.py,
signals/record_writes.py)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from claimwarden.health.records import DeviceRef, record_name
from claimwarden.objects import trimmed
from claimwarden.signals import decide, policy
from claimwarden.signals import records as signal_records
from claimwarden.signals.keeping import is_kept as _kept
from claimwarden.signals.observations import Observation
from claimwarden.signals.record_writes import status_patch as _patch

REF = DeviceRef("gpu.example.com", "node-1", "gpu-0")
T0 = datetime(2026, 1, 1, tzinfo=UTC)
RULES = {"metadata": {"name": "p"}, "spec": {"rules": [
    {"name": "xid", "source": "DriverTaint", "signal": "gpu.example.com/xid", "values": ["79"],
     "effect": "NoExecute", "mode": "Enforce"}]}}


def _taint(state: str, at: datetime, value: str = "79") -> Observation:
    key = f"gpu.example.com/xid={value}@{at.isoformat()}" if state == "Unhealthy" else f"xid removed@{at.isoformat()}"
    return Observation("DriverTaint", "gpu.example.com/xid", value, state, at, key)


def _policy() -> policy.Policy:
    parsed, errors = policy.parse_policy(RULES)
    assert parsed is not None, errors
    return parsed


def test_the_signal_record_is_another_object_than_the_annotation_record_of_the_device() -> None:
    name = signal_records.signal_record_name(REF)
    assert name != record_name(REF) and name.startswith("node-1.gpu-0.")
    body = signal_records.record_body(REF, {"effect": "None", "reason": "r", "drain": "Immediate"})
    assert signal_records.is_signal_record(body) and body["metadata"]["labels"] == {"claimwarden.io/source": "signals"}


def test_deciding_again_on_the_same_observations_gives_the_same_status() -> None:
    """No write loop: decision.at stays while the decision does."""
    observed = [_taint("Unhealthy", T0)]
    first = decide.decide(_policy(), observed, decide.History(), lambda *_: 1, T0 + timedelta(seconds=1))
    status = signal_records.desired_status(observed, first, {}, T0 + timedelta(seconds=1))
    stored = signal_records.record_history({"status": status})
    again = decide.decide(_policy(), observed, stored, lambda *_: 1, T0 + timedelta(seconds=9))
    assert signal_records.desired_status(observed, again, status, T0 + timedelta(seconds=9)) == status


def test_a_recovered_mark_patch_removes_marked_since_and_rule() -> None:
    """A merge patch merges nested objects: without explicit nulls the recovered history kept markedSince and
    the next decision re-marked the device (seen in the lab before the fix)."""
    observed = [_taint("Unhealthy", T0)]
    marked = decide.decide(_policy(), observed, decide.History(), lambda *_: 1, T0 + timedelta(seconds=1))
    before = signal_records.desired_status(observed, marked, {}, T0 + timedelta(seconds=1))
    assert "markedSince" in before["recovery"]
    observed.append(_taint("Healthy", T0 + timedelta(seconds=2)))
    recovered = decide.decide(_policy(), observed, marked.history, lambda *_: 1, T0 + timedelta(seconds=3))
    assert recovered.effect == "None" and recovered.recovered
    after = signal_records.desired_status(observed, recovered, before, T0 + timedelta(seconds=3))
    patch = _patch(before, after)
    assert patch["recovery"]["markedSince"] is None and patch["recovery"]["rule"] is None
    merged = {k: v for k, v in {**before["recovery"], **patch["recovery"]}.items() if v is not None}
    assert signal_records.record_history({"status": {"recovery": merged}}).marked_since is None


def test_only_what_a_rule_watches_is_written() -> None:
    rules = _policy()
    assert _kept(_taint("Unhealthy", T0), rules)
    assert not _kept(_taint("Unhealthy", T0, value="13"), rules), "another value: no rule matches it"
    assert _kept(_taint("Healthy", T0, value="13"), rules), "the removal of a watched key: recovery needs it"
    assert not _kept(Observation("DriverTaint", "other/key", "", "Healthy", T0, "k"), rules)
    assert not _kept(_taint("Unhealthy", T0), None), "no policy routes the device"


def test_a_verified_clear_in_bad_form_is_reported() -> None:
    at, problem = signal_records.verified_at({"metadata": {"annotations": {signal_records.VERIFIED_ANNOTATION: "x"}}})
    assert at is None and "RFC 3339" in problem
    at, problem = signal_records.verified_at(
        {"metadata": {"annotations": {signal_records.VERIFIED_ANNOTATION: "2026-01-01T00:00:00Z"}}})
    assert at == T0 and problem == ""


def test_the_pod_projection_keeps_only_the_device_health_of_container_statuses() -> None:
    health = [{"name": "claim:gpu",
               "resources": [{"resourceID": "gpu.example.com/node-1/gpu-0", "health": "Unhealthy"}]}]
    pod = {"metadata": {"name": "p", "namespace": "n", "uid": "u"}, "spec": {"resourceClaims": [{"name": "gpu"}]},
           "status": {"phase": "Running", "containerStatuses": [
               {"name": "a", "image": "x", "ready": True, "allocatedResourcesStatus": health},
               {"name": "b", "image": "y", "ready": True}]}}
    projected = trimmed.pod(pod)
    assert projected["status"]["containerStatuses"] == [{"name": "a", "allocatedResourcesStatus": health}]
    assert "initContainerStatuses" not in projected["status"]
    del pod["status"]["containerStatuses"]
    assert "containerStatuses" not in trimmed.pod(pod)["status"]


def test_the_slice_projection_keeps_taints_attributes_and_the_pool_count() -> None:
    taint = {"key": "gpu.example.com/xid", "value": "79", "effect": "NoSchedule", "timeAdded": "2026-01-01T00:00:00Z"}
    slice_ = {"metadata": {"name": "s"}, "spec": {"driver": "d", "nodeName": "n", "pool": {
        "name": "n", "generation": 2, "resourceSliceCount": 1}, "devices": [
        {"name": "gpu-0", "attributes": {"uuid": {"string": "GPU-1"}}, "taints": [taint], "bindsToNode": True}]}}
    projected = trimmed.resource_slice(slice_)
    assert projected["spec"]["pool"]["resourceSliceCount"] == 1
    assert projected["spec"]["devices"] == [{"name": "gpu-0", "attributes": {"uuid": {"string": "GPU-1"}},
                                             "taints": [taint]}]


def test_a_persons_mark_never_takes_over_the_signal_record() -> None:
    from claimwarden.plugin.marking import plan_mark
    from claimwarden.plugin.snapshot import Snapshot

    signal = signal_records.record_body(REF, {"effect": "None", "reason": "shadow", "drain": "Immediate"})
    snapshot = Snapshot(records=[signal])
    planned = plan_mark(snapshot, REF, reason="ECC", effect="NoExecute", expires_at=None)
    assert planned.create is not None and planned.create["metadata"]["name"] == record_name(REF)
    manual = planned.create
    both = Snapshot(records=[signal, manual])
    assert both.records_by_device[(REF.driver, REF.pool, REF.device)] is manual
    assert Snapshot(records=[manual, signal]).records_by_device[(REF.driver, REF.pool, REF.device)] is manual
