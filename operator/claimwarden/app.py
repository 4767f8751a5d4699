"""Kopf wiring only: settings, login, indices, events -> queues, start-up and clean-up.

Pods, claims and templates belong to others: they are only observed (``kopf.index`` and
``kopf.on.event``), so claimwarden never writes annotations or finalizers on them. Every event
just puts keys on a controller's queue; workers reconcile from the indices.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

import kopf
from kubernetes import client as sync_client

from . import __version__, metrics
from .cache import (
    CLAIM_BY_DEVICE,
    CLAIM_BY_OWNER,
    CLAIM_BY_PODGROUP,
    CLAIM_BY_RECORD,
    CLASS_INDEX,
    NODE_INDEX,
    POD_BY_CLAIM,
    POD_BY_PODGROUP,
    POD_BY_TEMPLATE,
    PODGROUP_BY_TEMPLATE,
    POLICY_INDEX,
    RECORD_BY_DEVICE,
    SLICE_BY_POOL,
    Cache,
    index_views,
)
from .claims import podgroups
from .claims.controller import ClaimsController
from .claims.podgroup_controller import PodGroupsController
from .handoff.controller import HandoffController, HandoffSettings
from .health import records
from .health.controller import HealthController, HealthSettings
from .health.plan import is_quarantine_claim, scheduler_retries_on_claim_deletion
from .kube.api import CONNECTION_POOL, Kube
from .kube.login import client_configuration, connection_info
from .leader.elector import ElectionSettings, Elector
from .objects import trimmed
from .objects.claims import allocated_devices, claim_source, controlling_pod_ref, controlling_pod_uid, is_allocated
from .objects.pods import has_claims, pod_claim_names
from .reservations.controller import ReservationsController
from .reservations.plan import is_near_limit, pod_may_release, reserved_for_predecessor
from .runtime import kopf_diffbase, kopf_private, kopf_toggles, readiness, server
from .runtime.operator import Runtime, lost_lease
from .signals.controller import SignalsController
from .signals.webhook import WebhookSettings
from .timestamps import now, parse_rfc3339

log = logging.getLogger("claimwarden")
T = TypeVar("T")

ALL_CONTROLLERS = ("claims", "reservations", "health", "metrics")
SERVICE_ACCOUNT_TOKEN = "/var/run/secrets/kubernetes.io/serviceaccount/token"
PODS = ("v1", "pods")
CLAIMS = ("resource.k8s.io", "v1", "resourceclaims")
TEMPLATES = ("resource.k8s.io", "v1", "resourceclaimtemplates")
SLICES = ("resource.k8s.io", "v1", "resourceslices")
RECORDS = (records.GROUP, records.VERSION, records.PLURAL)
POLICIES = (records.GROUP, "v1alpha1", "healthpolicies")
DEVICE_CLASSES = ("resource.k8s.io", "v1", "deviceclasses")
NODES = ("v1", "nodes")
INDEX_NAMES = ("pods", "claims", "templates_by_name")
HEALTH_INDEX_NAMES = ("slices_by_name", "device_records")
SIGNALS_INDEX_NAMES = (POLICY_INDEX, CLASS_INDEX, NODE_INDEX)
PODGROUP_INDEX_NAMES = ("pod_groups",)


@dataclass(frozen=True)
class RunSettings:
    """What `claimwarden run` was asked to do and what it found at start-up.

    Built once by `cli.py` and handed to the handlers in Kopf's memo (`run_settings_of`), as Kopf
    hands its own `OperatorSettings`; nothing changes it afterwards. It is not called `settings` in
    the memo because Kopf's handlers already take a `settings` keyword: Kopf's own.
    """

    controllers: tuple[str, ...]
    metrics_address: str
    metrics_port: int
    kubeconfig: str | None
    namespace: str
    workers: int
    request_timeout: float  # seconds per API request of the controllers (Kube)
    api_qps: float  # Kube's client-side budget (--kube-api-qps); 0 = no limit
    api_burst: int
    resync_seconds: float
    metrics_cache_seconds: float  # how long a computed gauge is served again (--metrics-cache-period)
    election: ElectionSettings | None  # None with --leader-elect=false: this process leads at once
    health: HealthSettings
    webhook: WebhookSettings | None = None  # Alertmanager's receiver (signals/webhook.py); None or not enabled: off
    handoff: HandoffSettings = field(default_factory=HandoffSettings)  # docs/guides/handoff-to-repair.md
    readiness: str = ""  # the /readyz URL to serve (runtime/server.py); "" serves none
    liveness: str = ""  # the /healthz URL to serve (runtime/server.py); "" serves none
    # Discovered from the server before Kopf starts (cli.py replaces these defaults):
    server_version: str = "unknown"
    podgroup_version: str | None = None  # the served scheduling.k8s.io version of PodGroups, None if none


def run_settings_of(memo: kopf.Memo) -> RunSettings:
    """The settings `cli.py` put in the memo that Kopf hands to every handler."""
    settings: RunSettings = memo["run_settings"]
    return settings


def in_cluster() -> bool:
    return bool(os.environ.get("KUBERNETES_SERVICE_HOST")) and os.path.exists(SERVICE_ACCOUNT_TOKEN)


def _client_configuration(kubeconfig: str | None) -> sync_client.Configuration:
    """The given kubeconfig, else in-cluster credentials when in a pod, else $KUBECONFIG or ~/.kube/config."""
    return client_configuration(kubeconfig, in_cluster() and not kubeconfig)


@kopf.on.login()
def login(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> kopf.ConnectionInfo:
    """One explicit login, so credentials never depend on which client libraries are installed."""
    configuration = _client_configuration(run_settings_of(memo).kubeconfig)
    return connection_info(configuration, settings.networking.trust_env)


# --- indices: small projections, keyed for the look-ups the controllers make -------------------

# Each Kopf index costs a handler invocation on every event of its kind, so each kind has one index
# whose keys are tagged by look-up: (namespace, name) -> the projection, (tag, ...) -> a reverse
# look-up. `cache.index_views` splits them again into the look-ups `Cache` reads.

@kopf.index(*PODS)
async def pods(namespace: str | None, name: str, body: kopf.Body, **_: Any) -> dict[Any, Any] | None:
    """(namespace, name) -> projection; ("claim", namespace, claim name) and ("template", namespace,
    template name) -> pod name: which pods use this claim or template? ("podgroup", namespace, PodGroup
    name) -> pod name: which pods with claims does this PodGroup have (1.36+)?"""
    namespace = namespace or ""
    plain = dict(body)
    if not has_claims(plain):
        return None
    keys: dict[Any, Any] = {(namespace, name): trimmed.pod(body)}
    for claim_name in pod_claim_names(plain):
        keys[(POD_BY_CLAIM, namespace, claim_name)] = name
    entries = (body.get("spec") or {}).get("resourceClaims") or []
    for entry in entries:
        if entry.get("resourceClaimTemplateName"):
            keys[(POD_BY_TEMPLATE, namespace, entry["resourceClaimTemplateName"])] = name
    group = podgroups.podgroup_name_of(plain) if entries else None
    if group is not None:
        keys[(POD_BY_PODGROUP, namespace, group)] = name
    return keys


@kopf.index(*CLAIMS)
async def claims(namespace: str | None, name: str, body: kopf.Body, labels: kopf.Labels,
                 **_: Any) -> dict[Any, Any]:
    """(namespace, name) -> projection; ("owner", namespace, controlling pod UID) -> claim name;
    ("device", driver, pool, device) -> (namespace, name); ("record", namespace, record label) -> claim name;
    ("podgroup", namespace, controlling PodGroup UID) -> claim name (1.36+)."""
    namespace = namespace or ""
    plain = dict(body)
    keys: dict[Any, Any] = {(namespace, name): trimmed.claim(body)}
    uid = controlling_pod_uid(plain)
    if uid:
        keys[(CLAIM_BY_OWNER, namespace, uid)] = name
    group_uid = podgroups.controlling_podgroup_uid(plain) if not uid else None
    if group_uid:
        keys[(CLAIM_BY_PODGROUP, namespace, group_uid)] = name
    for device in allocated_devices(plain):
        keys[(CLAIM_BY_DEVICE, *device)] = (namespace, name)
    label = labels.get(records.RECORD_LABEL)
    if label:
        keys[(CLAIM_BY_RECORD, namespace, label)] = name
    return keys


@kopf.index(*TEMPLATES)
async def templates_by_name(namespace: str | None, name: str, body: kopf.Body, **_: Any) -> dict[Any, Any]:
    namespace = namespace or ""
    return {(namespace, name): trimmed.template(body)}


async def slices_by_name(name: str, body: kopf.Body, **_: Any) -> dict[Any, Any]:
    """name -> projection; ("pool", driver, pool) -> slice name: which slices publish this pool (two while a
    driver re-creates its slice; a mark's record follows the one that carries the annotation)?"""
    projection = trimmed.resource_slice(body)
    spec = projection["spec"]
    keys: dict[Any, Any] = {name: projection}
    if spec.get("driver") and spec["pool"].get("name"):
        keys[(SLICE_BY_POOL, spec["driver"], spec["pool"]["name"])] = name
    return keys


async def health_policies(name: str, body: kopf.Body, **_: Any) -> dict[Any, Any]:
    """name -> projection: which HealthPolicies route devices (signals/policy.py Router)?"""
    return {name: trimmed.health_policy(body)}


async def device_classes(name: str, body: kopf.Body, **_: Any) -> dict[Any, Any]:
    """name -> projection (its CEL selectors): which devices does a HealthPolicy's deviceClassName name?"""
    return {name: trimmed.device_class(body)}


async def nodes_by_name(name: str, body: kopf.Body, **_: Any) -> dict[Any, Any]:
    """name -> projection (its conditions only): what do a device's node's conditions say?"""
    return {name: trimmed.node(body)}


async def device_records(name: str, body: kopf.Body, **_: Any) -> dict[Any, Any]:
    """name -> projection; ("device", driver, pool, device) -> record name: which records mark this
    device? (Asked on every claim and pod event; a scan of all records there made a burst of 1,000
    marks CPU-bound.)"""
    keys: dict[Any, Any] = {name: trimmed.record(body)}
    ref = records.record_ref(dict(body))
    if ref is not None:
        keys[(RECORD_BY_DEVICE, ref.driver, ref.pool, ref.device)] = name
    return keys


# --- events -> queues -----------------------------------------------------------------------

def _leading(memo: kopf.Memo) -> Runtime | None:
    """The runtime, once this replica leads; a standby's handlers queue nothing (its indices stay warm)."""
    runtime: Runtime | None = memo.get("runtime")
    return runtime if runtime is not None and runtime.leading else None


@kopf.on.event(*PODS)
async def pod_event(type: str | None, namespace: str | None, name: str, body: kopf.Body, memo: kopf.Memo,
                    **_: Any) -> None:
    """Queue only what may have work (the controllers' pre-checks): most pod events (the scheduler's
    conditions, the echo of our own status apply, kubelet updates) change nothing either would do."""
    namespace = namespace or ""
    runtime = _leading(memo)
    pod = dict(body)
    if runtime is None or not has_claims(pod):
        return
    deleted = type == "DELETED"
    uid = (pod.get("metadata") or {}).get("uid", "")
    if runtime.claims and (pod.get("spec") or {}).get("resourceClaims"):
        if deleted:
            runtime.claims.forget_pod(uid)  # and nothing to queue: the index no longer holds the pod
        else:
            runtime.claims.enqueue_if_needed(namespace, name)
    if runtime.health:
        runtime.health.enqueue_for_pod(namespace, pod)
    if runtime.signals:
        runtime.signals.enqueue_for_pod(pod, deleted=deleted)
    if runtime.reservations and deleted:
        runtime.reservations.note_deleted_pod(uid)
    if runtime.reservations:
        releasing = pod_may_release(pod, deleted=deleted)
        for claim_name in pod_claim_names(pod):
            claim = runtime.cache.claim(namespace, claim_name)
            if releasing or reserved_for_predecessor(claim, name, uid):
                shared = len(((claim or {}).get("status") or {}).get("reservedFor") or []) > 1
                runtime.reservations.enqueue_claim(namespace, claim_name, gather=shared)
        if releasing:
            for claim in runtime.cache.claims_owned_by(namespace, uid):
                runtime.reservations.enqueue_claim(namespace, claim["metadata"]["name"])


@kopf.on.event(*CLAIMS)
async def claim_event(type: str | None, namespace: str | None, name: str, body: kopf.Body, memo: kopf.Memo,
                      **_: Any) -> None:
    namespace = namespace or ""
    runtime = _leading(memo)
    if runtime is None:
        return
    if runtime.reservations:
        runtime.reservations.enqueue_claim(namespace, name)
    if runtime.health:
        runtime.health.enqueue_for_claim(namespace, name, dict(body), deleted=type == "DELETED")
    if runtime.claims:
        plain = dict(body)
        if type == "DELETED":
            runtime.claims.forget_deleted_claim(plain)
        pods = set(runtime.cache.pods_using_claim(namespace, name))
        owner = controlling_pod_ref(plain)
        if owner is not None:
            pods.add(owner["name"])  # usually the one pod that uses it: checked once
        for pod in sorted(pods):
            runtime.claims.enqueue_if_needed(namespace, pod)
    group_owner = podgroups.controlling_podgroup_ref(dict(body)) if runtime.podgroups is not None else None
    if group_owner is not None and runtime.podgroups is not None:
        runtime.podgroups.enqueue(namespace, group_owner["name"])
        if runtime.claims and type in ("ADDED", "DELETED", None):
            # Member pods record the group's claim once it exists (or look for a new one once it is gone).
            for pod in runtime.cache.pods_in_podgroup(namespace, group_owner["name"]):
                runtime.claims.enqueue_if_needed(namespace, pod)


async def slice_event(type: str | None, name: str, body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    runtime = _leading(memo)
    if runtime is not None and runtime.health is not None:
        runtime.health.enqueue_slice(name, dict(body))
    if runtime is not None and runtime.signals is not None:
        runtime.signals.enqueue_for_slice(name, dict(body), deleted=type == "DELETED")


async def record_event(name: str, body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    runtime = _leading(memo)
    if runtime is not None and runtime.health is not None:
        runtime.health.enqueue_record(name, dict(body))
    if runtime is not None and runtime.handoff is not None:
        runtime.handoff.enqueue(name)
    if runtime is not None and runtime.signals is not None:
        runtime.signals.enqueue_record(dict(body))


async def policy_event(type: str | None, name: str, body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    """A HealthPolicy changed: its status is looked at, and when its spec changed every device is routed again."""
    runtime = _leading(memo)
    if runtime is not None and runtime.signals is not None:
        runtime.signals.policy_event(name, body.get("metadata", {}).get("generation"), deleted=type == "DELETED")


async def device_class_event(memo: kopf.Memo, **_: Any) -> None:
    """A DeviceClass changed: every device with a record or a signal is routed again, every policy's status
    looked at (a policy naming a DeviceClass that was missing routes now)."""
    runtime = _leading(memo)
    if runtime is not None and runtime.signals is not None:
        runtime.signals.enqueue_all()


async def node_event(type: str | None, name: str, body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    runtime = _leading(memo)
    if runtime is not None and runtime.signals is not None:
        runtime.signals.enqueue_for_node(name, trimmed.node(body)["status"]["conditions"],
                                         deleted=type == "DELETED")


def register_health_handlers(*, signals: bool = True) -> None:
    """Watch slices and UnhealthyDevice records only when the health controller runs (its CRD may be absent);
    with `signals` (the HealthPolicy CRD is installed) also HealthPolicies, DeviceClasses and Nodes."""
    kopf.index(*SLICES)(slices_by_name)
    kopf.index(*RECORDS)(device_records)
    kopf.on.event(*SLICES)(slice_event)
    kopf.on.event(*RECORDS)(record_event)
    if signals:
        kopf.index(*POLICIES)(health_policies)
        kopf.index(*DEVICE_CLASSES)(device_classes)
        kopf.index(*NODES)(nodes_by_name)
        kopf.on.event(*POLICIES)(policy_event)
        kopf.on.event(*DEVICE_CLASSES)(device_class_event)
        kopf.on.event(*NODES)(node_event)


@kopf.on.event(*TEMPLATES)
async def template_event(namespace: str | None, name: str, memo: kopf.Memo, **_: Any) -> None:
    """Unlike upstream, a template that appears after its pods is noticed at once."""
    namespace = namespace or ""
    runtime = _leading(memo)
    if runtime is None or runtime.claims is None:
        return
    for pod in runtime.cache.pods_using_template(namespace, name):
        runtime.claims.enqueue_pod(namespace, pod)
    if runtime.podgroups is not None:
        for podgroup in runtime.cache.podgroups_using_template(namespace, name):
            runtime.podgroups.enqueue(namespace, podgroup)


# --- PodGroups: only where the cluster serves them (register_podgroup_handlers) -------------------

async def pod_groups(namespace: str | None, name: str, body: kopf.Body, **_: Any) -> dict[Any, Any]:
    """(namespace, name) -> projection; ("template", namespace, template) -> PodGroup name: which
    PodGroups wait for this template? (Their members and claims are in the pods and claims indices.)"""
    namespace = namespace or ""
    keys: dict[Any, Any] = {(namespace, name): trimmed.podgroup(body)}
    for entry in (body.get("spec") or {}).get("resourceClaims") or []:
        if entry.get("resourceClaimTemplateName"):
            keys[(PODGROUP_BY_TEMPLATE, namespace, entry["resourceClaimTemplateName"])] = name
    return keys


def _group_claim_names(podgroup: dict[str, Any], runtime: Runtime, namespace: str) -> set[str]:
    """Every claim a PodGroup may hold a reservation on: named in its spec or status, or controlled by it."""
    names = {str(e["resourceClaimName"]) for e in (podgroup.get("spec") or {}).get("resourceClaims") or []
             if e.get("resourceClaimName")}
    names |= {str(e["resourceClaimName"]) for e in podgroups.group_claim_statuses(podgroup).values()
              if e.get("resourceClaimName")}
    uid = (podgroup.get("metadata") or {}).get("uid", "")
    names |= {c["metadata"]["name"] for c in runtime.cache.claims_owned_by_podgroup(namespace, uid)}
    return names


async def podgroup_event(type: str | None, namespace: str | None, name: str, body: kopf.Body, memo: kopf.Memo,
                         **_: Any) -> None:
    namespace = namespace or ""
    runtime = _leading(memo)
    if runtime is None or not (body.get("spec") or {}).get("resourceClaims"):
        return
    if runtime.podgroups is not None:
        if type == "DELETED":
            runtime.podgroups.forget((body.get("metadata") or {}).get("uid", ""))
        runtime.podgroups.enqueue(namespace, name)
    deleting = type == "DELETED" or bool((body.get("metadata") or {}).get("deletionTimestamp"))
    if runtime.reservations is not None and deleting:
        for claim in _group_claim_names(dict(body), runtime, namespace):
            runtime.reservations.enqueue_claim(namespace, claim)
    if runtime.claims is not None:
        for pod in runtime.cache.pods_in_podgroup(namespace, name):
            runtime.claims.enqueue_pod(namespace, pod)


def register_podgroup_handlers(version: str) -> None:
    """Watch PodGroups at the served version; without PodGroups nothing of this is registered."""
    resource = (podgroups.GROUP, version, podgroups.PLURAL)
    kopf.index(*resource)(pod_groups)
    kopf.on.event(*resource)(podgroup_event)


# --- start-up and clean-up --------------------------------------------------------------------

@kopf.on.startup()
async def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, **kwargs: Any) -> None:
    apply_kopf_settings(settings)
    run_settings = run_settings_of(memo)
    kopf_diffbase.check_registry(kopf.get_default_registry())

    log.info("claimwarden %s connected to Kubernetes %s; controllers: %s; PodGroups: %s",
             __version__, run_settings.server_version, ",".join(run_settings.controllers),
             f"{podgroups.GROUP}/{run_settings.podgroup_version}" if run_settings.podgroup_version else "not served")

    cache = Cache(index_views({name: kwargs[name]
                               for name in (*INDEX_NAMES, *HEALTH_INDEX_NAMES, *SIGNALS_INDEX_NAMES,
                                            *PODGROUP_INDEX_NAMES)
                               if name in kwargs}))
    identity = run_settings.election.identity if run_settings.election else "standalone"
    kube = await Kube.connect(run_settings.kubeconfig, in_cluster() and not run_settings.kubeconfig,
                              request_timeout=run_settings.request_timeout,
                              user_agent=f"claimwarden/{__version__} ({identity})",
                              qps=run_settings.api_qps, burst=run_settings.api_burst,
                              # The claims' workers and the evictions' at once, each with its request.
                              connections=max(CONNECTION_POOL, run_settings.workers + run_settings.health.workers))
    runtime = Runtime(cache=cache, kube=kube, workers_per_queue=run_settings.workers,
                      resync_seconds=run_settings.resync_seconds, kopf_state=memo.kopf_state)
    if "claims" in run_settings.controllers:
        runtime.claims = ClaimsController(cache, kube)
        runtime.add_loop(runtime.claims.queue, runtime.claims.reconcile)
        if run_settings.podgroup_version is not None:
            claims = runtime.claims

            def members_record(namespace: str, podgroup: str) -> None:
                for pod in cache.pods_in_podgroup(namespace, podgroup):
                    claims.enqueue_pod(namespace, pod)

            runtime.podgroups = PodGroupsController(cache, kube, run_settings.podgroup_version,
                                                    on_claim=members_record)
            claims.podgroups = runtime.podgroups
            runtime.add_loop(runtime.podgroups.queue, runtime.podgroups.reconcile)
    if "health" in run_settings.controllers:
        runtime.health = HealthController(cache, kube, run_settings.namespace, replace(
            run_settings.health, claim_deletion_wakes_pods=scheduler_retries_on_claim_deletion(
                run_settings.server_version)))
        runtime.add_loop(runtime.health.slice_queue, runtime.health.marks.reconcile)
        runtime.add_loop(runtime.health.siblings.queue, runtime.health.siblings.reconcile)
        workers = run_settings.health.workers
        runtime.add_loop(runtime.health.record_queue, runtime.health.reconcile_record, workers)
        runtime.add_loop(runtime.health.eviction_queue, runtime.health.evictions.reconcile, workers)
        runtime.background.append(asyncio.create_task(
            runtime.health.unselective_rules.run(lambda: runtime.leading), name="taint-rule-selectors"))
        # Approvals count only while the approval policy is installed: known before the first record reconcile.
        try:
            await runtime.health.admission.refresh()
        except Exception as exc:  # retried every 15 s; until then no approval counts
            log.warning("reading the admission policies failed: %s; approvals are not honoured until they are read",
                        exc)
        runtime.background.append(asyncio.create_task(runtime.health.admission.run(), name="admission-policies"))
        if POLICY_INDEX in kwargs:  # signals run with health, where the HealthPolicy CRD is installed
            runtime.signals = SignalsController(cache=cache, kube=kube)
            runtime.add_loop(runtime.signals.queue, runtime.signals.reconcile, workers)
            runtime.add_loop(runtime.signals.statuses.queue, runtime.signals.statuses.reconcile, 1)
            await _start_webhook(run_settings, runtime, runtime.signals, memo)
        signals = runtime.signals
        runtime.handoff = HandoffController(cache=cache, kube=kube, settings=run_settings.handoff,
                                            on_cleared=signals.enqueue if signals is not None else None)
        if signals is not None:
            signals.repair_gate = runtime.handoff
        runtime.add_loop(runtime.handoff.queue, runtime.handoff.reconcile, workers)
    if "reservations" in run_settings.controllers:
        health = runtime.health
        runtime.reservations = ReservationsController(
            cache, kube, health.quarantined if health else None, podgroup_version=run_settings.podgroup_version,
            held=health.release_held if health else None, kept=health.keeps_allocation if health else None)
        runtime.add_loop(runtime.reservations.queue, runtime.reservations.reconcile)
    memo.runtime = runtime
    if run_settings.election is None:
        metrics.LEADER.set(1)
        await runtime.lead()
    else:
        # The lease gets connections of its own: behind a burst of evictions and records (64 workers on 32
        # pooled connections) a renewal once waited past the lease duration and fenced every write.
        # A renewal answered after the renew deadline leaves the leader no time to write: it gives up then.
        lease_kube = await Kube.connect(run_settings.kubeconfig, in_cluster() and not run_settings.kubeconfig,
                                        request_timeout=min(run_settings.request_timeout,
                                                            run_settings.election.renew_deadline_seconds),
                                        user_agent=f"claimwarden/{__version__} ({identity})")
        runtime.elector = Elector(lease_kube, run_settings.election, on_started=runtime.lead, on_lost=lost_lease)
        kube.fence = runtime.elector.write_time_left
        runtime.election = asyncio.create_task(runtime.elector.run(), name="leader-election")

    urls: dict[str, server.Handler] = {}
    if run_settings.liveness:
        async def probes() -> dict[str, Any]:
            return await kopf_private.run_probes(registry=kopf.get_default_registry(), settings=settings,
                                                 indexers=memo.kopf_state.indexers, memo=memo)

        urls[run_settings.liveness] = server.liveness_handler(probes)
    if run_settings.readiness:
        urls[run_settings.readiness] = server.readiness_handler(lambda: ready(runtime))
    if "metrics" in run_settings.controllers:
        # Scrapes run on this loop (server.py), between events. The gauges walk every claim (and slice
        # and record), so a result is reused for a while.
        def gauge(fn: Callable[[], T]) -> Callable[[], T]:
            return metrics.cached(metrics.guarded(fn), run_settings.metrics_cache_seconds)

        # The cluster's state is reported by the leader only, so that sums over replicas stay true.
        metrics.REGISTRY.register(metrics.ClaimCollector(
            gauge(lambda: _claim_samples(cache, run_settings.namespace) if runtime.leading else [])))
        health = runtime.health
        if health is not None:
            metrics.REGISTRY.register(metrics.DeviceCollector(
                gauge(lambda: health.device_samples() if runtime.leading else []),
                gauge(lambda: health.record_effects() if runtime.leading else []),
                gauge(lambda: health.pending_evictions() if runtime.leading else 0),
                gauge(lambda: health.unselective_taint_rules() if runtime.leading else None)))
        urls[server.metrics_url(run_settings.metrics_address, run_settings.metrics_port)] = \
            server.metrics_handler(metrics.REGISTRY)
    if urls:
        memo.server = await server.serve(urls, access_logged=[run_settings.liveness] if run_settings.liveness else [])


def ready(runtime: Runtime) -> readiness.Readiness:
    elector = runtime.elector
    return readiness.decide(indexed=kopf_toggles.indexed(), last_contact=elector.contacted_at if elector else None,
                            now=time.monotonic(), max_age=elector.settings.lease_seconds if elector else None)


async def _start_webhook(run_settings: RunSettings, runtime: Runtime, signals: SignalsController,
                         memo: kopf.Memo) -> None:
    """Alertmanager's receiver, when its settings enable it (a token file or a client CA); a standby answers 503."""
    settings = run_settings.webhook
    if settings is None or not settings.enabled:
        return
    from .signals import alerts, webhook

    def resolve(alert: alerts.Alert) -> records.DeviceRef | None:
        return alerts.resolve_device(alert, runtime.cache.resource_slices())

    memo.webhook = await webhook.serve(settings, signals.observe, resolve, lambda: runtime.leading)
    log.info("Alertmanager webhook on %s:%d", settings.address, settings.port)


def apply_kopf_settings(settings: kopf.OperatorSettings) -> None:
    """Kopf's settings for claimwarden (the in-process measurements of the hot path use them too)."""
    settings.scanning.disabled = True
    settings.posting.level = logging.WARNING
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix="claimwarden.io")
    # Only index and on.event handlers are registered (checked in configure): no diff-base per event.
    settings.persistence.diffbase_storage = kopf_diffbase.NullDiffBaseStorage()
    settings.persistence.finalizer = "claimwarden.io/finalizer"
    settings.networking.request_timeout = 60
    settings.networking.connect_timeout = 10
    settings.watching.chunk_size = 500


def _claim_samples(cache: Cache, namespace: str) -> list[metrics.ClaimSample]:
    samples = []
    current = now()
    for claim in cache.claims():
        reserved = len((claim.get("status") or {}).get("reservedFor") or [])
        state = "reserved" if reserved else "allocated" if is_allocated(claim) else "pending"
        source = "quarantine" if is_quarantine_claim(claim, namespace) else claim_source(claim)
        created = parse_rfc3339(claim["metadata"].get("creationTimestamp")) if state == "pending" else None
        age = max(0.0, (current - created).total_seconds()) if created else 0.0
        samples.append(metrics.ClaimSample(state, source, is_near_limit(reserved), age))
    return samples


@kopf.on.cleanup()
async def cleanup(memo: kopf.Memo, **_: Any) -> None:
    runtime: Runtime | None = memo.get("runtime")
    receiver = memo.get("webhook")
    if receiver is not None:
        await receiver.stop()
    if runtime is not None:
        await runtime.drain()
        await runtime.kube.close()
        if runtime.elector is not None and runtime.elector.kube is not runtime.kube:
            await runtime.elector.kube.close()
    if memo.get("server") is not None:
        await memo.server.cleanup()
    log.info("claimwarden stopped")
    _exit_unless_ended(EXIT_AFTER_CLEANUP)


EXIT_AFTER_CLEANUP = 30.0
"""Seconds after the clean-up by which the process has ended. On a signal Kopf ends it at once. When
Kopf's orchestrator failed instead (a watched API version no longer served, after an upgrade: the
watch of it fails), one of its watchers may go on waiting to re-authenticate, and the process stayed
up with no controller running (seen in the lab on 1.37.2); exiting gets it restarted, and the restart
discovers the versions served now."""


def _exit_unless_ended(seconds: float) -> None:
    def exit_now() -> None:
        log.error("Kopf had not ended the process %g s after the clean-up; exiting", seconds)
        logging.shutdown()
        os._exit(1)

    timer = threading.Timer(seconds, exit_now)
    timer.daemon = True  # an ordinary end of the process does not wait for it
    timer.start()


@kopf.on.probe(id="version")
def probe_version(**_: Any) -> str:
    return __version__


def records_crd_installed(*, kubeconfig: str | None, plural: str = records.PLURAL) -> bool:
    configuration = _client_configuration(kubeconfig)
    with sync_client.ApiClient(configuration) as api:
        try:
            sync_client.CustomObjectsApi(api).list_cluster_custom_object(
                records.GROUP, records.VERSION, plural, limit=1)
        except sync_client.ApiException as exc:
            if exc.status == 404:
                return False
            raise
    return True


def served_podgroup_version(*, kubeconfig: str | None) -> str | None:
    """The newest scheduling.k8s.io version under which the server serves PodGroups (discovery), or None.

    Decided by what the server serves, not by its version: 1.36 serves v1alpha2 and 1.37 v1alpha3 and,
    with --runtime-config, v1beta1 (upstream's controller uses v1beta1 there); none without the
    GenericWorkload gate.
    """
    configuration = _client_configuration(kubeconfig)
    with sync_client.ApiClient(configuration) as api:
        for version in podgroups.VERSIONS:
            try:
                resources = sync_client.CustomObjectsApi(api).get_api_resources(podgroups.GROUP, version)
            except sync_client.ApiException as exc:
                if exc.status == 404:
                    continue
                raise
            if any(r.name == podgroups.PLURAL for r in resources.resources or []):
                return version
    return None


def server_version(*, kubeconfig: str | None) -> str:
    """One synchronous GET /version at start-up: proves the credentials work before watching."""
    configuration = _client_configuration(kubeconfig)
    with sync_client.ApiClient(configuration) as api:
        info = sync_client.VersionApi(api).get_code()
    return str(info.git_version)
