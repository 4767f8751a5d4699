"""One device at a time: collect its signals, route it to a policy, merge, decide, write its record.

The queue is keyed by DeviceRef. A reconcile reads everything level-based from the caches (the driver
taints of the device's complete pool, the KEP-4680 health of the pods holding it, the conditions of its
node) and takes the pushed observations (Alertmanager) that wait in memory until they are written. Of
those, only what a rule of the device's policy matches is written (and the healthy ones of a signal a
rule watches: recovery needs them); the rest is counted and remembered in memory, so that it is counted
once. The record is created only when a rule matched something; it is patched only when its status or
spec changed, so that a quiet device costs no write.

A recovered record stays (effect None, its history kept, so that a re-fault escalates) and is deleted
once its policy's refaultWindow has passed without a new observation.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Protocol, cast

from .. import metrics
from ..cache import Body, Cache, resource_version
from ..health import records, slice_marks
from ..health.records import DeviceRef
from ..kube.api import Kube
from ..kube.errors import ApiError
from ..objects.pods import PodView
from ..runtime.workqueue import Retry, WorkQueue
from ..timestamps import format_rfc3339, now
from . import decide, nodes, observations, podhealth, policy, taints
from . import records as signal_records
from .observations import HEALTHY, UNHEALTHY, UNKNOWN, Observation
from .policy_status import PolicyStatuses

log = logging.getLogger("claimwarden.signals")

RECORDS_API = f"{records.GROUP}/{records.VERSION}"
POLICY_API = "claimwarden.io/v1alpha1"
OBSERVE_TIMEOUT = 10.0  # seconds the webhook waits for its observations to be written (then 503: retried)
REQUEUE_MAX = 300.0  # seconds between looks at a record that waits for time to pass (hold, deletion)
REQUEUE_MIN = 1.0
INVALID_POLICY = "InvalidHealthPolicy"
POLICY_ERROR = "HealthPolicyEvaluationError"
INVALID_VERIFIED = "InvalidVerifiedClear"
WORKLOAD_FAULT = "WorkloadFault"
ORPHANED_MARK = "MarkWithoutRule"
VERIFIED_AHEAD_MAX = timedelta(minutes=5)
"""A verified clear stamped further ahead of claimwarden's clock than this is reported (a Warning Event)."""
BOUNDARY_KEPT = timedelta(hours=24)
"""A record with a person's verified clear is kept this long after it: what it cleared (an alert sent again by
Alertmanager, older than the boundary) must not come back as new on a fresh record."""


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
    """The signals' queue, the router over the HealthPolicies, the fleet view, and what waits in memory."""

    def __init__(self, *, cache: Cache, kube: Kube) -> None:
        self.cache = cache
        self.kube = kube
        self.queue = WorkQueue("signals")
        self._pushed: dict[DeviceRef, _Pending] = {}
        self._unwritten: dict[DeviceRef, list[Observation]] = {}
        """Observations collected but not written (no rule matched): remembered so that each is counted once."""
        self._written: dict[str, tuple[int, Body]] = {}
        self._spec_written: dict[str, tuple[int, Body]] = {}
        self._created: dict[str, Body] = {}
        """Record name -> the record as created here, until the cache has it."""
        """Record name -> (resourceVersion our last status write returned, that status), until the cache has it."""
        self._fleet: dict[tuple[str, str, str], dict[DeviceRef, datetime]] = {}
        """(source, signal, value) -> device -> its newest Unhealthy observation of it: the fleet view, by signal
        (a scan of every record's observations per decision was quadratic at 10,000 devices)."""
        self._fleet_signals: dict[DeviceRef, set[tuple[str, str, str]]] = {}
        self._fleet_seeded = False
        self._router: policy.Router | None = None
        self._router_key: tuple[Any, ...] | None = None
        self._generations: dict[str, int | None] = {}
        """HealthPolicy name -> the generation its last event showed (a status write changes no generation)."""
        self.statuses = PolicyStatuses(cache=cache, kube=kube, route_errors=lambda: self.router().errors)
        self._reported: set[tuple[str, str]] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        # What the last event of each object showed, to queue only the devices whose signals changed.
        self._slice_taints: dict[str, dict[str, list[Body]]] = {}
        self._pod_health: dict[str, frozenset[podhealth.DeviceHealth]] = {}
        self._node_conditions: dict[str, list[Body]] = {}
        self.repair_gate: RepairGate | None = None
        """The hand-off (handoff/controller.py): a verified clear waits while the record's repair is open."""

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
        found = {ref for record in self.cache.records() if signal_records.is_signal_record(record)
                 and (ref := records.record_ref(record)) is not None}
        found |= set(self._pushed)
        for slice_ in self.cache.resource_slices():
            driver = str(slice_["spec"].get("driver") or "")
            pool = slice_marks.slice_pool(slice_)
            for device in slice_["spec"].get("devices") or []:
                if any(t.get("key") != records.TAINT_KEY for t in device.get("taints") or []):
                    found.add(DeviceRef(driver, pool, str(device.get("name") or "")))
        for key in self.cache.pod_keys():
            pod = self.cache.pod(*key)
            if pod is not None:
                found |= {entry.ref for entry in podhealth.pod_device_health(pod)}
        watched = {rule.signal for p in self._policies() for rule in p.rules if rule.source == observations.SOURCE_NODE}
        if watched:
            for node_name in self.cache.node_names():
                conditions = self.cache.node_conditions(node_name)
                if any(c.get("type") in watched for c in conditions):
                    found |= set(nodes.devices_of_node(node_name, self.cache.resource_slices()))
        return found

    def enqueue_for_slice(self, name: str, slice_: Body, *, deleted: bool = False) -> None:
        """The slice's devices whose taints changed, and those with a signal record (a pool's completeness and
        generation are read from all its slices)."""
        now_taints = {} if deleted else _slice_taints(slice_)
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
        self._seed_fleet()
        moment = now()
        name = signal_records.signal_record_name(ref)
        record = self._record(name)
        status = self._status_of(name, record)
        written = signal_records.record_observations({"status": status}) if record is not None else []
        remembered = self._unwritten.get(ref, [])
        if record is not None and self._published(ref) is None:
            # Routing a device no slice lists (deleted with its node, or re-created under a new name in 1.37) would
            # decide its mark without its attributes: it is decided again when a slice lists it. Pushed observations
            # wait (the webhook answers 503 after OBSERVE_TIMEOUT; Alertmanager sends them again).
            log.debug("device %s: no slice lists it; its record %s is left as it is", ref, name)
            raise Retry(f"device {ref} is not published")
        device_policy = self._route(ref)

        collected, signalled = self._collect(ref, device_policy, [*written, *remembered], moment)
        collected += pushed
        fresh = _unique(o for o in collected if not _present(o, [*written, *remembered]))
        # What was remembered unwritten is looked at again: a policy may have come since that matches it.
        candidates = _unique(o for o in [*remembered, *fresh] if not _present(o, written))
        kept = [o for o in candidates if _kept(o, device_policy)]
        if record is None:  # a record is made for an Unhealthy observation a rule matched, never for the rest
            kept = kept if any(o.state == UNHEALTHY for o in kept) else []
        dropped = [o for o in candidates if o not in kept]
        for o in fresh:
            log.log(logging.INFO if o in kept else logging.DEBUG, "device %s: observed %s %s=%s %s at %s (%s)", ref,
                    o.source, o.signal, o.value, o.state, format_rfc3339(o.at),
                    "written" if o in kept else "not written: no rule of the device's policy matches it")
            metrics.SIGNAL_OBSERVATIONS.labels(o.source, o.state).inc()
            if o.state == UNKNOWN:
                metrics.SIGNAL_UNKNOWN.labels(ref.driver).inc()
            if o not in kept:
                metrics.SIGNAL_UNMATCHED.labels(o.source).inc()
        if dropped:
            self._unwritten[ref] = observations.merge([], dropped)[0]
        else:
            self._unwritten.pop(ref, None)

        merged, added = observations.merge(written, kept)
        if record is None and not added:
            self._set_fleet(ref, [])  # (a record deleted by someone else no longer counts)
            return  # nothing a rule of the device's policy watches: no record
        history = signal_records.record_history({"status": status})
        verified = await self._verified(record, history, merged, moment)
        self._set_fleet(ref, [o for o in merged if o.state == UNHEALTHY])
        decision = decide.decide(device_policy, merged, history, self._fleet_count, moment, verified_at=verified)
        if record is None:
            record = await self._create(ref, decision)
            status = {}
        try:
            await self._write(record, status, merged, decision, moment)
        except ApiError as exc:
            if not exc.not_found:
                raise
            # Deleted meanwhile (a person, or the refault window run out): its deletion event brings the device
            # back, and a signal still there makes a new record then.
            log.info("device %s: record %s deleted while it was being written", ref, record["metadata"]["name"])
            self._created.pop(record["metadata"]["name"], None)
            return
        self._count(decision, record, status)
        if decision.workload_fault and not (status.get("decision") or {}).get("workloadFault"):
            await self._workload_fault(record, ref, decision)
        if decision.orphaned and not (status.get("decision") or {}).get("orphaned"):
            metrics.SIGNAL_ORPHANED.inc()
            await self._event(record, "Warning", ORPHANED_MARK, decision.why)
            log.warning("device %s: %s", ref, decision.why)
        if await self._delete_if_done(record, merged, decision, device_policy, bool(added) or signalled, moment):
            return
        delay = _next_look(merged, decision, device_policy, moment, deletable=not signalled)
        if delay is not None:
            self.queue.add_after(ref, delay)

    def _record(self, name: str) -> Body | None:
        """The record from the cache, or the one created here that the watch has not brought yet (without it, a
        second signal meanwhile tried to create it again: a 409 and a retry per device in a burst)."""
        cached = self.cache.record(name)
        if cached is not None:
            self._created.pop(name, None)
            return cached
        return self._created.get(name)

    def _status_of(self, name: str, record: Body | None) -> Body:
        """The record's status, or what we last wrote while the watch has not brought it back."""
        status = dict((record or {}).get("status") or {})
        written = self._written.get(name)
        if record is None:
            self._written.pop(name, None)
            self._spec_written.pop(name, None)
            return status
        if written is not None:
            if resource_version(record) < written[0]:
                return {**status, **written[1]}
            del self._written[name]
        return status

    def _collect(self, ref: DeviceRef, device_policy: policy.Policy | None, previous: Sequence[Observation],
                 moment: datetime) -> tuple[list[Observation], bool]:
        """The level-based observations of the device now (the sources keep only what `previous` lacks), and
        whether a fault is still signalled now (a driver taint, a pod's report other than Healthy, a node
        condition a rule names, or a pool too incomplete to tell): its record must not be deleted then, or
        the fault would come back as new, without the record's history (its boundary, its clears)."""
        found: list[Observation] = []
        pool_slices = taints.complete_pools(self.cache.resource_slices_of_pool(ref.driver, ref.pool)).get(
            (ref.driver, ref.pool))
        device_taints: list[Mapping[str, Any]] | None = None
        if pool_slices is not None:
            device_taints = taints.device_taints(pool_slices).get(ref)
        signalled = device_taints is None or any(t.get("key") != records.TAINT_KEY for t in device_taints)
        found += taints.taint_observations(ref, device_taints, previous, moment)
        entries = [entry for pod in self._pods_holding(ref) for entry in podhealth.pod_device_health(pod)
                   if entry.ref == ref]
        signalled = signalled or any(entry.health != HEALTHY for entry in entries)
        found += podhealth.pod_health_observations(entries, previous, moment)
        node_rules = [rule for rule in device_policy.rules if rule.source == observations.SOURCE_NODE] \
            if device_policy is not None else []
        node_name = self._node_of(ref) if node_rules else ""
        if node_name:  # only for a policy that watches them: every node has a handful of conditions
            conditions = nodes.condition_observations(node_name, self.cache.node_conditions(node_name))
            signalled = signalled or any(rule.matches(o) for o in conditions for rule in node_rules)
            found += conditions
        return found, signalled

    def _published(self, ref: DeviceRef) -> Mapping[str, Any] | None:
        """The device as a slice in the cache lists it, or None."""
        for slice_ in self.cache.resource_slices_of_pool(ref.driver, ref.pool):
            for device in slice_["spec"].get("devices") or []:
                if device.get("name") == ref.device:
                    return cast(Mapping[str, Any], device)
        return None

    def _pods_holding(self, ref: DeviceRef) -> list[Body]:
        pods: dict[tuple[str, str], Body] = {}
        for claim in self.cache.claims_holding((ref.driver, ref.pool, ref.device)):
            namespace = claim["metadata"].get("namespace") or ""
            for entry in (claim.get("status") or {}).get("reservedFor") or []:
                if entry.get("resource") == "pods" and (pod := self.cache.pod(namespace, entry.get("name", ""))):
                    pods[(namespace, pod["metadata"]["name"])] = pod
        return [pods[k] for k in sorted(pods)]

    def _node_of(self, ref: DeviceRef) -> str:
        for slice_ in self.cache.resource_slices_of_pool(ref.driver, ref.pool):
            if ref in nodes.devices_of_node(str(slice_["spec"].get("nodeName") or ""), [slice_]):
                return str(slice_["spec"].get("nodeName") or "")
            for device in slice_["spec"].get("devices") or []:
                if device.get("name") == ref.device and device.get("nodeName"):
                    return str(device["nodeName"])
        return ""

    def _device(self, ref: DeviceRef) -> Mapping[str, Any]:
        return self._published(ref) or {"name": ref.device}

    # --- policies -------------------------------------------------------------------------------

    def _policies(self) -> list[policy.Policy]:
        parsed = []
        for body in self.cache.health_policies():
            found, errors = policy.parse_policy(body)
            if found is not None:
                parsed.append(found)
            for error in errors:
                self._report_later(body, error)
        return parsed

    def router(self) -> policy.Router:
        """The router over the policies and DeviceClasses in the cache, built again when a policy's spec (its
        generation: not its status) or a DeviceClass's selectors changed."""
        bodies = self.cache.health_policies()
        classes = self.cache.device_class_selectors()
        key = (tuple(sorted((b["metadata"].get("name"), b["metadata"].get("uid"), b["metadata"].get("generation"))
                            for b in bodies)),
               tuple(sorted((k, tuple(v)) for k, v in classes.items())))
        if self._router is None or key != self._router_key:
            self._router = policy.Router(self._policies(), classes)
            self._router_key = key
            for policy_name, why in sorted(self._router.errors.items()):
                body = next((b for b in bodies if b["metadata"].get("name") == policy_name), None)
                if body is not None:
                    self._report_later(body, why)
        return self._router

    def _route(self, ref: DeviceRef) -> policy.Policy | None:
        router = self.router()
        before = len(router.runtime_errors)
        found = router.route(ref.driver, ref.pool, self._device(ref))
        if len(router.runtime_errors) > before:  # a CEL error on this device: once per policy and device
            for (policy_name, _), why in list(router.runtime_errors.items())[before:]:
                body = next((b for b in self.cache.health_policies() if b["metadata"].get("name") == policy_name),
                            None)
                if body is not None:
                    self._report_later(body, f"{why}; the device is not routed to this policy", POLICY_ERROR)
        return found

    def _report_later(self, body: Body, message: str, reason: str = INVALID_POLICY) -> None:
        marker = (str(body["metadata"].get("uid") or body["metadata"].get("name")), message)
        if marker in self._reported:
            return
        self._reported.add(marker)
        log.warning("HealthPolicy %s: %s", body["metadata"].get("name"), message)
        involved = {"apiVersion": POLICY_API, "kind": "HealthPolicy", "metadata": body["metadata"]}
        task = asyncio.get_running_loop().create_task(self._event(involved, "Warning", reason, message))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # --- the fleet view (workload faults) -------------------------------------------------------

    def _seed_fleet(self) -> None:
        """Once: the Unhealthy observations of every signal record in the cache (then kept by the reconciles)."""
        if self._fleet_seeded:
            return
        self._fleet_seeded = True
        for record in self.cache.records():
            if signal_records.is_signal_record(record) and (ref := records.record_ref(record)) is not None:
                self._set_fleet(ref, [o for o in signal_records.record_observations(record) if o.state == UNHEALTHY])

    def _set_fleet(self, ref: DeviceRef, faults: Iterable[Observation]) -> None:
        """The device's Unhealthy observations in the fleet view, in place of what it had there."""
        newest: dict[tuple[str, str, str], datetime] = {}
        for o in faults:
            signal = (o.source, o.signal, o.value)
            newest[signal] = max(o.at, newest.get(signal, o.at))
        for signal in self._fleet_signals.pop(ref, set()) - set(newest):
            devices = self._fleet.get(signal, {})
            devices.pop(ref, None)
            if not devices:
                self._fleet.pop(signal, None)
        for signal, at in newest.items():
            self._fleet.setdefault(signal, {})[ref] = at
        if newest:
            self._fleet_signals[ref] = set(newest)

    def _fleet_count(self, source: str, signal: str, value: str, since: datetime) -> int:
        return sum(1 for at in self._fleet.get((source, signal, value), {}).values() if at >= since)

    def _fleet_devices(self, source: str, signal: str) -> list[DeviceRef]:
        return sorted({ref for (s, g, _), devices in self._fleet.items() if (s, g) == (source, signal)
                       for ref in devices}, key=str)

    async def _event(self, involved: Body, event_type: str, reason: str, message: str) -> None:
        try:
            await self.kube.post_event(involved, event_type, reason, message)
        except ApiError as exc:
            log.warning("could not post event %s on %s: %s", reason, involved["metadata"].get("name"), exc)

    # --- writes ---------------------------------------------------------------------------------

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
            marker = (str(record["metadata"].get("uid")), problem)
            if marker not in self._reported:
                self._reported.add(marker)
                await self._event(record, "Warning", INVALID_VERIFIED, problem)
            return None
        if at is None:
            return None
        if at - moment > VERIFIED_AHEAD_MAX:
            problem = (f"annotation {signal_records.VERIFIED_ANNOTATION}={format_rfc3339(at)} is more than "
                       f"{records.format_duration(VERIFIED_AHEAD_MAX)} ahead of claimwarden's clock; it applies "
                       "only once that clock reaches it (kubectl claimwarden clear --verified stamps it right)")
            marker = (str(record["metadata"].get("uid")), problem)
            if marker not in self._reported:
                self._reported.add(marker)
                await self._event(record, "Warning", INVALID_VERIFIED, problem)
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
                self.queue.add_after(ref, min(max((at - moment).total_seconds(), REQUEUE_MIN), REQUEUE_MAX))
            return None
        return at

    async def _create(self, ref: DeviceRef, decision: decide.Decision) -> Body:
        body = signal_records.record_body(ref, signal_records.desired_spec(decision))
        try:
            created = await self.kube.create_cluster_object(RECORDS_API, records.PLURAL, body)
        except ApiError as exc:
            if exc.status == 409:  # made by an earlier reconcile the cache has not brought yet
                raise Retry(f"record {body['metadata']['name']} exists but is not in the cache yet") from exc
            raise
        log.info("device %s: signal record %s created: %s", ref, body["metadata"]["name"], decision.why)
        self._created[body["metadata"]["name"]] = created
        return created

    async def _write(self, record: Body, status: Body, merged: Sequence[Observation], decision: decide.Decision,
                     moment: datetime) -> None:
        name = record["metadata"]["name"]
        desired = signal_records.desired_status(merged, decision, status, moment)
        if any(status.get(k) != v for k, v in desired.items()):
            result = await self.kube.merge_patch_cluster_object(
                RECORDS_API, records.PLURAL, name, {"status": _patch(status, desired)}, subresource="status")
            self._written[name] = (resource_version(result), desired)
        spec = signal_records.desired_spec(decision)
        current = record.get("spec") or {}
        written = self._spec_written.get(name)
        if written is not None and resource_version(record) < written[0]:
            current = {**current, **written[1]}  # the watch has not brought our last spec patch back yet
        if any(current.get(k) != v for k, v in spec.items()):
            result = await self.kube.merge_patch_cluster_object(RECORDS_API, records.PLURAL, name, {"spec": spec})
            self._spec_written[name] = (resource_version(result), spec)
            log.info("signal record %s: effect %s (%s)", name, decision.effect, decision.why)

    def _count(self, decision: decide.Decision, record: Body, status: Body) -> None:
        before = status.get("decision") or {}
        if (before.get("rule"), before.get("effect"), before.get("mode")) != (
                decision.rule, decision.effect, decision.mode) and decision.rule is not None:
            metrics.POLICY_DECISIONS.labels(decision.policy or "", decision.rule, decision.effect, decision.mode).inc()
        before_recovery = signal_records.record_history({"status": status})
        if decision.recovered and len(decision.history.clears) > len(before_recovery.clears):
            source = next((r.source for p in self._policies() if p.name == decision.policy for r in p.rules
                           if r.name == before_recovery.rule), "verified")
            metrics.SIGNAL_RECOVERIES.labels(source).inc()
        elif decision.recovered and decision.history.boundary != before_recovery.boundary:
            metrics.SIGNAL_RECOVERIES.labels("verified").inc()
        if decision.escalated and not before_recovery.escalated:
            metrics.SIGNAL_ESCALATIONS.inc()

    async def _workload_fault(self, record: Body, ref: DeviceRef, decision: decide.Decision) -> None:
        metrics.WORKLOAD_FAULTS.labels(decision.policy or "", decision.rule or "").inc()
        await self._event(record, "Warning", WORKLOAD_FAULT, decision.why)
        log.warning("device %s: %s", ref, decision.why)
        rule = next((r for p in self._policies() if p.name == decision.policy for r in p.rules
                     if r.name == decision.rule), None)
        if rule is not None:  # the other devices of the same signal are decided again
            for other in self._fleet_devices(rule.source, rule.signal):
                if other != ref:
                    self.queue.add(other)

    async def _delete_if_done(self, record: Body, merged: Sequence[Observation], decision: decide.Decision,
                              device_policy: policy.Policy | None, busy: bool, moment: datetime) -> bool:
        """A recovered (or never marked) record with no observation for refaultWindow, no fault signalled now
        (`busy`: also when something was just added) and no verified clear within BOUNDARY_KEPT is deleted."""
        history = decision.history
        if busy or decision.effect != "None" or history.marked_since is not None or history.escalated:
            return False
        window = (device_policy.recovery if device_policy else policy.Recovery()).refault_window
        newest = max((o.at for o in merged), default=None)
        if newest is not None and moment - newest < window:
            return False
        if history.boundary is not None and moment - history.boundary < BOUNDARY_KEPT:
            return False  # an alert still firing is sent again (Alertmanager's repeat_interval): it is older
        meta = record["metadata"]
        try:
            await self.kube.delete_cluster_object(RECORDS_API, records.PLURAL, meta["name"], uid=meta.get("uid"),
                                                  resource_version=meta.get("resourceVersion"))
        except ApiError as exc:
            if exc.status == 404:
                return True
            if not exc.conflict:
                raise
            raise Retry(f"record {meta['name']} changed since it was read") from exc
        self._created.pop(meta["name"], None)
        ref = records.record_ref(record)
        if ref is not None:
            self._set_fleet(ref, [])
            self._unwritten.pop(ref, None)
        log.info("signal record %s deleted: no observation for %s", meta["name"], records.format_duration(window))
        return True


