"""The candidate loop: acquire the Lease, renew it, release it on shutdown, give up when it is lost.

Only the leader runs the controllers; a standby keeps watching (its indices stay warm, so a
takeover needs no re-list), serves liveness and metrics and reports ``claimwarden_leader 0``.

Fencing. The leader holds the lease until ``leaseDurationSeconds`` after the *start* of its last
successful renewal, by its own clock (the safe side: the renewal took effect later). A standby dates
a change of the Lease when its read *returns* (as client-go sets observedTime after its Get), so it
never dates a renewal from before the renewal happened, and takes over no sooner than a lease
duration after that. The two clocks need only agree in rate, not in setting.

A write is not an instant, though: once sent it cannot be recalled, and it takes effect at the
apiserver some time after it left. So the leader *sends* writes only within the renew deadline of
its last renewal's start (`write_time_left`, which ``Kube`` asks right before each send and which
caps the write's timeout). The rest of the lease, ``lease - renew deadline`` (5 s by default), is the
time a write already on its way has to take effect before a standby may take over. A write that
takes longer than that may still land after the new leader's first write: docs/concepts/high-availability.md states this
bound ("Fencing, and its bound").
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import os
import socket
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from .. import metrics
from ..kube.api import Kube
from ..kube.errors import ApiError
from . import plan

log = logging.getLogger("claimwarden.leader")

LEASE_NAME = "claimwarden"


@dataclass(frozen=True)
class ElectionSettings:
    namespace: str
    identity: str
    lease_seconds: int = 15
    renew_deadline_seconds: float = 10.0
    retry_seconds: float = 2.0
    name: str = LEASE_NAME

    def problems(self) -> list[str]:
        """What is wrong with these durations (client-go's checks), empty when they are fine."""
        found = []
        if self.lease_seconds <= self.renew_deadline_seconds:
            found.append("--leader-elect-lease-duration must be longer than --leader-elect-renew-deadline")
        if self.renew_deadline_seconds <= 1.2 * self.retry_seconds:
            found.append("--leader-elect-renew-deadline must be longer than 1.2 x --leader-elect-retry-period")
        if self.retry_seconds <= 0:
            found.append("--leader-elect-retry-period must be positive")
        return found


def default_identity() -> str:
    """The pod's name (Downward API `POD_NAME`), else the host name with a random suffix."""
    return os.environ.get("POD_NAME") or f"{socket.gethostname()}_{uuid.uuid4().hex[:8]}"


def micro_time() -> str:
    """Now as a Kubernetes MicroTime (RFC 3339 with microseconds, UTC)."""
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class Elector:
    def __init__(self, kube: Kube, settings: ElectionSettings, *, on_started: Callable[[], Awaitable[None]],
                 on_lost: Callable[[], None], clock: Callable[[], float] = time.monotonic) -> None:
        self.kube = kube
        self.settings = settings
        self._on_started = on_started
        self._on_lost = on_lost
        self._clock = clock  # a fake one in unit tests, to interleave two candidates' requests
        self._observed: plan.Observed | None = None
        self._lease: dict[str, Any] | None = None
        self._renewed_at: float | None = None  # monotonic start of the last successful write as holder
        self.contacted_at: float | None = None  # monotonic end of the last successful read of the Lease (readiness)
        self.leading = False

    def holds_lease(self) -> bool:
        """True while this process leads and its last renewal is less than a lease duration old."""
        return (self.leading and self._renewed_at is not None
                and self._clock() < self._renewed_at + self.settings.lease_seconds)

    def write_time_left(self) -> float:
        """Seconds in which this replica may still send a write: until the renew deadline after the start of
        its last renewal, ``lease - renew deadline`` before its lease ends. 0 or less when it may not write
        (a standby, or a leader that could not renew in time)."""
        if not self.leading or self._renewed_at is None:
            return 0.0
        return self._renewed_at + self.settings.renew_deadline_seconds - self._clock()

    async def run(self) -> None:
        """Wait to lead, start the controllers, renew until shut down; on a lost lease call `on_lost`."""
        metrics.LEADER.set(0)
        while not await self._try():
            await asyncio.sleep(self.settings.retry_seconds)
        self.leading = True
        metrics.LEADER.set(1)
        metrics.LEADER_TRANSITIONS.inc()
        log.info("%s leads (Lease %s/%s); starting the controllers", self.settings.identity,
                 self.settings.namespace, self.settings.name)
        await self._on_started()
        while True:
            await asyncio.sleep(self.settings.retry_seconds)
            deadline = self._clock() + self.settings.renew_deadline_seconds
            while not await self._try():
                if self._clock() >= deadline:
                    self.leading = False
                    metrics.LEADER.set(0)
                    log.error("%s lost the lease (no renewal within %.0f s); exiting, to be restarted as a "
                              "standby", self.settings.identity, self.settings.renew_deadline_seconds)
                    self._on_lost()
                    return
                await asyncio.sleep(self.settings.retry_seconds)

    async def release(self) -> None:
        """Hand the lease back (empty holder), so that a standby takes over at once."""
        if not self.leading or self._lease is None:
            return
        self.leading = False
        metrics.LEADER.set(0)
        lease = {**self._lease, "spec": plan.released(self._lease.get("spec") or {}, micro_time())}
        try:
            await self.kube.request("PUT", self._path(), lease, unfenced=True)
            log.info("%s released the lease", self.settings.identity)
        except ApiError as exc:
            log.warning("could not release the lease (a standby takes over when it expires): %s", exc)

    async def _try(self) -> bool:
        """One round: read the lease and create, renew or take it over if the rules allow; True if held."""
        started = self._clock()
        try:
            lease = await self.kube.request("GET", self._path(), allow_missing=True, unfenced=True)
        except ApiError as exc:  # unreachable and timed-out requests included: the next round tries again
            log.warning("reading the lease failed: %s", exc)
            return False
        self.contacted_at = self._clock()
        # What the read shows is dated when it returned: the holder may have renewed while it was on its way,
        # and dating that renewal from `started` would let this candidate take over before the holder's lease ends.
        decision = plan.decide(lease, identity=self.settings.identity, observed=self._observed, now=self._clock(),
                               wall_now=micro_time(), lease_seconds=self.settings.lease_seconds)
        self._observed = decision.observed
        if decision.action == plan.WAIT or decision.spec is None:
            return False
        try:
            written = await self._write(lease, decision.spec)
        except ApiError as exc:
            if not exc.conflict:  # a conflict is another candidate winning this round
                log.warning("%s of the lease failed: %s", decision.action, exc)
            return False
        if decision.action == plan.TAKE_OVER:
            log.info("%s took the lease over from %r", self.settings.identity,
                     ((lease or {}).get("spec") or {}).get("holderIdentity") or "nobody")
        self._lease = written
        self._observed = plan.Observed(plan.record_of(written), started)
        self._renewed_at = started
        return True

    async def _write(self, lease: dict[str, Any] | None, spec: dict[str, Any]) -> dict[str, Any]:
        if lease is None:
            body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                    "metadata": {"name": self.settings.name, "namespace": self.settings.namespace}, "spec": spec}
            try:
                created = await self.kube.request("POST", self._path(collection=True), body, unfenced=True)
            except ApiError as exc:
                if not exc.not_found:
                    raise
                await self.kube.create_namespace(self.settings.namespace, unfenced=True)
                created = await self.kube.request("POST", self._path(collection=True), body, unfenced=True)
            assert created is not None
            return created
        # The resourceVersion in the body makes this a compare-and-swap.
        replaced = await self.kube.request("PUT", self._path(), {**lease, "spec": spec}, unfenced=True)
        assert replaced is not None
        return replaced

    def _path(self, collection: bool = False) -> str:
        base = f"/apis/coordination.k8s.io/v1/namespaces/{self.settings.namespace}/leases"
        return base if collection else f"{base}/{self.settings.name}"
