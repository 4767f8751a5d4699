"""KEP-4680 device health in pod status (written through pods/status, as the kubelet does), through a
HealthPolicy: Unhealthy evicts, Unknown is counted and never acted on, Healthy for the hold recovers (issue 21)."""

from __future__ import annotations

import time

from kubernetes import client

from .health_helpers import device_of, events, wait_gone
from .helpers import wait_for
from .operator import Operator
from .signals_helpers import (
    DRIVER,
    apply_policy,
    counter,
    decision,
    delete_policy,
    delete_signal_record,
    observed_record,
    rule,
    run_pod,
    set_pod_health,
    signal_record,
)

POLICY = "pod-health"
SIGNAL = "allocatedResourcesStatus"


def test_unhealthy_evicts_and_unknown_is_only_counted(
        signals_api: client.ApiClient, signals_operator: Operator, signals_namespace: str) -> None:
    api, namespace = signals_api, signals_namespace
    pool, device = run_pod(api, namespace, "lost")
    other_pool, other = run_pod(api, namespace, "sick")
    apply_policy(api, POLICY, [rule("kubelet-unhealthy", "PodStatus", SIGNAL, values=["Unhealthy"],
                                    effect="NoExecute")])
    try:
        unknown_before = counter(signals_operator.metrics(), f'claimwarden_signal_unknown_total{{driver="{DRIVER}"}}')
        set_pod_health(api, namespace, "lost", pool, device, "Unknown")
        wait_for("Unknown counted", lambda: counter(signals_operator.metrics(),
                 f'claimwarden_signal_unknown_total{{driver="{DRIVER}"}}') > unknown_before)
        set_pod_health(api, namespace, "sick", other_pool, other, "Unhealthy")
        wait_gone(api, namespace, "sick", 60)
        wait_for("the eviction's Event on sick", lambda: events(api, namespace, "sick", "EvictedUnhealthyDevice"))
        record = observed_record(api, other_pool, other)
        assert decision(record)["rule"] == "kubelet-unhealthy" and record["spec"]["effect"] == "NoExecute"
        # Unknown: the signal was lost; nothing marks the device or evicts its pod.
        time.sleep(2)
        assert signal_record(api, pool, device) is None
        assert client.CoreV1Api(api).read_namespaced_pod("lost", namespace).status.phase == "Running"
    finally:
        delete_policy(api, POLICY)
        delete_signal_record(api, pool, device)
        delete_signal_record(api, other_pool, other)


def test_healthy_for_the_hold_recovers(
        signals_api: client.ApiClient, signals_operator: Operator, signals_namespace: str) -> None:
    api, namespace = signals_api, signals_namespace
    pool, device = run_pod(api, namespace, "flaky")
    # NoSchedule: the pod stays, so that it can report Healthy again.
    apply_policy(api, POLICY, [rule("kubelet-unhealthy", "PodStatus", SIGNAL, effect="NoSchedule")],
                 recovery={"healthyHold": "4s", "refaultWindow": "1h", "escalateTo": "NoExecute"})
    try:
        set_pod_health(api, namespace, "flaky", pool, device, "Unhealthy")
        wait_for("marked NoSchedule", lambda: (r := signal_record(api, pool, device)) is not None
                 and r["spec"]["effect"] == "NoSchedule")
        healthy_at = time.monotonic()
        set_pod_health(api, namespace, "flaky", pool, device, "Healthy")
        recovered = wait_for("recovered after the hold", lambda: (
            r if (r := signal_record(api, pool, device)) and r["spec"]["effect"] == "None" else None), 60)
        assert time.monotonic() - healthy_at >= 4, "not before the hold"
        history = recovered["status"]["recovery"]
        assert history["clears"] and "markedSince" not in history, recovered["status"]
        states = [o["state"] for o in recovered["status"]["observations"]]
        assert states[-2:] == ["Unhealthy", "Healthy"], states
        assert client.CoreV1Api(api).read_namespaced_pod("flaky", namespace).status.phase == "Running"
        assert device_of(api, namespace, "flaky") == (pool, device)
    finally:
        delete_policy(api, POLICY)
        delete_signal_record(api, pool, device)
