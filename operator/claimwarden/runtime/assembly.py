"""Building the runtime at start-up: which controllers run, what each is handed, which queues get workers.

Every collaborator is passed in at construction, in the order the controllers need each other: the
elector first (it fences the Kube's writes), PodGroups before claims (a pod's plan reads its group's
claims), health before reservations (a claim's release waits for health's eviction wave) and before
the hand-off, and the hand-off before the signals (a verified clear waits for its repair). The only
late binding is in callbacks that are resolved when they are called (noted where it happens).
Nothing here watches or reconciles: `app.py` calls `build_runtime` once from Kopf's start-up hook,
and `Runtime.start` then leads or runs the election.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import TYPE_CHECKING

from .. import __version__
from ..cache import Cache
from ..claims.controller import ClaimsController
from ..claims.podgroup_controller import PodGroupsController
from ..discovery import in_cluster
from ..handoff.controller import HandoffController
from ..health import records
from ..health.controller import HealthController
from ..health.plan import scheduler_retries_on_claim_deletion
from ..kube.api import CONNECTION_POOL, Kube
from ..leader.elector import Elector
from ..reservations.controller import ReservationsController
from ..settings import RunSettings
from ..signals.controller import SignalsController
from .ending import lost_lease
from .operator import KopfState, Runtime
from .workqueue import Reconcile, WorkQueue

if TYPE_CHECKING:
    from ..signals.webhook import Receiver

log = logging.getLogger("claimwarden")

Loop = tuple[WorkQueue, Reconcile, int]
LoopAdder = Callable[..., None]
"""Adds a loop: (queue, reconcile[, workers])."""


async def build_runtime(*, settings: RunSettings, cache: Cache, kopf_state: KopfState, signals: bool) -> Runtime:
    """The runtime with the controllers `settings.controllers` names, not leading yet.

    `signals`: the HealthPolicy CRD is installed (its index was registered), so signals run with health.
    """
    identity = settings.election.identity if settings.election else "standalone"
    # `runtime` is bound at the end; the elector calls `lead` only once its loop runs (Runtime.start).
    elector = await _elector(settings=settings, identity=identity, lead=lambda: runtime.lead())
    kube: Kube | None = None
    try:
        kube = await Kube.connect(settings.kubeconfig, in_cluster() and not settings.kubeconfig,
                                  request_timeout=settings.request_timeout,
                                  user_agent=f"claimwarden/{__version__} ({identity})",
                                  qps=settings.api_qps, burst=settings.api_burst,
                                  # The claims' workers and the evictions' at once, each with its request.
                                  connections=max(CONNECTION_POOL, settings.workers + settings.health.workers),
                                  # Writes only while this replica may (leader/elector.py); without an election, always.
                                  fence=elector.write_time_left if elector is not None else None)
        runtime = await _assembled(settings=settings, cache=cache, kopf_state=kopf_state, signals=signals,
                                   kube=kube, elector=elector)
    except BaseException:
        # Kopf retries a start-up handler that failed: close what this try opened, or every retry leaks
        # its connections.
        if kube is not None:
            await kube.close()
        if elector is not None:
            await elector.kube.close()
        raise
    return runtime


async def _assembled(*, settings: RunSettings, cache: Cache, kopf_state: KopfState, signals: bool, kube: Kube,
                     elector: Elector | None) -> Runtime:
    """The controllers, their loops and the runtime over them, on connections already open."""
    loops: list[Loop] = []

    def loop(queue: WorkQueue, reconcile: Reconcile, workers: int = settings.workers) -> None:
        loops.append((queue, reconcile, workers))

    claims, podgroups = _claims_controllers(settings=settings, cache=cache, kube=kube, loop=loop)
    health = signals_controller = handoff = None
    if "health" in settings.controllers:
        health = HealthController(cache, kube, settings.namespace, replace(
            settings.health, claim_deletion_wakes_pods=scheduler_retries_on_claim_deletion(settings.server_version)))
        workers = settings.health.workers
        loop(health.slice_queue, health.marks.reconcile)
        loop(health.siblings.queue, health.siblings.reconcile)
        loop(health.record_queue, health.reconcile_record, workers)
        loop(health.eviction_queue, health.evictions.reconcile, workers)

        def signals_again(ref: records.DeviceRef) -> None:
            # The hand-off and the signals need each other (a cleared repair queues the device's signals; a
            # verified clear waits for the repair): `signals_controller` is bound just below, before either runs.
            assert signals_controller is not None
            signals_controller.enqueue(ref)

        handoff = HandoffController(cache=cache, kube=kube, settings=settings.handoff,
                                    on_cleared=signals_again if signals else None)
        if signals:
            signals_controller = SignalsController(cache=cache, kube=kube, repair_gate=handoff)
            loop(signals_controller.queue, signals_controller.reconcile, workers)
            loop(signals_controller.statuses.queue, signals_controller.statuses.reconcile, 1)
        loop(handoff.queue, handoff.reconcile, workers)
    reservations = None
    if "reservations" in settings.controllers:
        reservations = ReservationsController(
            cache, kube, health.quarantined if health else None, podgroup_version=settings.podgroup_version,
            held=health.release_held if health else None, kept=health.keeps_allocation if health else None)
        loop(reservations.queue, reservations.reconcile)
    runtime = Runtime(cache=cache, kube=kube, workers_per_queue=settings.workers,
                      resync_seconds=settings.resync_seconds, kopf_state=kopf_state, claims=claims,
                      podgroups=podgroups, reservations=reservations, health=health, signals=signals_controller,
                      handoff=handoff, elector=elector, loops=loops)
    if health is not None:
        await _start_health_tasks(runtime, health)
    return runtime


def _claims_controllers(*, settings: RunSettings, cache: Cache, kube: Kube,
                        loop: LoopAdder) -> tuple[ClaimsController | None, PodGroupsController | None]:
    """The claims controller, and the PodGroups' where the cluster serves them (only with claims)."""
    if "claims" not in settings.controllers:
        return None, None
    claims: ClaimsController | None = None
    podgroups = None
    if settings.podgroup_version is not None:
        def members_record(namespace: str, podgroup: str) -> None:
            # `claims` is bound just below, before any PodGroup is reconciled.
            assert claims is not None
            for pod in cache.pods_in_podgroup(namespace, podgroup):
                claims.enqueue_pod(namespace, pod)

        podgroups = PodGroupsController(cache, kube, settings.podgroup_version, on_claim=members_record)
    claims = ClaimsController(cache, kube, podgroups=podgroups)
    loop(claims.queue, claims.reconcile)
    if podgroups is not None:
        loop(podgroups.queue, podgroups.reconcile)
    return claims, podgroups