def _slice_taints(slice_: Body) -> dict[str, list[Body]]:
    return {str(d.get("name") or ""): list(d.get("taints") or [])
            for d in (slice_.get("spec") or {}).get("devices") or [] if d.get("taints")}


def _patch(current: Mapping[str, Any], desired: Mapping[str, Any]) -> dict[str, Any]:
    """A merge patch from `current` to `desired`: a merge patch merges nested objects, so a field that the desired
    status.recovery or status.decision lacks (markedSince once a mark recovered) is removed with an explicit null."""
    patch: dict[str, Any] = {}
    for key, value in desired.items():
        before = current.get(key)
        if isinstance(value, Mapping) and isinstance(before, Mapping):
            value = {**{k: None for k in before if k not in value}, **value}
        patch[key] = value
    return patch


def _unique(found: Iterable[Observation]) -> list[Observation]:
    """Each (key, state) once, the first kept."""
    seen: set[tuple[str, str]] = set()
    unique = []
    for o in found:
        if (o.key, o.state) not in seen:
            seen.add((o.key, o.state))
            unique.append(o)
    return unique


def _present(o: Observation, among: Iterable[Observation]) -> bool:
    return any(o.key == other.key and o.state == other.state for other in among)


def _kept(o: Observation, device_policy: policy.Policy | None) -> bool:
    """Written to the record: a rule of the device's policy matches it, or it is the healthy or unknown side of
    a signal a rule watches (a taint removed, Healthy after Unhealthy, Unknown: recovery and its hold are decided
    on them, whatever values the rule names)."""
    if device_policy is None:
        return False
    if any(rule.matches(o) for rule in device_policy.rules):
        return True
    return o.state in (HEALTHY, UNKNOWN) and any(rule.source == o.source and rule.signal == o.signal
                                                 for rule in device_policy.rules)


def _next_look(merged: Sequence[Observation], decision: decide.Decision, device_policy: policy.Policy | None,
               moment: datetime, *, deletable: bool) -> float | None:
    """Seconds until time alone may change the decision: a PodStatus hold running out, the record's deletion
    (only for a record that may be deleted: no mark held, no fault signalled now; else a change of its signals
    brings the device back, and a look every second at a held mark was a loop)."""
    recovery = device_policy.recovery if device_policy else policy.Recovery()
    waits: list[timedelta] = []
    if decision.recheck_at is not None:
        waits.append(decision.recheck_at - moment)
    newest = max((o.at for o in merged), default=None)
    history = decision.history
    if deletable and newest is not None and decision.effect == "None" and history.marked_since is None \
            and not history.escalated:
        deletion = newest + recovery.refault_window
        if history.boundary is not None:
            deletion = max(deletion, history.boundary + BOUNDARY_KEPT)
        waits.append(deletion - moment)
    if not waits:
        return None
    return min(max(min(waits).total_seconds(), REQUEUE_MIN), REQUEUE_MAX)
