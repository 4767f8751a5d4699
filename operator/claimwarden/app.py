"""Kopf wiring only: login, the indices, events -> queues, start-up and clean-up.

Pods, claims and templates belong to others: they are only observed (``kopf.index`` and
``kopf.on.event``), so claimwarden never writes annotations or finalizers on them. Every event
is resolved once into a view and handed to the controllers that want it, which only put keys on
their queues; workers reconcile from the indices (runtime/ explains the two layers). The settings
are `settings.py`'s, the runtime is built by `runtime/assembly.py`.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import kopf

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
from .discovery import configuration_for
from .health import records
from .kube.login import connection_info
from .objects import trimmed
from .objects.claims import allocated_devices, claim_view, controlling_pod_uid
from .objects.pods import pod_view
from .runtime import kopf_diffbase, kopf_private, kopf_toggles, readiness, server
from .runtime.assembly import build_runtime, serve_webhook
from .runtime.ending import exit_unless_ended
from .runtime.operator import Runtime
from .samples import register_gauges
from .settings import run_settings_of

log = logging.getLogger("claimwarden")

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


@kopf.on.login()
def login(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> kopf.ConnectionInfo:
    """One explicit login, so credentials never depend on which client libraries are installed."""
    configuration = configuration_for(run_settings_of(memo).kubeconfig)
    return connection_info(configuration, settings.networking.trust_env)


# --- indices: small projections, keyed for the look-ups the controllers make -------------------

# Each Kopf index costs a handler invocation on every event of its kind, so each kind has one index
# whose keys are tagged by look-up: (namespace, name) -> the projection, (tag, ...) -> a reverse
# look-up. `cache.index_views` splits them again into the look-ups `Cache` reads. Every index is
# declared here, each with the question it answers; registered always (pods, claims,
# templates_by_name), with health (slices_by_name, device_records: register_health_handlers), with
# signals (health_policies, device_classes, nodes_by_name) and where PodGroups are served (pod_groups:
# register_podgroup_handlers).

@kopf.index(*PODS)
async def pods(namespace: str | None, name: str, body: kopf.Body, **_: Any) -> dict[Any, Any] | None:
    """(namespace, name) -> projection; ("claim", namespace, claim name) and ("template", namespace,
    template name) -> pod name: which pods use this claim or template? ("podgroup", namespace, PodGroup
    name) -> pod name: which pods with claims does this PodGroup have (1.36+)?"""
    pod = pod_view(namespace, name, body)
    if pod is None:
        return None
    keys: dict[Any, Any] = {(pod.namespace, name): trimmed.pod(body)}
    for claim_name in pod.claim_names:
        keys[(POD_BY_CLAIM, pod.namespace, claim_name)] = name
    entries = (pod.body.get("spec") or {}).get("resourceClaims") or []
    for entry in entries:
        if entry.get("resourceClaimTemplateName"):
            keys[(POD_BY_TEMPLATE, pod.namespace, entry["resourceClaimTemplateName"])] = name
    group = podgroups.podgroup_name_of(pod.body) if entries else None
    if group is not None:
        keys[(POD_BY_PODGROUP, pod.namespace, group)] = name
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
    """(namespace, name) -> projection: which template does a pod's or PodGroup's claim entry name?"""
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


async def pod_groups(namespace: str | None, name: str, body: kopf.Body, **_: Any) -> dict[Any, Any]:
    """(namespace, name) -> projection; ("template", namespace, template) -> PodGroup name: which
    PodGroups wait for this template? (Their members and claims are in the pods and claims indices.)"""
    namespace = namespace or ""
    keys: dict[Any, Any] = {(namespace, name): trimmed.podgroup(body)}
    for entry in (body.get("spec") or {}).get("resourceClaims") or []:
        if entry.get("resourceClaimTemplateName"):
            keys[(PODGROUP_BY_TEMPLATE, namespace, entry["resourceClaimTemplateName"])] = name
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
    runtime = _leading(memo)
    if runtime is None:
        return
    pod = pod_view(namespace, name, body, deleted=type == "DELETED")
    if pod is None:
        return
    for controller in (runtime.claims, runtime.health, runtime.signals, runtime.reservations):
        if controller is not None:
            controller.enqueue_for_pod(pod)


@kopf.on.event(*CLAIMS)
async def claim_event(type: str | None, namespace: str | None, name: str, body: kopf.Body, memo: kopf.Memo,
                      **_: Any) -> None:
    runtime = _leading(memo)
    if runtime is None:
        return
    claim = claim_view(namespace, name, body, deleted=type == "DELETED")
    if runtime.reservations:
        runtime.reservations.enqueue_claim(claim.namespace, claim.name)
    if runtime.health:
        runtime.health.enqueue_for_claim(claim.namespace, claim.name, claim.body, deleted=claim.deleted)
    if runtime.claims:
        runtime.claims.enqueue_for_claim(claim, came_or_went=type in ("ADDED", "DELETED", None))


async def slice_event(type: str | None, name: str, body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    runtime = _leading(memo)
    if runtime is None:
        return
    plain = dict(body)
    if runtime.health is not None:
        runtime.health.enqueue_slice(name, plain)
    if runtime.signals is not None:
        runtime.signals.enqueue_for_slice(name, plain, deleted=type == "DELETED")


async def record_event(name: str, body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    runtime = _leading(memo)
    if runtime is None:
        return
    plain = dict(body)
    if runtime.health is not None:
        runtime.health.enqueue_record(name, plain)
    if runtime.handoff is not None:
        runtime.handoff.enqueue(name)
    if runtime.signals is not None:
        runtime.signals.enqueue_record(plain)


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
    if runtime.reservations is not None:
        runtime.reservations.enqueue_for_podgroup(namespace, dict(body), deleted=type == "DELETED")
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
    # Signals run with health where the HealthPolicy CRD is installed (cli.py registered its index then).
    runtime = await build_runtime(settings=run_settings, cache=cache, kopf_state=memo.kopf_state,
                                  signals=POLICY_INDEX in kwargs)
    memo.webhook = await serve_webhook(run_settings, runtime)
    memo.runtime = runtime
    if run_settings.election is None:
        metrics.LEADER.set(1)
    await runtime.start()

    urls: dict[str, server.Handler] = {}
    if run_settings.liveness:
        async def probes() -> dict[str, Any]:
            return await kopf_private.run_probes(registry=kopf.get_default_registry(), settings=settings,
                                                 indexers=memo.kopf_state.indexers, memo=memo)

        urls[run_settings.liveness] = server.liveness_handler(probes)
    if run_settings.readiness:
        urls[run_settings.readiness] = server.readiness_handler(lambda: ready(runtime))
    if "metrics" in run_settings.controllers:
        register_gauges(runtime, namespace=run_settings.namespace, cache_seconds=run_settings.metrics_cache_seconds)
        urls[server.metrics_url(run_settings.metrics_address, run_settings.metrics_port)] = \
            server.metrics_handler(metrics.REGISTRY)
    if urls:
        memo.server = await server.serve(urls, access_logged=[run_settings.liveness] if run_settings.liveness else [])


def ready(runtime: Runtime) -> readiness.Readiness:
    elector = runtime.elector
    return readiness.decide(indexed=kopf_toggles.indexed(), last_contact=elector.contacted_at if elector else None,
                            now=time.monotonic(), max_age=elector.settings.lease_seconds if elector else None)


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


@kopf.on.cleanup()
async def cleanup(memo: kopf.Memo, **_: Any) -> None:
    runtime: Runtime | None = memo.get("runtime")
    receiver = memo.get("webhook")
    if receiver is not None:
        await receiver.stop()
    if runtime is not None:
        await runtime.stop()
    if memo.get("server") is not None:
        await memo.server.cleanup()
    log.info("claimwarden stopped")
    exit_unless_ended()  # runtime/ending.py: why Kopf may not end the process itself


@kopf.on.probe(id="version")
def probe_version(**_: Any) -> str:
    return __version__