async def _elector(*, settings: RunSettings, identity: str, lead: Callable[[], Awaitable[None]]) -> Elector | None:
    """The leader election, or None with --leader-elect=false (this process then leads at once)."""
    if settings.election is None:
        return None
    # The lease gets connections of its own: behind a burst of evictions and records (64 workers on 32
    # pooled connections) a renewal once waited past the lease duration and fenced every write.
    # A renewal answered after the renew deadline leaves the leader no time to write: it gives up then.
    lease_kube = await Kube.connect(settings.kubeconfig, in_cluster() and not settings.kubeconfig,
                                    request_timeout=min(settings.request_timeout,
                                                        settings.election.renew_deadline_seconds),
                                    user_agent=f"claimwarden/{__version__} ({identity})")
    return Elector(lease_kube, settings.election, on_started=lead, on_lost=lost_lease)


async def _start_health_tasks(runtime: Runtime, health: HealthController) -> None:
    """Health's background loops: the taint rules' selectors and the admission policies."""
    runtime.background.append(asyncio.create_task(
        health.unselective_rules.run(lambda: runtime.leading), name="taint-rule-selectors"))
    # Approvals count only while the approval policy is installed: known before the first record reconcile.
    try:
        await health.approvals.admission.refresh()
    except Exception as exc:  # retried every 15 s; until then no approval counts
        log.warning("reading the admission policies failed: %s; approvals are not honoured until they are read", exc)
    runtime.background.append(asyncio.create_task(health.approvals.admission.run(), name="admission-policies"))


async def serve_webhook(settings: RunSettings, runtime: Runtime) -> Receiver | None:
    """Alertmanager's receiver, when signals run and its settings enable it (a token file or a client CA);
    a standby answers 503."""
    signals = runtime.signals
    if signals is None or settings.webhook is None or not settings.webhook.enabled:
        return None
    from ..signals import alerts, webhook

    def resolve(alert: alerts.Alert) -> records.DeviceRef | None:
        return alerts.resolve_device(alert, runtime.cache.resource_slices())

    receiver = await webhook.serve(settings.webhook, signals.observe, resolve, lambda: runtime.leading)
    log.info("Alertmanager webhook on %s:%d", settings.webhook.address, settings.webhook.port)
    return receiver
