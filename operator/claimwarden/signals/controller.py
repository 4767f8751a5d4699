"""One device at a time: collect its signals, route it to a policy, merge, decide, write its record.

The queue is keyed by DeviceRef. A reconcile reads everything level-based from the caches (the driver
taints of the device's complete pool, the KEP-4680 health of the pods holding it, the conditions of its
node: ``sources``) and takes the pushed observations (Alertmanager) that wait in memory until they are
written. Of those, only what a rule of the device's policy (``routing``) matches is written (and the
healthy ones of a signal a rule watches: recovery needs them); the rest is counted and remembered in
memory, so that it is counted once (``keeping``). The record is created only when a rule matched
something; it is patched only when its status or spec changed, so that a quiet device costs no write
(``record_writes``).

A recovered record stays (effect None, its history kept, so that a re-fault escalates) and is deleted
once its policy's refaultWindow has passed without a new observation (``lifetime``). Workload faults
are counted against the fleet view (``fleet``).

This module is the glue: the events that queue devices, the webhook's sink, the reconcile, and what a
decision tells people (metrics, Events, a person's verified clear).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Protocol, cast

from .. import metrics
from ..cache import Body, Cache
from ..health import records
from ..health.records import DeviceRef
from ..kube.api import Kube
from ..kube.errors import ApiError
from ..objects.pods import PodView
from ..runtime.workqueue import Retry, WorkQueue
from ..timestamps import format_rfc3339, now
from . import decide, keeping, lifetime, nodes, observations, podhealth, policy, sources
from . import records as signal_records
from .fleet import FleetView
from .observations import UNHEALTHY, UNKNOWN, Observation
from .policy_status import POLICY_API, PolicyStatuses
from .record_writes import RecordWrites
from .routing import PolicyRouting

log = logging.getLogger("claimwarden.signals")

OBSERVE_TIMEOUT = 10.0  # seconds the webhook waits for its observations to be written (then 503: retried)
INVALID_VERIFIED = "InvalidVerifiedClear"
WORKLOAD_FAULT = "WorkloadFault"
ORPHANED_MARK = "MarkWithoutRule"
VERIFIED_AHEAD_MAX = timedelta(minutes=5)
"""A verified clear stamped further ahead of claimwarden's clock than this is reported (a Warning Event)."""


class RepairGate(Protocol):
    """Whether a repair system still holds a record's recovery (docs/guides/handoff-to-repair.md)."""

    def recovery_hold(self, record: Body) -> str | None: ...
    async def held(self, record: Body, why: str) -> None: ...


@dataclass
class _Pending:
    """Observations pushed for a device (the webhook's), and who waits for them to be written."""

    observations: list[Observation]
    waiters: list[asyncio.Future[None]]


