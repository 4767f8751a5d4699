"""uninstall --check: which marked devices each removal step hands back to the scheduler (plugin/uninstall.py)."""

from __future__ import annotations

from typing import Any

import pytest

from claimwarden.health.records import RECORD_LABEL
from claimwarden.plugin.snapshot import Snapshot
from claimwarden.plugin.uninstall import (
    HANDED_OVER_LABEL,
    hand_over_name,
    hand_over_rules,
    plan,
    report,
    rule_keeps_off,
)

from .plugin_fixtures import DRIVER, claim, request, slice_

Obj = dict[str, Any]
NS = "claimwarden-system"


def record(name: str, device: str, *, effect: str = "NoExecute", pool: str = "n0") -> Obj:
    return {"metadata": {"name": name, "uid": f"uid-{name}"},
            "spec": {"driver": DRIVER, "pool": pool, "device": device, "effect": effect, "reason": "XID 79"}}


def quarantine(name: str, device: str) -> Obj:
    return claim(name, [request()], namespace=NS, allocated=[("n0", device)], labels={RECORD_LABEL: f"x-{device}"})


def rule(name: str, device: str | None, *, effect: str = "NoSchedule", owner: str | None = None,
         **selector: Any) -> Obj:
    meta: Obj = {"name": name}
    if owner:
        meta["ownerReferences"] = [{"apiVersion": "claimwarden.io/v1alpha1", "kind": "UnhealthyDevice",
                                    "name": owner, "uid": f"uid-{owner}", "controller": True}]
    fields = {"driver": DRIVER, "pool": "n0", "device": device} if device else {}
    return {"metadata": meta, "spec": {"deviceSelector": {**fields, **selector},
                                       "taint": {"key": "example.com/broken", "effect": effect}}}


def snapshot(records: list[Obj], claims: list[Obj] = (), rules: list[Obj] | None = None) -> Snapshot:  # type: ignore[assignment]
    return Snapshot(slices=[slice_("n0", "H100", "80Gi", count=4)], records=records, claims=list(claims),
                    taint_rules=rules)


def only(found: Any) -> Any:
    assert len(found.releases) == 1
    return found.releases[0]


def test_no_marks_release_nothing() -> None:
    found = plan(snapshot([record("dry", "gpu-0", effect="None")], rules=[]))
    assert found.releases == [] and found.freed == []
    assert report(found) == ["no marked devices: an uninstall releases nothing"]


def test_a_quarantine_claim_alone_goes_with_the_namespace() -> None:
    found = only(plan(snapshot([record("r0", "gpu-1")], [quarantine("q0", "gpu-1")])))
    assert found.device == (DRIVER, "n0", "gpu-1") and found.node == "n0"
    assert found.quarantine_claims == (f"{NS}/q0",)
    assert found.released_by == "namespace"


def test_claimwardens_rule_lasts_until_the_crds_go() -> None:
    found = only(plan(snapshot([record("r0", "gpu-1")], [quarantine("q0", "gpu-1")],
                               [rule("claimwarden-r0", "gpu-1", owner="r0")])))
    assert found.claimwarden_rules == ("claimwarden-r0",) and found.lasting_rules == ()
    assert found.released_by == "crds"


def test_a_rule_owned_by_no_record_outlives_the_uninstall() -> None:
    found = plan(snapshot([record("r0", "gpu-1")], [quarantine("q0", "gpu-1")],
                          [rule("handed-over", "gpu-1"), rule("other-device", "gpu-2")]))
    assert only(found).lasting_rules == ("handed-over",) and only(found).released_by is None
    assert found.freed == []


def test_other_holders_free_the_device_once_claimwarden_stops() -> None:
    user = claim("train", [request()], allocated=[("n0", "gpu-1")], reserved=["p"])
    found = only(plan(snapshot([record("r0", "gpu-1")], [user, quarantine("q0", "gpu-1")])))
    assert found.other_holders == ("ns/train",) and found.released_by == "claimwarden"


def test_a_mark_nothing_keeps_off_is_already_free() -> None:
    assert only(plan(snapshot([record("r0", "gpu-1", effect="NoSchedule")]))).released_by == "claimwarden"


