"""A driver's device taint, through a HealthPolicy, evicts the device's pods (or, in shadow mode, only says so);
the taint's removal recovers the device (issue 21)."""

from __future__ import annotations

import time
from datetime import UTC, datetime

from kubernetes import client

from claimwarden_lab.cluster import LabState

from .health_helpers import device_of, events, holders, wait_gone
from .helpers import wait_for
from .operator import Operator
from .signals_helpers import (
    XID,
    apply_policy,
    counter_sum,
    decision,
    delete_policy,
    delete_signal_record,
    observed_record,
    record_writes,
    rule,
    run_pod,
    set_taints,
    signal_record,
)

POLICY = "taints"


def _xid(value: str) -> list[dict[str, str]]:
    # NoSchedule as NVIDIA's driver writes for a fatal XID: the scheduler keeps new pods away, nothing upstream
    # evicts the running ones (NoExecute would make kube-controller-manager delete them itself).
    return [{"key": XID, "value": value, "effect": "NoSchedule"}]


def test_enforced_taint_evicts_through_the_eviction_api_and_its_removal_recovers(
        signals_api: client.ApiClient, signals_operator: Operator, signals_namespace: str,
        signals_lab: LabState) -> None:
    api, namespace = signals_api, signals_namespace
    test_started = datetime.now(UTC)
    pool, device = run_pod(api, namespace, "victim")
    apply_policy(api, POLICY, [rule("fatal-xid", "DriverTaint", XID, values=["79"], effect="NoExecute")],
                 recovery={"healthyHold": "5s", "refaultWindow": "1h", "escalateTo": "NoExecute"})
    try:
        started = time.monotonic()
        set_taints(api, pool, device, _xid("79"))
        wait_gone(api, namespace, "victim", 60)
        evicted_after = time.monotonic() - started
        wait_for("the eviction's Event on victim (the Eviction API)",
                 lambda: events(api, namespace, "victim", "EvictedUnhealthyDevice"))
        record = observed_record(api, pool, device)
        assert record["spec"]["source"] == "signals" and record["spec"]["effect"] == "NoExecute"
        assert decision(record)["rule"] == "fatal-xid" and decision(record)["mode"] == "Enforce", record["status"]
        [observed] = record["status"]["observations"]
        assert (observed["source"], observed["signal"], observed["value"], observed["state"]) == (
            "DriverTaint", XID, "79", "Unhealthy")
        print(f"taint -> eviction: {evicted_after:.1f} s")

        # A new pod does not land on the device (the driver's NoSchedule and claimwarden's quarantine).
        run_pod(api, namespace, "next")
        assert device_of(api, namespace, "next") != (pool, device)

        set_taints(api, pool, device, [])
        recovered = wait_for("the record recovered", lambda: (
            r if (r := signal_record(api, pool, device)) and r["spec"]["effect"] == "None" else None))
        history = recovered["status"]["recovery"]
        assert history["clears"] and "markedSince" not in history, "the recovery is kept (a re-fault escalates)"
        wait_for("the device free again", lambda: not holders(api, pool, device), 60)
        metrics = signals_operator.metrics()
        assert counter_sum(metrics, "claimwarden_signal_recoveries_total", 'source="DriverTaint"') >= 1
        # No write loop: the signals wrote the record on each change only (created; status and spec marked; status
        # and spec recovered), the hand-off its status.recommendedAction twice (XID 79: NodeReboot, then None once
        # recovered), and the health controller its status a few times; a quiet record is not written.
        time.sleep(3)
        writes = record_writes(signals_lab.audit_log, pool, device, since=test_started)
        assert writes.count("create") == 1 and writes.count("patch") <= 2, writes
        assert len(writes) <= 14, writes
        print(f"writes to the signal record: {len(writes)} {writes}")
    finally:
        set_taints(api, pool, device, [])
        delete_policy(api, POLICY)
        delete_signal_record(api, pool, device)


def test_shadow_rule_records_what_it_would_do_and_evicts_nothing(
        signals_api: client.ApiClient, signals_operator: Operator, signals_namespace: str) -> None:
    api, namespace = signals_api, signals_namespace
    pool, device = run_pod(api, namespace, "spared")
    apply_policy(api, POLICY, [rule("fatal-xid", "DriverTaint", XID, effect="NoExecute", mode="Shadow")])
    try:
        set_taints(api, pool, device, _xid("48"))
        record = wait_for("the record counts the pod it would evict", lambda: (
            r if (r := signal_record(api, pool, device)) and (r.get("status") or {}).get("podsWouldEvict") == 1
            else None))
        assert record["spec"]["effect"] == "None"
        shown = decision(record)
        assert (shown["mode"], shown["would"], shown["effect"]) == ("Shadow", "NoExecute", "None"), shown
        time.sleep(3)
        core = client.CoreV1Api(api)
        assert core.read_namespaced_pod("spared", namespace).status.phase == "Running"
        assert not events(api, namespace, "spared", "EvictedUnhealthyDevice")
        assert counter_sum(signals_operator.metrics(), "claimwarden_policy_decisions_total",
                           f'policy="{POLICY}"', 'mode="Shadow"', 'effect="None"') >= 1
    finally:
        set_taints(api, pool, device, [])
        delete_policy(api, POLICY)
        delete_signal_record(api, pool, device)