class SignalsController:
    """The signals' queue, the events that feed it, and the reconcile that decides each device."""

    def __init__(self, *, cache: Cache, kube: Kube, repair_gate: RepairGate | None = None) -> None:
        """`repair_gate`: the hand-off (handoff/controller.py): a verified clear waits while the record's repair
        is open (None in tests: no repair holds a recovery)."""
        self.cache = cache
        self.kube = kube
        self.queue = WorkQueue("signals")
        self._pushed: dict[DeviceRef, _Pending] = {}
        self._unwritten: dict[DeviceRef, list[Observation]] = {}
        """Observations collected but not written (no rule matched): remembered so that each is counted once."""
        self.writes = RecordWrites(cache=cache, kube=kube)
        self.fleet = FleetView()
        self.routing = PolicyRouting(cache=cache, report=self._report_later)
        self._generations: dict[str, int | None] = {}
        """HealthPolicy name -> the generation its last event showed (a status write changes no generation)."""
        self.statuses = PolicyStatuses(cache=cache, kube=kube, route_errors=lambda: self.router().errors)
        self._reported: set[tuple[str, str]] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        # What the last event of each object showed, to queue only the devices whose signals changed.
        self._slice_taints: dict[str, dict[str, list[Body]]] = {}
        self._pod_health: dict[str, frozenset[podhealth.DeviceHealth]] = {}
        self._node_conditions: dict[str, list[Body]] = {}
        self.repair_gate = repair_gate

    def router(self) -> policy.Router:
        """The router over the cached policies (``routing``): its errors are the policies' statuses'."""
        return self.routing.router()

    # --- events -> queue ------------------------------------------------------------------------

    def enqueue(self, ref: DeviceRef) -> None:
        self.queue.add(ref)

    def enqueue_record(self, record: Body) -> None:
        if signal_records.is_signal_record(record) and (ref := records.record_ref(record)) is not None:
            self.queue.add(ref)

    def enqueue_all(self) -> None:
        """Every device with a signal record or a signal now, and every policy's status (a DeviceClass changed,
        a resync, this replica leads)."""
        for ref in sorted(self._candidates(), key=str):
            self.queue.add(ref)
        self.statuses.enqueue_all()

    def policy_event(self, name: str, generation: int | None, *, deleted: bool = False) -> None:
        """A HealthPolicy changed: its status is looked at; the devices are routed again only when its spec did
        (a new generation, or gone): claimwarden's own status writes bring events too."""
        if deleted:
            self._generations.pop(name, None)
        elif self._generations.get(name, -1) == generation:
            self.statuses.enqueue(name)
            return
        else:
            self._generations[name] = generation
        self.enqueue_all()

    def _candidates(self) -> set[DeviceRef]:
        return sources.candidates(self.cache, pushed=self._pushed, policies=self.routing.policies())

    def enqueue_for_slice(self, name: str, slice_: Body, *, deleted: bool = False) -> None:
        """The slice's devices whose taints changed, and those with a signal record (a pool's completeness and
        generation are read from all its slices)."""
        now_taints = {} if deleted else sources.slice_taints(slice_)
        before = self._slice_taints.pop(name, {})
        if not deleted:
            self._slice_taints[name] = now_taints
        spec = slice_.get("spec") or {}
        driver, pool = str(spec.get("driver") or ""), str((spec.get("pool") or {}).get("name") or "")
        for device in sorted(set(now_taints) | set(before)):
            if now_taints.get(device) != before.get(device):
                self.queue.add(DeviceRef(driver, pool, device))
        for device in (d.get("name") for d in spec.get("devices") or []):
            ref = DeviceRef(driver, pool, str(device or ""))
            if self.cache.record(signal_records.signal_record_name(ref)) is not None:
                self.queue.add(ref)

    def enqueue_for_pod(self, pod: PodView) -> None:
        """The devices whose health entries in the pod changed (a deleted pod's: its entries are gone)."""
        entries = frozenset() if pod.deleted else frozenset(podhealth.pod_device_health(pod.body))
        before = self._pod_health.pop(pod.uid, frozenset())
        if entries:
            self._pod_health[pod.uid] = entries
        for entry in entries ^ before:
            self.queue.add(entry.ref)

    def enqueue_for_node(self, name: str, conditions: list[Body], *, deleted: bool = False) -> None:
        """The devices of the node when its conditions changed."""
        before = self._node_conditions.pop(name, None)
        if not deleted:
            self._node_conditions[name] = conditions
        if before == (None if deleted else conditions):
            return
        for ref in nodes.devices_of_node(name, self.cache.resource_slices()):
            self.queue.add(ref)

    # --- the webhook's sink ---------------------------------------------------------------------

    async def observe(self, items: list[tuple[DeviceRef, Observation]]) -> None:
        """Pushed observations: returns once they are written to their records (or found to match no rule);
        raises when that did not happen within OBSERVE_TIMEOUT (the webhook answers 503, Alertmanager retries)."""
        loop = asyncio.get_running_loop()
        futures = []
        for ref in sorted({ref for ref, _ in items}, key=str):
            pending = self._pushed.setdefault(ref, _Pending([], []))
            pending.observations.extend(o for r, o in items if r == ref)
            future: asyncio.Future[None] = loop.create_future()
            pending.waiters.append(future)
            futures.append(future)
            self.queue.add(ref)
        if futures:
            await asyncio.wait_for(asyncio.gather(*futures), OBSERVE_TIMEOUT)

    # --- reconcile ------------------------------------------------------------------------------

    async def reconcile(self, key: Hashable) -> None:
        ref = cast(DeviceRef, key)
        pending = self._pushed.get(ref)
        pushed = list(pending.observations) if pending else []
        waiters = list(pending.waiters) if pending else []
        try:
            await self._reconcile(ref, pushed)
        except BaseException as exc:
            for waiter in waiters:
                if not waiter.done():
                    waiter.set_exception(exc if isinstance(exc, Exception) else RuntimeError("cancelled"))
            raise
        if pending is not None:
            pending.observations = [o for o in pending.observations if o not in pushed]
            pending.waiters = [w for w in pending.waiters if w not in waiters]
            if not pending.observations and not pending.waiters:
                self._pushed.pop(ref, None)
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    async def _reconcile(self, ref: DeviceRef, pushed: list[Observation]) -> None:
        if not self.fleet.seeded:
            self.fleet.seed(self.cache.records())
        moment = now()
        name = signal_records.signal_record_name(ref)
        record = self.writes.record(name)
        status = self.writes.status_of(name, record)
        written = signal_records.record_observations({"status": status}) if record is not None else []
        remembered = self._unwritten.get(ref, [])
        device = sources.published(self.cache, ref)
        if record is not None and device is None:
            # Routing a device no slice lists (deleted with its node, or re-created under a new name in 1.37) would
            # decide its mark without its attributes: it is decided again when a slice lists it. Pushed observations
            # wait (the webhook answers 503 after OBSERVE_TIMEOUT; Alertmanager sends them again).
            log.debug("device %s: no slice lists it; its record %s is left as it is", ref, name)
            raise Retry(f"device {ref} is not published")
        device_policy = self.routing.route(ref, device or {"name": ref.device})

        collected, signalled = sources.collect(self.cache, ref, device_policy, [*written, *remembered], moment)
        collected += pushed
        # What was remembered unwritten is looked at again: a policy may have come since that matches it.
        found = keeping.sort_observations(collected, written=written, remembered=remembered,
                                          device_policy=device_policy, has_record=record is not None)
        self._count_observations(ref, found)
        if found.dropped:
            self._unwritten[ref] = observations.merge([], found.dropped)[0]
        else:
            self._unwritten.pop(ref, None)

        merged, added = observations.merge(written, found.kept)
        if record is None and not added:
            self.fleet.replace(ref, [])  # (a record deleted by someone else no longer counts)
            return  # nothing a rule of the device's policy watches: no record
        history = signal_records.record_history({"status": status})
        verified = await self._verified(record, history, merged, moment)
        self.fleet.replace(ref, [o for o in merged if o.state == UNHEALTHY])
        decision = decide.decide(device_policy, merged, history, self.fleet.count, moment, verified_at=verified)
        if record is None:
            record = await self.writes.create(ref, decision)
            status = {}
        try:
            await self.writes.write(record, status, merged, decision, moment)
        except ApiError as exc:
            if not exc.not_found:
                raise
            # Deleted meanwhile (a person, or the refault window run out): its deletion event brings the device
            # back, and a signal still there makes a new record then.
            log.info("device %s: record %s deleted while it was being written", ref, record["metadata"]["name"])
            self.writes.forget(record["metadata"]["name"])
            return
        self._count(decision, status)
        if decision.workload_fault and not (status.get("decision") or {}).get("workloadFault"):
            await self._workload_fault(record, ref, decision)
        if decision.orphaned and not (status.get("decision") or {}).get("orphaned"):
            metrics.SIGNAL_ORPHANED.inc()
            await self._event(record, "Warning", ORPHANED_MARK, decision.why)
            log.warning("device %s: %s", ref, decision.why)
        if lifetime.is_done(merged, decision, device_policy, busy=bool(added) or signalled, moment=moment):
            await self._delete(record, device_policy)
            return
        delay = lifetime.next_look(merged, decision, device_policy, moment, deletable=not signalled)
        if delay is not None:
            self.queue.add_after(ref, delay)

    # --- what a decision tells people -----------------------------------------------------------

    def _count_observations(self, ref: DeviceRef, found: keeping.Sorted) -> None:
        for o in found.fresh:
            kept = o in found.kept
            log.log(logging.INFO if kept else logging.DEBUG, "device %s: observed %s %s=%s %s at %s (%s)", ref,
                    o.source, o.signal, o.value, o.state, format_rfc3339(o.at),
                    "written" if kept else "not written: no rule of the device's policy matches it")
            metrics.SIGNAL_OBSERVATIONS.labels(o.source, o.state).inc()
            if o.state == UNKNOWN:
                metrics.SIGNAL_UNKNOWN.labels(ref.driver).inc()
            if not kept:
                metrics.SIGNAL_UNMATCHED.labels(o.source).inc()

    def _count(self, decision: decide.Decision, status: Body) -> None:
        before = status.get("decision") or {}
        if (before.get("rule"), before.get("effect"), before.get("mode")) != (
                decision.rule, decision.effect, decision.mode) and decision.rule is not None:
            metrics.POLICY_DECISIONS.labels(decision.policy or "", decision.rule, decision.effect, decision.mode).inc()
        before_recovery = signal_records.record_history({"status": status})
        if decision.recovered and len(decision.history.clears) > len(before_recovery.clears):
            rule = self.routing.rule(decision.policy, before_recovery.rule)
            metrics.SIGNAL_RECOVERIES.labels(rule.source if rule is not None else "verified").inc()
        elif decision.recovered and decision.history.boundary != before_recovery.boundary:
            metrics.SIGNAL_RECOVERIES.labels("verified").inc()
        if decision.escalated and not before_recovery.escalated:
            metrics.SIGNAL_ESCALATIONS.inc()

    async def _workload_fault(self, record: Body, ref: DeviceRef, decision: decide.Decision) -> None:
        metrics.WORKLOAD_FAULTS.labels(decision.policy or "", decision.rule or "").inc()
        await self._event(record, "Warning", WORKLOAD_FAULT, decision.why)
        log.warning("device %s: %s", ref, decision.why)
        rule = self.routing.rule(decision.policy, decision.rule)
        if rule is not None:  # the other devices of the same signal are decided again
            for other in self.fleet.devices(rule.source, rule.signal):
                if other != ref:
                    self.queue.add(other)

    async def _delete(self, record: Body, device_policy: policy.Policy | None) -> None:
        if not await self.writes.delete(record):
            return  # gone already
        ref = records.record_ref(record)
        if ref is not None:
            self.fleet.replace(ref, [])
            self._unwritten.pop(ref, None)
        log.info("signal record %s deleted: no observation for %s", record["metadata"]["name"],
                 records.format_duration(lifetime.recovery_of(device_policy).refault_window))

    async def _event(self, involved: Body, event_type: str, reason: str, message: str) -> None:
        try:
            await self.kube.post_event(involved, event_type, reason, message)
        except ApiError as exc:
            log.warning("could not post event %s on %s: %s", reason, involved["metadata"].get("name"), exc)

    def _report_later(self, body: Body, message: str, reason: str) -> None:
        """A Warning Event on the HealthPolicy, once per policy and message, posted by a task of its own."""
        marker = (str(body["metadata"].get("uid") or body["metadata"].get("name")), message)
        if marker in self._reported:
            return
        self._reported.add(marker)
        log.warning("HealthPolicy %s: %s", body["metadata"].get("name"), message)
        involved = {"apiVersion": POLICY_API, "kind": "HealthPolicy", "metadata": body["metadata"]}
        task = asyncio.get_running_loop().create_task(self._event(involved, "Warning", reason, message))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # --- a person's verified clear --------------------------------------------------------------

    async def _verified(self, record: Body | None, history: decide.History, merged: Sequence[Observation],
                        moment: datetime) -> datetime | None:
        """A person's verified clear not yet applied (after the history's boundary), or None; a bad one is
        reported once as a Warning Event on the record and ignored.

        The person verified what the record showed: the clear covers every observation it holds, whatever the
        clock of the machine that stamped it (a laptop behind the apiserver's would leave the fault it cleared
        counting). So the boundary is the later of the stamp and the newest observation. One later than
        claimwarden's clock applies once the clock reaches it (the queue looks again then)."""
        if record is None:
            return None
        at, problem = signal_records.verified_at(record)
        if problem:
            await self._invalid_verified_once(record, problem)
            return None
        if at is None:
            return None
        if at - moment > VERIFIED_AHEAD_MAX:
            problem = (f"annotation {signal_records.VERIFIED_ANNOTATION}={format_rfc3339(at)} is more than "
                       f"{records.format_duration(VERIFIED_AHEAD_MAX)} ahead of claimwarden's clock; it applies "
                       "only once that clock reaches it (kubectl claimwarden clear --verified stamps it right)")
            await self._invalid_verified_once(record, problem)
        at = max([at, *(o.at for o in merged)])
        if history.boundary is not None and at <= history.boundary:
            return None
        held = self.repair_gate.recovery_hold(record) if self.repair_gate is not None else None
        if held:
            log.info("record %s: the verified clear at %s waits: %s", record["metadata"]["name"], format_rfc3339(at),
                     held)
            assert self.repair_gate is not None
            await self.repair_gate.held(record, held)
            return None  # the hand-off brings the device back when the repair is cleared
        if at > moment:
            log.info("record %s: the verified clear at %s applies once this clock reaches it",
                     record["metadata"]["name"], format_rfc3339(at))
            ref = records.record_ref(record)
            if ref is not None:
                self.queue.add_after(ref, min(max((at - moment).total_seconds(), lifetime.REQUEUE_MIN),
                                                 lifetime.REQUEUE_MAX))
            return None
        return at

    async def _invalid_verified_once(self, record: Body, problem: str) -> None:
        marker = (str(record["metadata"].get("uid")), problem)
        if marker not in self._reported:
            self._reported.add(marker)
            await self._event(record, "Warning", INVALID_VERIFIED, problem)

