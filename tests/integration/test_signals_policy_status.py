"""A HealthPolicy's status says how claimwarden read it, and `kubectl get healthpolicies` shows it: the rule
counts, Accepted (False with the reason in words), the generation read; written only when it changes."""

from __future__ import annotations

import json
import time
from typing import Any

from kubernetes import client

from claimwarden_lab.cluster import LabState

from .health_helpers import GROUP, VERSION
from .helpers import kubectl, wait_for
from .operator import Operator
from .signals_helpers import POLICIES, XID, apply_policy, delete_policy, rule

ELSEWHERE = ["status.example.com"]  # a driver no lab device has: these policies route no device of other tests


def _policy(api: client.ApiClient, name: str) -> dict[str, Any]:
    found: dict[str, Any] = client.CustomObjectsApi(api).get_cluster_custom_object(GROUP, VERSION, POLICIES, name)
    return found


def _read(api: client.ApiClient, name: str, generation: int) -> dict[str, Any] | None:
    """The policy's status once it says what generation `generation` holds."""
    status = _policy(api, name).get("status") or {}
    return status if status.get("observedGeneration") == generation else None


def _columns(lab: LabState, name: str) -> dict[str, str]:
    header, row = kubectl(lab.bin_dir, str(lab.kubeconfig), "get", POLICIES, name).splitlines()
    return dict(zip(header.split(), row.split(), strict=False))


def _status_writes(lab: LabState, name: str) -> int:
    count = 0
    for line in lab.audit_log.read_text().splitlines():
        entry = json.loads(line)
        ref = entry.get("objectRef") or {}
        if entry.get("stage", "ResponseComplete") == "ResponseComplete" and ref.get("resource") == POLICIES and \
                ref.get("name") == name and ref.get("subresource") == "status" and entry.get("verb") == "patch" \
                and "claimwarden" in (entry.get("user") or {}).get("username", ""):
            count += 1
    return count


def test_the_policy_status_says_how_it_was_read_and_the_columns_show_it(
        signals_api: client.ApiClient, signals_operator: Operator, signals_lab: LabState) -> None:
    api = signals_api
    apply_policy(api, "status-good", [rule("fatal", "DriverTaint", XID, values=["79"]),
                                      rule("watch", "DriverTaint", XID, mode="Shadow")], drivers=ELSEWHERE)
    apply_policy(api, "status-classless", [rule("fatal", "DriverTaint", XID)], drivers=ELSEWHERE,
                 deviceClassName="no-such-class")
    try:
        good = wait_for("status-good's status", lambda: _read(api, "status-good", 1))
        assert (good["rules"], good["enforced"]) == (2, 1)
        [accepted] = good["conditions"]
        assert (accepted["type"], accepted["status"], accepted["reason"], accepted["message"]) == (
            "Accepted", "True", "Accepted", "2 rules, 1 enforced")
        assert _columns(signals_lab, "status-good") | {"AGE": ""} == {
            "NAME": "status-good", "PRIORITY": "0", "RULES": "2", "ENFORCED": "1", "ACCEPTED": "True", "AGE": ""}

        classless = wait_for("status-classless's status", lambda: _read(api, "status-classless", 1))
        [refused] = classless["conditions"]
        assert (refused["status"], refused["reason"], refused["message"]) == (
            "False", "NotRoutable", "DeviceClass no-such-class does not exist")
        assert _columns(signals_lab, "status-classless")["ACCEPTED"] == "False"

        # A new spec: a new generation, read again; the transition time stays (still Accepted).
        client.CustomObjectsApi(api).patch_cluster_custom_object(GROUP, VERSION, POLICIES, "status-good", {
            "spec": {"rules": [rule("fatal", "DriverTaint", XID, values=["79"])]}})
        again = wait_for("status-good's second generation", lambda: _read(api, "status-good", 2))
        assert (again["rules"], again["enforced"]) == (1, 1)
        assert again["conditions"][0]["lastTransitionTime"] == accepted["lastTransitionTime"]
        time.sleep(3)  # what our own writes bring back must write nothing more
        assert _status_writes(signals_lab, "status-good") == 2
        assert _status_writes(signals_lab, "status-classless") == 1
    finally:
        delete_policy(api, "status-good")
        delete_policy(api, "status-classless")
