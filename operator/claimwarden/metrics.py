"""Prometheus metrics: their names, and the collectors that compute gauges at scrape time.

Names are ``claimwarden_*`` in base units; no per-pod or per-claim labels (kube-state-metrics owns
per-object series).

The gauges are computed at scrape time from Kopf's indices, which the operator's event loop changes as
events arrive. `runtime/server.py` serves ``/metrics`` on that same loop, so a scrape reads the indices
between two events: iterating them cannot fail with "dictionary changed size during iteration" (as it
did when prometheus_client served scrapes from a thread of its own). A gauge whose callback fails is left
out of that scrape (`guarded`) and counted in ``claimwarden_scrape_errors_total``; the others are served.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from importlib.metadata import version
from typing import TypeVar

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from . import __version__

log = logging.getLogger("claimwarden.metrics")
T = TypeVar("T")

REGISTRY = CollectorRegistry(auto_describe=True)

BUILD_INFO = Gauge("claimwarden_build_info", "Always 1; labels carry the versions claimwarden runs with.",
                   ["version", "kopf_version", "kubernetes_client_version"], registry=REGISTRY)
BUILD_INFO.labels(__version__, version("kopf"), version("kubernetes")).set(1)

RECONCILE_TOTAL = Counter("claimwarden_reconcile_total", "Reconciles by controller and result "
                          "(success, error, requeue).", ["controller", "result"], registry=REGISTRY)
RECONCILE_DURATION = Histogram("claimwarden_reconcile_duration_seconds", "Time one reconcile took.",
                               ["controller"], registry=REGISTRY,
                               buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30))
WORKQUEUE_DEPTH = Gauge("claimwarden_workqueue_depth", "Keys waiting in a controller's queue.", ["controller"],
                        registry=REGISTRY)
WORKQUEUE_IN_FLIGHT = Gauge("claimwarden_workqueue_in_flight", "Keys a controller's workers are reconciling now.",
                            ["controller"], registry=REGISTRY)
WORKQUEUE_ADDS = Counter("claimwarden_workqueue_adds_total", "Keys added to a controller's queue.", ["controller"],
                         registry=REGISTRY)
WORKQUEUE_RETRIES = Counter("claimwarden_workqueue_retries_total", "Keys re-queued after a failed reconcile.",
                            ["controller"], registry=REGISTRY)

LEADER = Gauge("claimwarden_leader", "1 while this replica holds the leader lease and runs the controllers, "
               "else 0.", registry=REGISTRY)
LEADER_TRANSITIONS = Counter("claimwarden_leader_transitions_total", "Times this replica became the leader.",
                             registry=REGISTRY)

CLAIM_CREATIONS = Counter("claimwarden_claim_creations_total", "ResourceClaims created from templates, by "
                          "result (success, failure).", ["result"], registry=REGISTRY)
RESERVATIONS_ADDED = Counter("claimwarden_reservations_added_total", "Pods added to status.reservedFor for "
                             "pods bound to a node without the scheduler.", registry=REGISTRY)
RESERVATIONS_REMOVED = Counter("claimwarden_reservations_removed_total", "Entries removed from "
                               "status.reservedFor because their pod was gone, replaced or finished.",
                               registry=REGISTRY)
DEALLOCATIONS = Counter("claimwarden_deallocations_total", "Claims whose allocation claimwarden cleared, "
                        "freeing their devices.", registry=REGISTRY)
CLAIM_DELETIONS = Counter("claimwarden_claim_deletions_total", "Generated claims deleted because their pod "
                          "finished.", registry=REGISTRY)
EVICTIONS = Counter("claimwarden_evictions_total", "Eviction attempts for pods on unhealthy devices, by result "
                    "(evicted, pdb_blocked, throttled, gone, error).", ["result"], registry=REGISTRY)
EVICTION_LATENCY = Histogram("claimwarden_eviction_latency_seconds", "Time from a device being marked unhealthy "
                             "to one of its pods being evicted.", registry=REGISTRY,
                             buckets=(0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800))
EVICTION_BREAKER_OPEN = Gauge("claimwarden_eviction_breaker_open", "1 while the eviction breaker of a driver is "
                              "open: its NoExecute marks would evict, together with the evictions of the last "
                              "window, more pods than the limit.", ["driver"], registry=REGISTRY)
EVICTIONS_DEFERRED = Counter("claimwarden_evictions_deferred_total", "Evictions held back before the Eviction API "
                             "call, by reason (breaker: no room is left in the eviction breaker's window, counted "
                             "each time a record's pods or one pod right before its call are held back; "
                             "budget: the eviction budget has no token yet).", ["reason"], registry=REGISTRY)
ADMISSION_POLICY = Gauge("claimwarden_admission_policy_installed", "1 while the ValidatingAdmissionPolicy and a "
                         "binding that denies are installed (claimwarden-approval: approvals are honoured only "
                         "then; claimwarden-marking: optional, limits who may mark), read every 15 s.", ["policy"],
                         registry=REGISTRY)
APPROVALS_IGNORED = Counter("claimwarden_approvals_ignored_total", "Records whose approval claimwarden found it may "
                            "not honour, by reason (ApprovalPolicyMissing, ApprovalStale, ApprovalIncomplete); "
                            "counted once each time a record's approval turns so.", ["reason"], registry=REGISTRY)
SIGNAL_OBSERVATIONS = Counter("claimwarden_signal_observations_total", "New observations of device health "
                              "signals, by source (DriverTaint, PodStatus, Alertmanager, NodeCondition) and state "
                              "(Unhealthy, Healthy, Unknown), written to a record or not.", ["source", "state"],
                              registry=REGISTRY)
SIGNAL_UNMATCHED = Counter("claimwarden_signal_unmatched_total", "New observations that no rule of the device's "
                           "HealthPolicy matches (or no policy routes the device): counted, not written.",
                           ["source"], registry=REGISTRY)
SIGNAL_UNKNOWN = Counter("claimwarden_signal_unknown_total", "KEP-4680 health Unknown seen for a device: the "
                         "kubelet lost the signal; never acted on.", ["driver"], registry=REGISTRY)
POLICY_DECISIONS = Counter("claimwarden_policy_decisions_total", "A signal record's deciding rule, effect or mode "
                           "changed (mode Shadow: what the rule would do is in status.decision.would).",
                           ["policy", "rule", "effect", "mode"], registry=REGISTRY)
WORKLOAD_FAULTS = Counter("claimwarden_workload_faults_total", "Faults not marked because the same signal was seen "
                          "on too many devices (the rule's workloadFault): a workload's fault, not hardware.",
                          ["policy", "rule"], registry=REGISTRY)
SIGNAL_ORPHANED = Counter("claimwarden_signal_marks_orphaned_total", "Signal marks whose policy or rule went away (a "
                          "policy edited or deleted, a DeviceClass or CEL selector that no longer matches): the mark "
                          "holds until a person's clear --verified.", registry=REGISTRY)
SIGNAL_RECOVERIES = Counter("claimwarden_signal_recoveries_total", "Signal marks cleared, by the source of the "
                            "healthy signal (DriverTaint, PodStatus; verified: a person's clear --verified).",
                            ["source"], registry=REGISTRY)
SIGNAL_ESCALATIONS = Counter("claimwarden_signal_escalations_total", "Signal marks escalated by a re-fault within "
                             "the policy's refaultWindow; only a verified clear recovers them.", registry=REGISTRY)
WEBHOOK_REQUESTS = Counter("claimwarden_webhook_requests_total", "Calls to the Alertmanager webhook, by the HTTP "
                           "status answered (200, 400 malformed, 401 unauthenticated, 413 too large, 429 over the "
                           "rate, 503 standby or not written).", ["code"], registry=REGISTRY)
WEBHOOK_ALERTS = Counter("claimwarden_webhook_alerts_total", "Alerts the webhook received, by result (observed: "
                         "handed to its device's record; duplicate: seen within the hour; resolved: ignored, "
                         "resolving is not recovery; unresolved_device: no device found from its labels; "
                         "rate_limited: refused with 429).", ["result"], registry=REGISTRY)
REPAIR_RECOMMENDED = Gauge("claimwarden_repair_recommended", "UnhealthyDevice records by the repair they recommend "
                           "(status.recommendedAction: None, GpuReset, NodeReboot, Drain).", ["action"],
                           registry=REGISTRY)
REPAIR_REQUESTS = Counter("claimwarden_repair_requests_total", "NVSentinel ExternalFaults claimwarden created for "
                          "node-scoped faults, by result (created, error).", ["result"], registry=REGISTRY)
SCRAPE_ERRORS = Counter("claimwarden_scrape_errors_total", "Gauges left out of a scrape because computing them "
                        "failed.", registry=REGISTRY)


class ScrapeFailed(Exception):
    """A gauge's callback failed; the collector leaves the gauge out of this scrape."""