def test_several_records_of_one_device_are_one_entry_naming_the_strongest_effect() -> None:
    found = only(plan(snapshot([record("b", "gpu-1", effect="NoSchedule"), record("a", "gpu-1")],
                               [quarantine("q0", "gpu-1")])))
    assert found.records == ("a", "b") and found.effect == "NoExecute"


@pytest.mark.parametrize(("taint_rule", "keeps"), [
    (rule("x", "gpu-1"), True),
    (rule("x", "gpu-1", effect="NoExecute"), True),
    (rule("x", "gpu-1", effect="None"), False),
    (rule("x", "gpu-2"), False),
    (rule("x", None), True),  # selects every device
    (rule("x", None, driver=DRIVER, pool="n0"), True),
    (rule("x", "gpu-1", deviceClassName="gpu"), False),  # not evaluated: not counted
    (rule("x", "gpu-1", selectors=[{"cel": {"expression": "true"}}]), False),
])
def test_which_rules_keep_a_device_off(taint_rule: Obj, keeps: bool) -> None:
    assert rule_keeps_off(taint_rule, (DRIVER, "n0", "gpu-1")) is keeps


def test_the_report_and_json_name_the_device_its_claim_and_the_step() -> None:
    found = plan(snapshot([record("r0", "gpu-1")], [quarantine("q0", "gpu-1")]))
    text = "\n".join(report(found))
    assert f"{DRIVER}/n0/gpu-1 (node n0): marked NoExecute (XID 79); record(s) r0" in text
    assert f"quarantine claim {NS}/q0" in text and "namespace is deleted" in text
    assert "serves no DeviceTaintRule" in text and text.endswith(
        "1 of 1 marked device(s) would go back to the scheduler; this cluster serves no DeviceTaintRule, so only "
        "repair or clearing the marks keeps them safe")
    data = found.as_dict()
    assert data["wouldRelease"] == 1 and data["taintRulesServed"] is False
    assert data["devices"] == [{"device": f"{DRIVER}/n0/gpu-1", "node": "n0", "effect": "NoExecute",
                                "reason": "XID 79", "records": ["r0"], "quarantineClaims": [f"{NS}/q0"],
                                "claimwardenTaintRules": [], "lastingTaintRules": [], "otherHolders": [],
                                "releasedBy": "namespace"}]


def test_hand_over_writes_one_unowned_noschedule_rule_per_device_not_yet_kept_off() -> None:
    found = plan(snapshot([record("r1", "gpu-1"), record("r2", "gpu-2", effect="NoSchedule")],
                          [quarantine("q1", "gpu-1")], [rule("theirs", "gpu-2"), rule("claimwarden-r1", "gpu-1",
                                                                                          owner="r1")]))
    rules = hand_over_rules(found, "resource.k8s.io/v1alpha3")
    assert len(rules) == 1  # gpu-2 is kept off by a rule of someone else's already
    body = rules[0]
    assert body["apiVersion"] == "resource.k8s.io/v1alpha3" and body["kind"] == "DeviceTaintRule"
    assert body["metadata"]["name"] == hand_over_name((DRIVER, "n0", "gpu-1"))
    assert body["metadata"]["name"].startswith("handed-over-n0.gpu-1.")
    assert body["metadata"]["labels"] == {HANDED_OVER_LABEL: "true"} and "ownerReferences" not in body["metadata"]
    assert body["metadata"]["annotations"] == {"claimwarden.io/device": f"{DRIVER}/n0/gpu-1",
                                               "claimwarden.io/reason": "NoExecute: XID 79"}
    assert body["spec"] == {"deviceSelector": {"driver": DRIVER, "pool": "n0", "device": "gpu-1"},
                            "taint": {"key": "claimwarden.io/unhealthy", "value": "unhealthy", "effect": "NoSchedule"}}
    # Once written, the rule is a lasting one: the device outlives the uninstall, and a second run writes nothing.
    again = plan(snapshot([record("r1", "gpu-1"), record("r2", "gpu-2", effect="NoSchedule")],
                          [quarantine("q1", "gpu-1")], [rule("theirs", "gpu-2"), body]))
    assert hand_over_rules(again, "resource.k8s.io/v1alpha3") == [] and again.freed == []
    assert [r.lasting_rules for r in again.releases] == [(body["metadata"]["name"],), ("theirs",)]
