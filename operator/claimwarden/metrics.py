"""Prometheus metrics, served on their own port.

Names are ``claimwarden_*`` in base units; no per-pod or per-claim labels (kube-state-metrics owns
per-object series).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from importlib.metadata import version
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from . import __version__

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
WORKQUEUE_ADDS = Counter("claimwarden_workqueue_adds_total", "Keys added to a controller's queue.", ["controller"],
                         registry=REGISTRY)
WORKQUEUE_RETRIES = Counter("claimwarden_workqueue_retries_total", "Keys re-queued after a failed reconcile.",
                            ["controller"], registry=REGISTRY)

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
                    "(evicted, pdb_blocked, gone, error).", ["result"], registry=REGISTRY)
EVICTION_LATENCY = Histogram("claimwarden_eviction_latency_seconds", "Time from a device being marked unhealthy "
                             "to one of its pods being evicted.", registry=REGISTRY,
                             buckets=(0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800))


@dataclass(frozen=True)
class ClaimSample:
    state: str  # pending, allocated, reserved
    source: str  # resource_claim_template, extended_resource, user, quarantine
    near_limit: bool


class ClaimCollector(Collector):
    """Claim gauges computed from the claim cache at scrape time (no per-claim series)."""

    def __init__(self, claims: Callable[[], Iterable[ClaimSample]]) -> None:
        self._claims = claims

    def collect(self) -> Iterable[GaugeMetricFamily]:
        by_state = GaugeMetricFamily("claimwarden_resource_claims", "ResourceClaims by state (pending, "
                                     "allocated, reserved) and source (resource_claim_template, "
                                     "extended_resource, user, quarantine).", labels=["state", "source"])
        near = GaugeMetricFamily("claimwarden_claims_near_reservation_limit", "Claims with at least 90% of "
                                 "the 256 status.reservedFor entries in use.")
        counts: dict[tuple[str, str], int] = {}
        near_limit = 0
        for sample in self._claims():
            counts[(sample.state, sample.source)] = counts.get((sample.state, sample.source), 0) + 1
            near_limit += sample.near_limit
        for (state, source), count in sorted(counts.items()):
            by_state.add_metric([state, source], count)
        near.add_metric([], near_limit)
        yield by_state
        yield near

    def describe(self) -> Iterable[GaugeMetricFamily]:
        return []


@dataclass(frozen=True)
class DeviceSample:
    driver: str
    state: str  # free, allocated, tainted


class DeviceCollector(Collector):
    """Device gauges from the slice, claim and record caches at scrape time."""

    def __init__(self, devices: Callable[[], Iterable[DeviceSample]], records: Callable[[], Iterable[str]],
                 pending: Callable[[], int]) -> None:
        self._devices = devices
        self._records = records
        self._pending = pending

    def collect(self) -> Iterable[GaugeMetricFamily]:
        by_state = GaugeMetricFamily("claimwarden_devices", "Devices the ResourceSlices publish, by driver and "
                                     "state (free, allocated, tainted: marked unhealthy with NoExecute or "
                                     "NoSchedule).", labels=["driver", "state"])
        counts: dict[tuple[str, str], int] = {}
        for sample in self._devices():
            counts[(sample.driver, sample.state)] = counts.get((sample.driver, sample.state), 0) + 1
        for (driver, state), count in sorted(counts.items()):
            by_state.add_metric([driver, state], count)
        marked = GaugeMetricFamily("claimwarden_unhealthy_devices", "UnhealthyDevice records by effect.",
                                   labels=["effect"])
        effects: dict[str, int] = {"NoExecute": 0, "NoSchedule": 0, "None": 0}
        for effect in self._records():
            effects[effect] = effects.get(effect, 0) + 1
        for effect, count in sorted(effects.items()):
            marked.add_metric([effect], count)
        pending = GaugeMetricFamily("claimwarden_eviction_pending_pods", "Pods still on a device marked "
                                    "unhealthy with NoExecute, waiting to be evicted (for example blocked by a "
                                    "PodDisruptionBudget).")
        pending.add_metric([], self._pending())
        yield by_state
        yield marked
        yield pending

    def describe(self) -> Iterable[GaugeMetricFamily]:
        return []


def serve(address: str, port: int) -> WSGIServer:
    """Start the /metrics endpoint in a daemon thread; the caller shuts it down."""
    server, _thread = start_http_server(port, addr=address, registry=REGISTRY)
    return server