def guarded(fn: Callable[[], T]) -> Callable[[], T]:
    """Wrap ``fn`` so that a failure is counted, logged and raised as ScrapeFailed (the gauge is left out)."""

    def call() -> T:
        try:
            return fn()
        except Exception as exc:
            why = f"{type(exc).__name__}: {exc}"
        SCRAPE_ERRORS.inc()
        log.warning("metrics: %s left out of this scrape: %s", getattr(fn, "__name__", "a gauge"), why)
        raise ScrapeFailed(why)

    return call


def cached(fn: Callable[[], T], seconds: float) -> Callable[[], T]:
    """Wrap ``fn`` so that its result is reused for ``seconds``: gauges computed by walking every claim,
    slice or record then cost that walk at most once per period, however often Prometheus scrapes
    (a restart at 5,000 claims spent a seventh of its CPU in scrapes). A failure is not reused.
    0 computes on every call. (Scrapes run on the event loop, one at a time: no lock is needed.)"""
    last: list[tuple[float, T]] = []

    def call() -> T:
        now = time.monotonic()
        if last and now - last[0][0] < seconds:
            return last[0][1]
        value = fn()
        last[:] = [(now, value)]
        return value

    return call


@dataclass(frozen=True)
class ClaimSample:
    state: str  # pending, allocated, reserved
    source: str  # resource_claim_template, extended_resource, user, quarantine
    near_limit: bool
    pending_seconds: float = 0.0  # since creation, for a pending claim (a generated claim is pending from birth)


