"""Drain modes: Immediate, AllowCompletion and EvictAfter=<duration>, with pods that finish and pods
that do not (docs/concepts/safety.md "Drain modes"). kwok plays the kubelet, so a pod "finishes" when the test sets
its phase to Succeeded, as a kubelet would."""

from __future__ import annotations

import time
from typing import Any

from kubernetes import client

from .health_helpers import PREFIX, annotate, device_of, events, holders, record_for, slice_of, wait_gone
from .helpers import wait_for
from .operator import Operator
from .test_health_eviction import _running, _start

DRAIN = "drain.claimwarden.io/"


def _mark(api: client.ApiClient, pool: str, device: str, reason: str, drain: str | None) -> str:
    """The drain annotation and the mark in one patch, as a careful admin would set them."""
    name = slice_of(api, pool)
    annotate(api, name, {DRAIN + device: drain, PREFIX + device: reason})
    return name


def _unmark(api: client.ApiClient, pool: str, device: str) -> None:
    annotate(api, slice_of(api, pool), {DRAIN + device: None, PREFIX + device: None})


def _finish(api: client.ApiClient, namespace: str, pod: str) -> None:
    client.CoreV1Api(api).patch_namespaced_pod_status(pod, namespace, {"status": {"phase": "Succeeded"}})


def _condition(record: dict[str, Any] | None, kind: str) -> dict[str, Any] | None:
    conditions = ((record or {}).get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c["type"] == kind), None)


def _status(api: client.ApiClient, pool: str, device: str) -> dict[str, Any]:
    return dict((record_for(api, pool, device) or {}).get("status") or {})


def test_allow_completion_lets_pods_finish_evicts_none_and_takes_no_new_work(
        api: client.ApiClient, namespace: str, claimwarden: Operator) -> None:
    core = client.CoreV1Api(api)
    _start(api, namespace, "finisher", "runner")
    devices = {pod: device_of(api, namespace, pod) for pod in ("finisher", "runner")}
    for pool, device in devices.values():
        _mark(api, pool, device, "flaky, let the jobs finish", "AllowCompletion")
    try:
        for pod, (pool, device) in devices.items():
            record = wait_for(f"{pod}'s record waiting for completion", lambda pool=pool, device=device: (
                r if (c := _condition(r := record_for(api, pool, device), "Evicting")) and
                c["reason"] == "WaitingForCompletion" else None))
            assert record["spec"]["drain"] == "AllowCompletion" and record["status"]["podsPending"] == 1
            assert "may run to completion" in _condition(record, "Evicting")["message"]  # type: ignore[index]
            # The running pod's claim keeps new work off the device until the quarantine claim takes over.
            wait_for("the device held", lambda pool=pool, device=device: (c := _condition(
                record_for(api, pool, device), "Quarantined")) and c["reason"] == "HeldByClaims")

        _finish(api, namespace, "finisher")
        wait_for("the finished pod no longer pending", lambda: _status(api, *devices["finisher"]).get(
            "podsPending") == 0)
        wait_for("the finished pod's device held by the quarantine claim alone", lambda: (
            found := holders(api, *devices["finisher"])) and all(h.startswith("claimwarden-system/") for h in found))
        assert _condition(record_for(api, *devices["finisher"]), "Evicting")["reason"] == "Completed"  # type: ignore[index]
        time.sleep(3)
        assert _running(core, namespace, "runner")
        assert _status(api, *devices["runner"])["podsPending"] == 1
        for pod in ("finisher", "runner"):
            assert not events(api, namespace, pod, "EvictedUnhealthyDevice")
        assert core.read_namespaced_pod("finisher", namespace).status.phase == "Succeeded"
    finally:
        for pool, device in devices.values():
            _unmark(api, pool, device)


def test_evict_after_waits_for_the_deadline_then_evicts_what_did_not_finish(
        api: client.ApiClient, namespace: str, claimwarden: Operator) -> None:
    core = client.CoreV1Api(api)
    _start(api, namespace, "quick", "slow")
    devices = {pod: device_of(api, namespace, pod) for pod in ("quick", "slow")}
    marked = time.monotonic()
    for pool, device in devices.values():
        _mark(api, pool, device, "retire after the batch", "EvictAfter=10s")
    try:
        waiting = wait_for("slow waits for its deadline", lambda: (
            c if (c := _condition(record_for(api, *devices["slow"]), "Evicting")) and
            c["reason"] == "WaitingForDeadline" else None))
        assert "then they are evicted" in waiting["message"]
        _finish(api, namespace, "quick")
        time.sleep(max(0.0, 6 - (time.monotonic() - marked)))
        assert _running(core, namespace, "slow"), "evicted before its deadline"
        wait_gone(api, namespace, "slow", 30)
        elapsed = time.monotonic() - marked
        assert elapsed >= 9, f"evicted {elapsed:.1f} s after marking, before EvictAfter=10s"
        wait_for("slow's eviction Event", lambda: events(api, namespace, "slow", "EvictedUnhealthyDevice"))
        assert not events(api, namespace, "quick", "EvictedUnhealthyDevice")
        assert core.read_namespaced_pod("quick", namespace).status.phase == "Succeeded"
        wait_for("podsEvicted 1", lambda: _status(api, *devices["slow"]).get("podsEvicted") == 1)
        assert _status(api, *devices["quick"]).get("podsEvicted") == 0
    finally:
        for pool, device in devices.values():
            _unmark(api, pool, device)


def test_a_bad_drain_annotation_is_refused_and_immediate_evicts_at_once(
        api: client.ApiClient, namespace: str, claimwarden: Operator) -> None:
    _start(api, namespace, "pod")
    pool, device = device_of(api, namespace, "pod")
    slice_name = _mark(api, pool, device, "ECC errors", "EvictAfter=2d")
    try:
        [warning] = wait_for("a Warning event on the slice", lambda: [
            e for e in events(api, "default", slice_name, "InvalidUnhealthyMark") if DRAIN + device in e.message], 30)
        assert warning.type == "Warning"
        assert "'EvictAfter=2d' is not a drain mode; use Immediate, AllowCompletion, Node or EvictAfter=<duration>" in \
            warning.message
        time.sleep(3)
        assert record_for(api, pool, device) is None
        assert _running(client.CoreV1Api(api), namespace, "pod")

        annotate(api, slice_name, {DRAIN + device: "Immediate"})
        wait_gone(api, namespace, "pod")
        assert (record_for(api, pool, device) or {})["spec"]["drain"] == "Immediate"
    finally:
        _unmark(api, pool, device)
