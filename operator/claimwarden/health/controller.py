"""health: one UnhealthyDevice record at a time, plus the wiring of marks, quarantine and evictions.

Three queues: slices (``marks``), records (here: quarantine, taint rule, status, which pods to
evict and when) and evictions (``evictions``, one key per pod). The decisions are in records.py,
tolerations.py, plan.py and breaker.py.

A record's reconcile (``reconcile_record``) reads top to bottom: plan the record, judge its approval
(approval_judge.py), ask the breaker (breaker_view.py), schedule the evictions, sync the device's
quarantine claim (device_sync.py) and taint rule, write the status (status_writes.py). Each of those
modules owns the in-memory map it needs; this one owns only which device each record names and which
claims held it (holder_index.py).

The breaker is decided per driver over all NoExecute records at once from totals kept up to date as
their inputs change (breaker_view.py): each record reconcile leaves the pods it would evict there, each
eviction its entry in the window (seeded from one live LIST of the records, and written ahead of each
eviction while the breaker is on: window.py), and each claim event the pods holding the claim's
devices. A record reconcile schedules its evictions only while the breaker has room; the eviction worker
asks again right before the call and takes the room then, so a stale view here can delay an eviction but
never let one more through.
"""

from __future__ import annotations

import dataclasses
import datetime
import logging
import time
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import cast

from .. import metrics
from ..cache import Body, Cache
from ..kube.api import Kube
from ..kube.errors import ApiError
from ..objects.claims import allocated_devices
from ..objects.pods import PodView
from ..runtime.workqueue import WorkQueue
from ..timestamps import now
from . import breaker, node_drain, plan, records
from .approval_judge import ApprovalJudge
from .breaker_view import Breakers
from .budget import DEFAULT_BURST, DEFAULT_QPS, DEFAULT_RETRY_QPS, RETRY_BURST, FairBudget, TokenBucket
from .device_sync import QUARANTINE_EFFECTS, DeviceSync
from .evictions import Evictions
from .holder_index import HolderIndex
from .marks import Marks
from .quarantine import Quarantine
from .record_status import settling
from .records import DeviceRef
from .sibling_records import SiblingRecords
from .status_writes import StatusWrites
from .taint_rules import UnselectiveRules
from .tolerations import copies_tolerations
from .wave import Wave

log = logging.getLogger("claimwarden.health")

IN_FLIGHT_RECHECK = 5.0  # seconds: a record held back only by evictions in flight is looked at again
COPIES_RESCAN = 30.0  # seconds between scans of all claims for copied tolerations, until one is found
RULE_DEFER_MAX = 30.0  # seconds after the mark a DeviceTaintRule may wait for the record's evictions
NODE_DRAIN_RECHECK = 1.0  # seconds between looks at a drain Node record's node until it is empty


@dataclass(frozen=True)
class HealthSettings:
    """What `claimwarden run` was told about evicting (docs/concepts/safety.md)."""

    breaker: breaker.Settings = field(default_factory=breaker.Settings)
    eviction_qps: float = DEFAULT_QPS
    eviction_burst: int = DEFAULT_BURST
    eviction_retry_qps: float = DEFAULT_RETRY_QPS
    """Retries of evictions a PodDisruptionBudget refused take tokens from a budget of their own (budget.py)."""
    workers: int = 32
    """Workers of the record and the eviction queues: a burst of marks is mostly waiting on round trips."""
    claim_deletion_wakes_pods: bool = False
    """kube-scheduler retries pending pods when an allocated claim is deleted (1.37+,
    ``plan.scheduler_retries_on_claim_deletion``): rule 4 of the quarantine trap applies (health/__init__.py)."""