class ClaimCollector(Collector):
    """Claim gauges computed from the claim cache at scrape time (no per-claim series)."""

    def __init__(self, claims: Callable[[], Iterable[ClaimSample]]) -> None:
        self._claims = claims

    def collect(self) -> Iterable[GaugeMetricFamily]:
        try:
            claims = list(self._claims())
        except ScrapeFailed:
            return
        by_state = GaugeMetricFamily("claimwarden_resource_claims", "ResourceClaims by state (pending, "
                                     "allocated, reserved) and source (resource_claim_template, "
                                     "extended_resource, user, quarantine).", labels=["state", "source"])
        near = GaugeMetricFamily("claimwarden_claims_near_reservation_limit", "Claims with at least 90% of "
                                 "the 256 status.reservedFor entries in use.")
        oldest = GaugeMetricFamily("claimwarden_claims_pending_longest_seconds", "Age of the oldest pending "
                                   "claim, by source (0 when none is pending).", labels=["source"])
        counts: dict[tuple[str, str], int] = {}
        longest: dict[str, float] = {}
        near_limit = 0
        for sample in claims:
            counts[(sample.state, sample.source)] = counts.get((sample.state, sample.source), 0) + 1
            longest.setdefault(sample.source, 0.0)
            if sample.state == "pending":
                longest[sample.source] = max(longest[sample.source], sample.pending_seconds)
            near_limit += sample.near_limit
        for (state, source), count in sorted(counts.items()):
            by_state.add_metric([state, source], count)
        for source, seconds in sorted(longest.items()):
            oldest.add_metric([source], round(seconds, 1))
        near.add_metric([], near_limit)
        yield by_state
        yield near
        yield oldest

    def describe(self) -> Iterable[GaugeMetricFamily]:
        return []


@dataclass(frozen=True)
class DeviceSample:
    driver: str
    state: str  # free, allocated, tainted


class DeviceCollector(Collector):
    """Device gauges from the slice, claim and record caches at scrape time."""

    def __init__(self, devices: Callable[[], Iterable[DeviceSample]], records: Callable[[], Iterable[str]],
                 pending: Callable[[], int], unselective_rules: Callable[[], int | None] = lambda: None) -> None:
        self._devices = devices
        self._records = records
        self._pending = pending
        self._unselective_rules = unselective_rules

    def collect(self) -> Iterable[GaugeMetricFamily]:
        """Each gauge on its own: one that cannot be computed now is left out, the others are served."""
        try:
            devices = list(self._devices())
        except ScrapeFailed:
            pass
        else:
            by_state = GaugeMetricFamily("claimwarden_devices", "Devices the ResourceSlices publish, by driver "
                                         "and state (free, allocated, tainted: marked unhealthy with NoExecute "
                                         "or NoSchedule).", labels=["driver", "state"])
            counts: dict[tuple[str, str], int] = {}
            for sample in devices:
                counts[(sample.driver, sample.state)] = counts.get((sample.driver, sample.state), 0) + 1
            for (driver, state), count in sorted(counts.items()):
                by_state.add_metric([driver, state], count)
            yield by_state
        try:
            records = list(self._records())
        except ScrapeFailed:
            pass
        else:
            marked = GaugeMetricFamily("claimwarden_unhealthy_devices", "UnhealthyDevice records by effect.",
                                       labels=["effect"])
            effects: dict[str, int] = {"NoExecute": 0, "NoSchedule": 0, "None": 0}
            for effect in records:
                effects[effect] = effects.get(effect, 0) + 1
            for effect, count in sorted(effects.items()):
                marked.add_metric([effect], count)
            yield marked
        try:
            pending_pods = self._pending()
        except ScrapeFailed:
            pass
        else:
            pending = GaugeMetricFamily("claimwarden_eviction_pending_pods", "Pods still on a device marked "
                                        "unhealthy with NoExecute, waiting to be evicted (for example blocked by "
                                        "a PodDisruptionBudget).")
            pending.add_metric([], pending_pods)
            yield pending
        try:
            unselective = self._unselective_rules()
        except ScrapeFailed:
            unselective = None
        if unselective is not None:  # absent where DeviceTaintRule is not served (health/taint_rules.py)
            rules = GaugeMetricFamily("claimwarden_device_taint_rules_unselective", "DeviceTaintRules with an "
                                      "empty or omitted deviceSelector: they taint every device.")
            rules.add_metric([], unselective)
            yield rules

    def describe(self) -> Iterable[GaugeMetricFamily]:
        return []
