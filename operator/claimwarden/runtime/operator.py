"""The running operator: its controllers, whether it leads, its workers and its periodic resync.

`assembly.py` builds it with its controllers and their loops; `app.py` keeps it in Kopf's memo and
calls `Runtime.start` (which leads at once, or runs the leader election that calls `Runtime.lead`
once this replica holds the lease) and, at clean-up, `Runtime.stop` (drain, then close).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, cast

import kopf

from ..cache import Cache
from ..claims.controller import ClaimsController
from ..claims.podgroup_controller import PodGroupsController
from ..handoff.controller import HandoffController
from ..health.controller import HealthController
from ..kube.api import Kube
from ..leader.elector import Elector
from ..reservations.controller import ReservationsController
from ..signals.controller import SignalsController
from . import staleness

# Kopf's own stores, handed to kopf.run(indexers=..., memories=...) so that staleness.py can forget
# objects deleted while a watch was down.
from .kopf_private import OperatorIndexers, ResourceMemories
from .workqueue import Reconcile, WorkQueue, run_workers

log = logging.getLogger("claimwarden")

FIRST_RESYNC_SECONDS = 15.0  # soon after start-up, once the indices are filled
DRAIN_SECONDS = 10.0  # on SIGTERM, time for workers to finish their current key (well within the pod's 30 s)


@dataclass(frozen=True)
class KopfState:
    """Kopf's own stores of watched objects, created here and handed to kopf.run (see staleness.py)."""

    indexers: OperatorIndexers = field(default_factory=OperatorIndexers)
    memories: ResourceMemories = field(default_factory=ResourceMemories)