class HealthController:
    def __init__(self, cache: Cache, kube: Kube, namespace: str, settings: HealthSettings | None = None) -> None:
        self.cache = cache
        self.kube = kube
        self.namespace = namespace
        self.settings = settings or HealthSettings()
        self.record_queue = WorkQueue("health-records")
        self.approvals = ApprovalJudge(cache=cache, kube=kube, post_event=self._event, look_again=self.record_queue.add)
        self.marks = Marks(cache=cache, kube=kube, post_event=self._event)
        self.quarantine = Quarantine(cache=cache, kube=kube, namespace=namespace)
        self.devices = DeviceSync(cache=cache, kube=kube, quarantine=self.quarantine, look_again=self.record_queue.add)
        self.siblings = SiblingRecords(cache=cache, kube=kube, post_event=self._event)
        # The breakers and the evictions ask each other (room in flight, decisions): the lambdas read
        # self.evictions at call time, after both are built.
        self.breakers = Breakers(
            cache=cache, namespace=namespace, settings=self.settings.breaker, approved=self.approvals.approved,
            in_flight=lambda driver: self.evictions.in_flight(driver),
            recent=lambda record: self.evictions.recent(record), look_again=self.record_queue.add,
            post_event=self._event)
        self.evictions = Evictions(
            kube=kube, cache=cache, post_event=self._event, on_evicted=self.record_queue.add_after,
            breaker_settings=self.settings.breaker,
            budget=FairBudget(TokenBucket(qps=self.settings.eviction_qps, burst=self.settings.eviction_burst)),
            retry_budget=FairBudget(TokenBucket(qps=self.settings.eviction_retry_qps, burst=RETRY_BURST)),
            decide=self.breakers.decision, approved=self.approvals.approved,
            on_paused=lambda name, decision: self.record_queue.add_after(name, _until_room(decision, now())),
            on_recent=self.breakers.add_recent)
        self.unselective_rules = UnselectiveRules(kube, self.quarantine.taint_rule_api,
                                                  self.quarantine.taint_rule_api_gone)
        self.wave = Wave(lambda: self.evictions.queue.busy)
        self.statuses = StatusWrites(kube=kube, evictions=self.evictions, approvals=self.approvals,
                                     siblings=self.siblings, wave=self.wave,
                                     look_again_after=self.record_queue.add_after)
        self.holders = HolderIndex()
        self._node_drain_seen: dict[str, tuple[frozenset[str], frozenset[str]]] = {}  # drain Node (node_drain.py)
        # Which device each record names, to find its siblings (and its quarantine claim) once it is gone.
        self._record_devices: dict[str, DeviceRef] = {}
        # Whether the server's allocator copies tolerations into allocation results (tolerations.py):
        # once one copy was seen it stays true; until then all claims are scanned now and then.
        self._copies_tolerations = False
        self._copies_scanned = -COPIES_RESCAN

    @property
    def slice_queue(self) -> WorkQueue:
        return self.marks.queue

    @property
    def eviction_queue(self) -> WorkQueue:
        return self.evictions.queue

    # --- entry points from events -----------------------------------------------------------

    def enqueue_slice(self, name: str, body: Body | None = None) -> None:
        """A slice changed (`body` from its event), or every slice is queued again (no body: a replica that
        starts to lead, a resync); then the cache's copy plans its pool's derived records."""
        self.marks.queue.add(name)
        body = body if body is not None else self.cache.resource_slice(name)
        if body is not None:
            self.siblings.enqueue_slice(body)

    def enqueue_record(self, name: str, body: Body | None = None) -> None:
        record = self.cache.record(name)
        if record is not None and self.breakers.records_seeded:
            self.breakers.note_record(record)
        self.record_queue.add(name)
        body = body if body is not None else record
        if body is not None:  # (also when it is gone: its siblings' derived records go with it)
            self.siblings.enqueue_record(body)

    def enqueue_for_claim(self, namespace: str, name: str, body: Body, *, deleted: bool = False) -> None:
        """A claim changed: look again at records whose device it holds or held."""
        self.breakers.claim_changed((namespace, name), body, deleted=deleted)
        names = self.holders.records_of((namespace, name))
        if not self._copies_tolerations and copies_tolerations([body]):
            self._note_copies()
        for device in allocated_devices(body):
            names.update(r["metadata"]["name"] for r in self._records_for(DeviceRef(*device)))
        for record in names:
            if self.cache.record(record) is not None:
                self.record_queue.add(record)

    def enqueue_for_pod(self, pod: PodView) -> None:
        """A pod changed (bound to a node, say): look again at the records of the devices it uses.

        A claim is reserved before its pod is bound, so a pod on a marked device becomes evictable
        only with the pod's own update, not the claim's.
        """
        for claim_name in pod.claim_names:
            claim = self.cache.claim(pod.namespace, claim_name)
            if claim is not None:
                self.enqueue_for_claim(pod.namespace, claim_name, claim)

    def server_copies_tolerations(self) -> bool:
        """True once an allocation result with tolerations was seen (a scan of all claims every COPIES_RESCAN s)."""
        if not self._copies_tolerations and time.monotonic() - self._copies_scanned >= COPIES_RESCAN:
            self._copies_scanned = time.monotonic()
            if copies_tolerations(self.cache.claims()):
                self._note_copies()
        return self._copies_tolerations

    def _note_copies(self) -> None:
        self._copies_tolerations = True
        log.info("allocation results carry tolerations: eviction honours those, never the claims' requests")

    def release_held(self, claim: Body) -> bool:
        """True when the release of a claim should wait for the wave of evictions under way (wave.py): only
        claims on quarantined devices, which stay held by their allocation meanwhile."""
        meta = claim.get("metadata") or {}
        return self.quarantined(claim) and self.wave.holds(("claim", meta.get("namespace"), meta.get("name")))

    def keeps_allocation(self, claim: Body) -> bool:
        """Rule 4 of the quarantine trap (health/__init__.py): a generated claim on a quarantined device keeps its
        allocation until the mark is cleared, where the scheduler retries pending pods on any release of the
        device (1.37+) and no DeviceTaintRule keeps them off it meanwhile (not served, or not known yet)."""
        return self.settings.claim_deletion_wakes_pods and not self.quarantine.taint_rules_served() and \
            self.quarantined(claim)

    def quarantined(self, claim: Body) -> bool:
        """True if the claim holds a device that a NoExecute or NoSchedule record quarantines."""
        return any(records.record_effect(record) in QUARANTINE_EFFECTS
                   for device in allocated_devices(claim) for record in self._records_for(DeviceRef(*device)))

    def _records_for(self, ref: DeviceRef) -> list[Body]:
        return self.devices.records_for(ref)

    def record_names(self) -> list[str]:
        return [r["metadata"]["name"] for r in self.cache.records()]

    async def release_orphaned_quarantine(self) -> None:
        await self.quarantine.release_orphans()

    # --- samples for the metrics ------------------------------------------------------------

    def device_samples(self) -> list[metrics.DeviceSample]:
        """Every published device with its state, for the device gauges."""
        tainted = {ref for r in self.cache.records() if records.record_effect(r) in QUARANTINE_EFFECTS
                   and (ref := records.record_ref(r)) is not None}
        allocated = {DeviceRef(*device) for claim in self.cache.claims()
                     if not plan.is_quarantine_claim(claim, self.namespace) for device in allocated_devices(claim)}
        samples = []
        for slice_ in self.cache.resource_slices():
            spec = slice_.get("spec") or {}
            driver, pool = spec.get("driver") or "", (spec.get("pool") or {}).get("name") or ""
            for device in spec.get("devices") or []:
                ref = DeviceRef(driver, pool, device.get("name") or "")
                state = "tainted" if ref in tainted else "allocated" if ref in allocated else "free"
                samples.append(metrics.DeviceSample(driver, state))
        return samples

    def pending_evictions(self) -> int:
        return sum(int((r.get("status") or {}).get("podsPending") or 0) for r in self.cache.records()
                   if records.record_effect(r) == "NoExecute")

    def unselective_taint_rules(self) -> int | None:
        return self.unselective_rules.count

    def record_effects(self) -> list[str]:
        return [records.record_effect(r) for r in self.cache.records()]

    # --- records ------------------------------------------------------------------------------

    async def reconcile_record(self, key: Hashable) -> None:
        """One record: plan it, evict its pods as far as the breaker allows, then sync the device's quarantine
        claim and taint rule, and write the record's status."""
        name = cast(str, key)
        await self.evictions.seed()  # the first time: the records' counts read live, before any decision
        record = self.cache.record(name)
        if record is None:
            await self._record_gone(name)
            return
        moment = now()
        if records.is_expired(record, moment):
            await self.kube.delete_cluster_object(records.API_VERSION, records.PLURAL, name)
            log.info("record %s expired and was removed", name)
            return
        expires = records.expires_at(record)
        if expires is not None:
            self.record_queue.add_after(name, (expires - moment).total_seconds() + 0.5)
        ref = records.record_ref(record)
        if ref is None:
            return
        seen_holders = self.holders.seen(record)
        marked_at = records.marked_at(record) or moment
        planned = time.monotonic()  # the device's quarantine sync ignores a plan older than the last it used
        record_plan = await self._plan(record, ref, marked_at)
        holders = set(record_plan.holders)
        self.holders.link(name, holders, seen_holders)
        # The evictions go first; quarantine, rule and status follow (none of them protects anything while
        # the pods to evict still hold the device, docs/concepts/device-health.md "Keeping new work away").
        verdict = await self.approvals.judge(record)
        approved = verdict.honoured
        decision = self.breakers.for_record(record, ref, record_plan, approved)
        evicting_now = self._schedule_evictions(name, record_plan, decision, approved=approved, moment=moment)
        await self.breakers.note(decision, record)
        self._record_devices[name] = ref
        quarantine = await self.devices.sync(record, ref, record_plan, planned)
        self.holders.remember(name, holders)
        # The rule waits for evictions under way, not for ones held back, and not for long.
        blocked = self.evictions.blocked(name)
        # Not where the scheduler retries pending pods on a claim's deletion (1.37+): the evicted pods' claims may
        # go before the rule is there, and the rule is what keeps those pods off the device then (rule 4).
        defer_rule = evicting_now and not blocked and not self.settings.claim_deletion_wakes_pods and \
            (moment - marked_at).total_seconds() < RULE_DEFER_MAX
        rule = await self.quarantine.sync_taint_rule(record, needed=record_plan.quarantine_needed, defer=defer_rule)
        paused = decision.reason if decision.open and approved is None and record_plan.evict else ""
        held_back = bool(paused) or blocked
        await self.statuses.write(record, marked_at, record_plan, quarantine, rule, paused=paused, verdict=verdict,
                                  held_back=held_back,
                                  settle=settling(record_plan, evicting_now=evicting_now, held_back=held_back))

    async def _record_gone(self, name: str) -> None:
        """The record is gone: forget it, let a breaker close, and release its device's quarantine (device_sync.py)."""
        ref = self._record_devices.get(name) or self.quarantine.device_labelled(records.label_value(name))
        self._forget_record(name)
        await self.breakers.record_gone()
        await self.devices.record_gone(name, ref)
        self._record_devices.pop(name, None)  # only now: a retry after a failed release must still know the device

    async def _plan(self, record: Body, ref: DeviceRef, marked_at: datetime.datetime) -> plan.RecordPlan:
        """The record's plan (plan.py) on the cache as it is now; under drain Node, its node's drain."""
        holding = self.cache.claims_holding((ref.driver, ref.pool, ref.device))
        # Pods evicted moments ago count as gone at once: their count and podsPending then go out in one write.
        record_plan = plan.plan_record(record, holding, self.cache.pods(), marked_at, self.namespace,
                                       server_copies_tolerations=self.server_copies_tolerations(),
                                       evicted=self.evictions.evicted_pods(),
                                       podgroup_members=self.cache.pods_in_podgroup)
        if records.record_drain(record).mode == records.DRAIN_NODE and records.record_effect(record) == "NoExecute":
            record_plan = await self._drain_node(record["metadata"]["name"], ref, record_plan, marked_at)
        return record_plan

    def _schedule_evictions(self, name: str, record_plan: plan.RecordPlan, decision: breaker.Decision, *,
                            approved: str | None, moment: datetime.datetime) -> bool:
        """Queue the record's evictions while the breaker has room (or its approval counts), else look at the
        record again when the window frees room; True when one of them is due now."""
        evicting = decision.allows() or approved is not None
        if evicting:
            for eviction in record_plan.evict:
                self.evictions.schedule(name, eviction, moment)
        else:  # look again when the window frees room (or soon, when only evictions in flight fill it)
            # Held back by an open breaker before they reached the eviction queue: counted as the queue counts
            # its own (not when evictions in flight only fill the room for a moment: those go on at once).
            if decision.open:
                metrics.EVICTIONS_DEFERRED.labels("breaker").inc(len(record_plan.evict))
            self.record_queue.add_after(name, _until_room(decision, moment))
        return evicting and any(eviction.due <= moment for eviction in record_plan.evict)

    async def _drain_node(self, name: str, ref: DeviceRef, record_plan: plan.RecordPlan,
                          marked_at: datetime.datetime) -> plan.RecordPlan:
        """drain Node: the record's evictions are those of its node's drain at the step it is at (node_drain.py),
        looked at again every NODE_DRAIN_RECHECK s until the node is empty (the claims it waits for are not the
        record's, so their events do not bring it back). A device tied to no one node drains as Immediate."""
        node = plan.slice_node(self.cache.resource_slices_of_pool(ref.driver, ref.pool), ref)
        if node is None:
            return record_plan
        evicted = self.evictions.evicted_pods()
        claims = list(self.cache.claims())
        known = [pod for key in self.cache.pod_keys() if (pod := self.cache.pod(*key)) is not None
                 and (pod.get("spec") or {}).get("nodeName") == node]
        seen_pods, seen_claims = self._node_drain_seen.get(name, (frozenset(), frozenset()))
        current = node_drain.plan_node_drain(node, known, claims, marked_at, evicted=evicted, seen_pods=seen_pods,
                                             seen_claims=seen_claims, claimwarden_namespace=self.namespace)
        if current.needs_other_pods:
            current = node_drain.plan_node_drain(node, await self.kube.list_pods_on_node(node), claims, marked_at,
                                                 evicted=evicted, seen_pods=current.seen_pods,
                                                 seen_claims=current.seen_claims, claimwarden_namespace=self.namespace)
        self._node_drain_seen[name] = (current.seen_pods, current.seen_claims)
        if current.step < 5:
            self.record_queue.add_after(name, NODE_DRAIN_RECHECK)
        return dataclasses.replace(record_plan, evict=current.evict, pending=current.pending)

    async def flush(self) -> None:
        """At shutdown, once the workers have stopped: write what lives only in memory (eviction counts)."""
        await self.statuses.flush()

    def _forget_record(self, name: str) -> None:
        self._node_drain_seen.pop(name, None)
        self.approvals.forget(name)
        self.statuses.forget(name)
        self.breakers.forget(name)
        self.evictions.forget(name)
        self.holders.forget(name)

    async def _event(self, involved: Body, event_type: str, reason: str, message: str) -> None:
        try:
            await self.kube.post_event(involved, event_type, reason, message)
        except ApiError as exc:
            log.warning("could not post event %s on %s: %s", reason, involved["metadata"].get("name"), exc)


def _until_room(decision: breaker.Decision, moment: datetime.datetime) -> float:
    """Seconds until the breaker may have room again."""
    if decision.frees_at is None:
        return IN_FLIGHT_RECHECK
    return max((decision.frees_at - moment).total_seconds(), 0.0) + 1
