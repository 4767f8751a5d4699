"""explain's funnel and verdict, doctor's findings, devices and mark/clear planning, on plain dicts."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from claimwarden.plugin import devices as devices_mod
from claimwarden.plugin import doctor, marking
from claimwarden.plugin.explain import explain_claim, explain_pod
from claimwarden.plugin.snapshot import Snapshot

from .plugin_fixtures import DRIVER, claim, cluster, pod, request

MODEL = 'device.attributes["gpu.example.com"].model == "{}"'


def explain(snapshot: Snapshot, *claims: dict, **pod_spec: object):  # type: ignore[no-untyped-def, type-arg]
    snapshot.claims += list(claims)
    target = pod("p", [c["metadata"]["name"] for c in claims], **pod_spec)  # type: ignore[arg-type]
    snapshot.pods.append(target)
    return explain_pod(snapshot, target)


def test_allocatable_names_the_nodes() -> None:
    verdict = explain(cluster(), claim("c", [request(selectors=[MODEL.format("A100")])])).verdict
    assert verdict.allocatable and verdict.nodes == ["node-1"]


@pytest.mark.parametrize(("requests", "step"), [
    ([request(selectors=[MODEL.format("B100")])], "selectors"),
    ([request(count=9)], "count"),
    ([request(count=33)], "count"),
    ([{"name": "gpu", "exactly": {"deviceClassName": "missing", "count": 1}}], "class"),
    ([request(selectors=['device.attributes["gpu.example.com"].nope'])], "error"),
])
def test_blocked_steps(requests: list[dict], step: str) -> None:  # type: ignore[type-arg]
    verdict = explain(cluster(), claim("c", requests)).verdict
    assert not verdict.allocatable and verdict.step == step, verdict.reason


def test_held_devices_name_the_holder_and_its_pods() -> None:
    snapshot = cluster(nodes=1, devices=2)
    snapshot.claims.append(claim("holder", [request(count=2)], allocated=[("node-0", "gpu-0"), ("node-0", "gpu-1")],
                                 reserved=["trainer"]))
    explanation = explain(snapshot, claim("c", [request()]))
    assert explanation.verdict.step == "allocated"
    assert "ns/holder (pods ns/trainer)" in explanation.verdict.reason


def test_a_quarantine_claim_is_named_as_such() -> None:
    snapshot = cluster(nodes=1, devices=1)
    snapshot.claims.append(claim("q", [request()], namespace="claimwarden-system",
                                 labels={"claimwarden.io/record": "r"}, allocated=[("node-0", "gpu-0")]))
    assert "(quarantine claim)" in explain(snapshot, claim("c", [request()])).verdict.reason


def test_first_available_falls_back_and_match_attribute_constrains() -> None:
    fallback = {"name": "gpu", "firstAvailable": [
        {"name": "b100", "deviceClassName": DRIVER, "count": 1,
         "selectors": [{"cel": {"expression": MODEL.format("B100")}}]},
        {"name": "l4", "deviceClassName": DRIVER, "count": 1,
         "selectors": [{"cel": {"expression": MODEL.format("L4")}}]}]}
    assert explain(cluster(), claim("c", [fallback])).verdict.nodes == ["node-2"]
    constrained = claim("d", [request(count=2)], constraints=[{"matchAttribute": f"{DRIVER}/index"}])
    assert explain(cluster(), constrained).verdict.step == "constraints"


def test_taints_and_tolerations() -> None:
    snapshot = cluster(nodes=1, devices=1)
    snapshot.slices[0]["spec"]["devices"][0]["taints"] = [{"key": "k", "value": "v", "effect": "NoSchedule"}]
    assert explain(snapshot, claim("c", [request()])).verdict.step == "taints"
    snapshot = cluster(nodes=1, devices=1)
    snapshot.taint_rules = [{"metadata": {"name": "r"}, "spec": {"deviceSelector": {"device": "gpu-0"},
                                                                  "taint": {"key": "k", "effect": "NoSchedule"}}}]
    tolerated = request(tolerations=[{"key": "k", "operator": "Exists"}])
    assert explain(snapshot, claim("c", [tolerated])).verdict.allocatable


def test_pod_node_selector_and_node_taints() -> None:
    verdict = explain(cluster(), claim("c", [request(selectors=[MODEL.format("H100")])]),
                      nodeSelector={"kubernetes.io/hostname": "node-1"}).verdict
    assert verdict.step == "nodes"
    snapshot = cluster(nodes=1)
    snapshot.nodes[0]["spec"]["taints"] = [{"key": "gpu", "effect": "NoSchedule"}]
    assert explain(snapshot, claim("c", [request()])).verdict.step == "nodes"


def test_an_allocated_claim_shows_devices_and_reservations() -> None:
    snapshot = cluster(nodes=1)
    allocated = claim("c", [request()], allocated=[("node-0", "gpu-3")], reserved=["p"])
    snapshot.claims.append(allocated)
    explanation = explain_claim(snapshot, allocated)
    assert explanation.verdict.allocated and "node-0/gpu-3" in explanation.verdict.reason
    assert explanation.claims[0].reserved_for == ["pods/p"]


NOW = datetime(2026, 1, 1, 1, 0, tzinfo=UTC)


def test_doctor_finds_each_condition() -> None:
    snapshot = cluster(nodes=1)
    snapshot.now = NOW
    snapshot.pods = [pod("alive", ["x"], node_name="node-0", phase="Running"),
                     pod("waiting", ["nothing-fits"])]
    snapshot.claims = [
        claim("leaked", [request()], allocated=[("node-0", "gpu-0")], owner_pod=("alive", "uid-alive")),
        claim("stale", [request()], allocated=[("node-0", "gpu-1")], reserved=["ghost"]),
        claim("orphan", [request()], owner_pod=("gone", "uid-gone")),
        claim("nothing-fits", [request(count=9)]),
        claim("busy", [request()], allocated=[("node-0", "gpu-2")], reserved=["alive"]),
        claim("crowded", [request()], reserved=[f"p{i}" for i in range(doctor.NEAR_LIMIT)]),
    ]
    stuck = claim("stuck", [request()])
    stuck["metadata"].update(deletionTimestamp="2026-01-01T00:00:00Z", finalizers=["example.com/f"])
    snapshot.claims.append(stuck)
    snapshot.taint_rules = [{"metadata": {"name": "everything"}, "spec": {"taint": {"effect": "NoExecute"}}}]
    snapshot.records = [
        {"metadata": {"name": "busy"}, "spec": {"driver": DRIVER, "pool": "node-0", "device": "gpu-2",
                                                 "effect": "NoExecute", "reason": "xid"}},
        {"metadata": {"name": "ghost"}, "spec": {"driver": DRIVER, "pool": "node-9", "device": "gpu-0",
                                                  "effect": "NoExecute", "reason": "gone"}}]
    findings = doctor.check(snapshot, explain_reason=lambda p: explain_pod(snapshot, p).verdict.reason)
    checks = {f.check for f in findings}
    assert checks == {"leaked-device", "stale-reservation", "stuck-deletion", "orphaned-claim", "pending-pod",
                      "taint-rule-selects-all", "marked-device-has-pods", "record-without-device",
                      "reservation-limit"}, findings
    pending = next(f for f in findings if f.check == "pending-pod")
    assert "blocked by device taints" in pending.message and "DeviceTaintRule everything" in pending.message
    assert findings[0].severity == doctor.ERROR


def test_doctor_leaves_standalone_and_quarantine_claims_alone() -> None:
    snapshot = cluster(nodes=1)
    snapshot.claims = [claim("standalone", [request()], allocated=[("node-0", "gpu-0")]),
                       claim("q", [request()], namespace="claimwarden-system", labels={"claimwarden.io/record": "r"},
                             allocated=[("node-0", "gpu-1")], owner_pod=("x", "uid-x"))]
    snapshot.pods = [pod("x", [], node_name="node-0", phase="Running")]
    snapshot.pods[0]["metadata"]["namespace"] = "claimwarden-system"
    assert doctor.check(snapshot, thresholds=doctor.Thresholds(pending=timedelta(days=1))) == []


def test_devices_states_holders_and_filters() -> None:
    snapshot = cluster(nodes=2, devices=2)
    snapshot.claims = [claim("c", [request()], allocated=[("node-0", "gpu-0")], reserved=["trainer"]),
                       claim("q", [request()], namespace="claimwarden-system", labels={"claimwarden.io/record": "r"},
                             allocated=[("node-1", "gpu-1")])]
    snapshot.records = [{"metadata": {"name": "r"}, "spec": {"driver": DRIVER, "pool": "node-1", "device": "gpu-1",
                                                             "effect": "NoExecute", "reason": "xid"}}]
    rows = devices_mod.rows(snapshot)
    states = {(r.node, r.device): (r.state, r.holder) for r in rows}
    assert states[("node-0", "gpu-0")] == ("allocated", "ns/trainer")
    assert states[("node-1", "gpu-1")] == ("quarantined", "")
    assert states[("node-0", "gpu-1")] == ("free", "")
    picked = devices_mod.select(rows, snapshot, selector="model=A100,index!=0")
    assert [(r.node, r.device) for r in picked] == [("node-1", "gpu-1")]
    with pytest.raises(devices_mod.SelectorError):
        devices_mod.parse_selector("model=(H100")


def test_mark_and_clear_plans() -> None:
    snapshot = cluster(nodes=1, devices=2)
    ref = marking.resolve(snapshot, "node-0/gpu-1")
    assert marking.resolve(snapshot, f"{DRIVER}/node-0/gpu-1") == ref
    plan = marking.plan_mark(snapshot, ref, reason="xid 79", effect="NoSchedule", expires_at=None)
    assert plan.create is not None and plan.create["spec"]["source"] == "manual"
    with pytest.raises(marking.MarkError, match="no ResourceSlice"):
        marking.resolve(snapshot, "node-0/gpu-9")
    with pytest.raises(marking.MarkError, match="not marked"):
        marking.plan_clear(snapshot, ref)
    snapshot = cluster(nodes=1, devices=2)
    snapshot.records = [plan.create]
    assert marking.plan_clear(snapshot, ref).delete_record == plan.create["metadata"]["name"]
    assert marking.expiry("2h", NOW) == "2026-01-01T03:00:00Z"
    with pytest.raises(marking.MarkError):
        marking.expiry("tomorrow", NOW)


def test_mark_expires_reads_go_durations_as_every_other_flag_does() -> None:
    assert marking.expiry("1h30m", NOW) == "2026-01-01T02:30:00Z"
    assert marking.expiry("90s", NOW) == "2026-01-01T01:01:30Z"
    assert marking.expiry("2026-12-31T00:00:00Z", NOW) == "2026-12-31T00:00:00Z"
    assert marking.expiry(None, NOW) is None
    with pytest.raises(marking.MarkError, match="no days; write 168h"):
        marking.expiry("7d", NOW)
    for lapsed in ("0s", "0", "-1h", "-5m"):
        with pytest.raises(marking.MarkError, match="would lapse at once"):
            marking.expiry(lapsed, NOW)