@dataclass
class Runtime:
    """The controllers of this process, reachable from Kopf handlers through the operator memo."""

    cache: Cache
    kube: Kube
    workers_per_queue: int
    resync_seconds: float
    kopf_state: KopfState | None = None  # None only in tests that start no Kopf
    claims: ClaimsController | None = None
    podgroups: PodGroupsController | None = None  # only where the cluster serves PodGroups
    reservations: ReservationsController | None = None
    health: HealthController | None = None
    signals: SignalsController | None = None  # with health, where the HealthPolicy CRD is installed
    handoff: HandoffController | None = None  # with health: recommended actions, NVSentinel requests
    elector: Elector | None = None
    election: asyncio.Task[None] | None = None
    """The elector's loop: kept renewing through a drain (the fence then still lets the last writes out)."""
    leading: bool = False
    """Only the leader's events reach the queues, and only the leader's workers run."""
    loops: list[tuple[WorkQueue, Reconcile, int]] = field(default_factory=list)
    """(queue, reconcile, workers): what `lead` starts (runtime/assembly.py composes them)."""
    queues: list[tuple[WorkQueue, int]] = field(default_factory=list)
    workers: list[asyncio.Task[None]] = field(default_factory=list)
    background: list[asyncio.Task[None]] = field(default_factory=list)

    async def start(self) -> None:
        """Lead at once without an elector; with one, run the election, which calls `lead` once this
        replica holds the lease."""
        if self.elector is None:
            await self.lead()
        else:
            self.election = asyncio.create_task(self.elector.run(), name="leader-election")

    async def lead(self) -> None:
        """Start the workers and the resync, and queue everything a standby's warm indices hold: events
        seen before this replica led reached no queue (at a plain start-up the indices are still empty)."""
        self.leading = True
        for queue, reconcile, workers in self.loops:
            self.queues.append((queue, workers))
            self.workers.append(asyncio.create_task(run_workers(queue, reconcile, workers), name=queue.name))
        self.enqueue_all()
        self.background.append(asyncio.create_task(self._resync(), name="resync"))

    def enqueue_all(self) -> None:
        """Every key of every controller."""
        if self.reservations:
            for key in self.cache.claim_keys():
                self.reservations.enqueue_claim(*key)
        if self.claims:
            for key in self.cache.pod_keys():
                self.claims.enqueue_pod(*key)
        if self.podgroups:
            for key in self.cache.podgroup_keys():
                self.podgroups.enqueue(*key)
        if self.health:
            for name in self.cache.resource_slice_names():
                self.health.enqueue_slice(name)
            for record in self.health.record_names():
                self.health.enqueue_record(record)
        if self.signals:
            self.signals.enqueue_all()
        if self.handoff:
            self.handoff.enqueue_all()

    async def _resync(self) -> None:
        """Every few minutes look at everything again, so nothing depends on a single event.

        The first round, soon after leading, only forgets what was deleted while a watch was down: `lead`
        queued every key a moment ago, and so did the events of a fresh start-up list. Re-queueing all
        of them again cost a restart at 5,000 claims a second round of every reconcile.
        """
        delay = min(FIRST_RESYNC_SECONDS, self.resync_seconds)
        first = True
        while True:
            await asyncio.sleep(delay)
            delay = self.resync_seconds
            await self.resync_once(requeue=not first)
            first = False

    async def resync_once(self, *, requeue: bool = True) -> None:
        """Forget what was deleted while a watch was down (staleness.py), then queue every key (with
        `requeue`, or when something was forgotten)."""
        forgotten = False
        if self.kopf_state is not None:
            forget = _forgetter(self.kopf_state.indexers, self.kopf_state.memories)
            try:
                for gone in await staleness.prune_stale(self.kube, self.cache, forget):
                    forgotten = True
                    if self.claims and gone.get("kind") == "Pod":
                        self.claims.forget_pod(gone["metadata"].get("uid", ""))
                    if self.reservations and gone.get("kind") == "Pod":
                        self.reservations.note_deleted_pod(gone["metadata"].get("uid", ""))
                    if self.podgroups and gone.get("kind") == "PodGroup":
                        self.podgroups.forget(gone["metadata"].get("uid", ""))
            except Exception as exc:
                log.warning("comparing the indices with live lists failed (retried at the next resync): %s", exc)
        if requeue or forgotten:
            self.enqueue_all()
        if self.health:
            try:
                await self.health.release_orphaned_quarantine()
            except Exception as exc:
                log.warning("releasing orphaned quarantine claims failed: %s", exc)

    async def stop(self) -> None:
        """At shutdown: `drain`, then close the API connections (the lease's own as well)."""
        await self.drain()
        await self.kube.close()
        if self.elector is not None and self.elector.kube is not self.kube:
            await self.elector.kube.close()

    async def drain(self) -> None:
        """Let every worker finish the key in hand (an eviction and its bookkeeping are one step), then
        cancel what is still running after the grace period; write what lives only in memory; then stop
        renewing the lease and hand it back. The lease is renewed until then: a leader's writes are fenced
        to the renew deadline after its last renewal, which a drain and a flush together may outlast."""
        for task in self.background:
            task.cancel()
        for queue, workers in self.queues:
            queue.close(workers)
        if self.workers:
            _, late = await asyncio.wait(self.workers, timeout=DRAIN_SECONDS)
            for task in late:
                task.cancel()
        for task in (*self.background, *self.workers):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if self.health is not None:
            try:
                await self.health.flush()
            except Exception as exc:
                log.warning("writing the eviction counts at shutdown failed: %s", exc)
        if self.election is not None:
            self.election.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self.election
        if self.elector is not None:
            await self.elector.release()


def _forgetter(indexers: OperatorIndexers,
               memories: ResourceMemories) -> Callable[[dict[str, Any]], Awaitable[None]]:
    """Forget one object as Kopf does on its DELETED event: in every index and in Kopf's per-object memory
    (only the object's metadata namespace, name and uid are read)."""
    async def forget(body: dict[str, Any]) -> None:
        indexers.discard(cast(kopf.Body, body))
        await memories.forget(cast(kopf.RawBody, body))
    return forget
