"""health: one UnhealthyDevice record at a time, plus the wiring of marks, quarantine and evictions.

Three queues: slices (``marks``), records (here: quarantine, taint rule, status, which pods to
evict and when) and evictions (``evictions``, one key per pod). The decisions are in records.py,
tolerations.py, plan.py and breaker.py.

The breaker is decided per driver over all NoExecute records at once (``decision``) from totals kept
up to date as their inputs change (breaker_view.py): each record reconcile leaves the pods it would
evict there, each eviction its entry in the window (seeded from one live LIST of the records, and
written ahead of each eviction while the breaker is on: window.py), and each claim event the pods
holding the claim's devices. A record
reconcile schedules its evictions only while the breaker has room; the eviction worker asks again
right before the call and takes the room then, so a stale view here can delay an eviction but
never let one more through.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import logging
import time
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any, cast

from .. import metrics
from ..cache import Body, Cache, resource_version
from ..kube.api import Kube
from ..kube.errors import ApiError
from ..objects.claims import allocated_devices
from ..objects.pods import PodView
from ..runtime.workqueue import WorkQueue
from ..timestamps import format_rfc3339, now, parse_rfc3339
from . import approval, breaker, groups, node_drain, plan, records, siblings
from .admission import AdmissionPolicies
from .breaker_view import BreakerView
from .budget import DEFAULT_BURST, DEFAULT_QPS, DEFAULT_RETRY_QPS, RETRY_BURST, FairBudget, TokenBucket
from .evictions import Evictions
from .marks import Marks
from .quarantine import Quarantine
from .records import DeviceRef
from .sibling_records import SiblingRecords
from .taint_rules import UnselectiveRules
from .tolerations import copies_tolerations
from .wave import HOLD_RECHECK, Wave

log = logging.getLogger("claimwarden.health")

RECORDS_API = f"{records.GROUP}/{records.VERSION}"
QUARANTINE_EFFECTS = ("NoExecute", "NoSchedule")
BREAKER_OPEN = "EvictionBreakerOpen"
POPULATION_RESYNC = 60.0  # seconds between rebuilds of the pods holding devices from all claims (missed events)
APPROVAL_IGNORED = "ApprovalIgnored"
APPROVAL_REMOVED = "ApprovalRemoved"
RECREATED = (f"the ValidatingAdmissionPolicy {approval.POLICY} or its binding was created again since claimwarden last "
             "read it, and the approval may have been set in between")
IN_FLIGHT_RECHECK = 5.0  # seconds: a record held back only by evictions in flight is looked at again
COPIES_RESCAN = 30.0  # seconds between scans of all claims for copied tolerations, until one is found
RULE_DEFER_MAX = 30.0  # seconds after the mark a DeviceTaintRule may wait for the record's evictions
FIRST_WRITE_SETTLE = 10.0  # seconds a record's first status may wait for its device to settle
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


@dataclass
class RecordMemory:
    """What the controller knows of a record between reconciles, seeded from its status after a restart."""

    holders: set[str] = field(default_factory=set)
    """The other claims allocated the device when the record was last reconciled."""
    exclusive: set[str] | None = None
    """Those of them that kube-scheduler counted as allocating it (None after a restart: the status does
    not say, and all holders count then)."""
    planned: float = float("-inf")
    """When (monotonic) the plan the device's last quarantine sync used was made."""


class HealthController:
    def __init__(self, cache: Cache, kube: Kube, namespace: str, settings: HealthSettings | None = None) -> None:
        self.cache = cache
        self.kube = kube
        self.namespace = namespace
        self.settings = settings or HealthSettings()
        self.record_queue = WorkQueue("health-records")
        self.admission = AdmissionPolicies(kube, on_change=self._approvals_changed)
        self.marks = Marks(cache=cache, kube=kube, post_event=self._event)
        self.quarantine = Quarantine(cache=cache, kube=kube, namespace=namespace)
        self.siblings = SiblingRecords(cache=cache, kube=kube, post_event=self._event)
        self.evictions = Evictions(
            kube=kube, cache=cache, post_event=self._event, on_evicted=self.record_queue.add_after,
            breaker_settings=self.settings.breaker,
            budget=FairBudget(TokenBucket(qps=self.settings.eviction_qps, burst=self.settings.eviction_burst)),
            retry_budget=FairBudget(TokenBucket(qps=self.settings.eviction_retry_qps, burst=RETRY_BURST)),
            decide=self.decision, approved=self.approved, on_paused=lambda name, decision: self.record_queue.add_after(
                name, _until_room(decision, now())), on_recent=self._on_recent)
        self.unselective_rules = UnselectiveRules(kube, self.quarantine.taint_rule_api,
                                                  self.quarantine.taint_rule_api_gone)
        self.wave = Wave(lambda: self.evictions.queue.busy)
        self._memory: dict[str, RecordMemory] = {}
        self._node_drain_seen: dict[str, tuple[frozenset[str], frozenset[str]]] = {}  # drain Node (node_drain.py)
        # The quarantine is the device's, whichever records mark it ("one claim per device", health/__init__.py):
        # what holders were seen when it was last synced, one sync at a time, and which device each record names
        # (to find its siblings once it is gone).
        self._device_memory: dict[DeviceRef, RecordMemory] = {}
        self._device_locks: dict[DeviceRef, asyncio.Lock] = {}
        self._record_devices: dict[str, DeviceRef] = {}
        # record -> (resourceVersion our last status write returned, the status it wrote).
        self._status_written: dict[str, tuple[int, dict[str, Any]]] = {}
        self.breaker_view = BreakerView()
        self._records_seeded = False
        self._population_synced = -POPULATION_RESYNC
        self._open: dict[str, bool] = {}
        self._approval_reported: dict[str, str] = {}  # record -> the ignored approval's reason an Event said
        # Records whose approval was there when the approval policy was found created again (admission.py).
        self._distrusted: set[str] = set()
        self._removed: dict[str, approval.Verdict] = {}  # record -> the approval removed, while the policy is missing
        # record -> (by, generation) of the approval a fresh read of the policy confirmed (admission.confirm).
        self._confirmed: dict[str, tuple[str, int | None]] = {}
        self._shown: dict[str, tuple[bool, int, int, int, int | None]] = {}
        # claim (namespace, name) -> records whose device it held: wakes them when the claim lets go.
        self._claim_records: dict[tuple[str, str], set[str]] = {}
        self._record_claims: dict[str, set[tuple[str, str]]] = {}  # the same, from the record's side
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
        if record is not None and self._records_seeded:
            self._note_record(record)
        self.record_queue.add(name)
        body = body if body is not None else record
        if body is not None:  # (also when it is gone: its siblings' derived records go with it)
            self.siblings.enqueue_record(body)

    def enqueue_for_claim(self, namespace: str, name: str, body: Body, *, deleted: bool = False) -> None:
        """A claim changed: look again at records whose device it holds or held."""
        if self.settings.breaker.enabled:
            self.breaker_view.population.set_claim((namespace, name), {} if deleted else self._claim_holders(body))
        names = set(self._claim_records.get((namespace, name), set()))
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
        """Records about the device, whatever their names (admins may name their own)."""
        return self.cache.records_marking((ref.driver, ref.pool, ref.device))

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

    # --- the breaker (breaker.py decides) -----------------------------------------------------

    def decision(self, driver: str) -> breaker.Decision:
        """The breaker's decision for the driver now, over all its NoExecute records (breaker_view.py)."""
        settings = self.settings.breaker
        if not settings.enabled:
            return breaker.Decision(driver=driver)
        self._seed_breaker_view()
        view = self.breaker_view.driver_view(driver, now=now(), window=settings.window,
                                             in_flight=self.evictions.in_flight(driver))
        return breaker.decide(driver, view, settings, now())

    def _seed_breaker_view(self) -> None:
        """Once, every record the cache holds (their evictions in the window come from their status, so a
        restarted claimwarden decides as before); and now and then every claim's holders again."""
        if not self._records_seeded:
            self._records_seeded = True
            for record in self.cache.records():
                self._note_record(record)
        if time.monotonic() - self._population_synced >= POPULATION_RESYNC:
            self._population_synced = time.monotonic()
            self.breaker_view.population.reset({
                (str(claim["metadata"].get("namespace") or ""), str(claim["metadata"].get("name") or "")):
                    self._claim_holders(claim) for claim in self.cache.claims()})

    def approved(self, record: Body) -> str | None:
        """Who approved the record's evictions past the breaker, when the approval counts (approval.py) and a read
        of the policy after it was seen confirmed it (its record's reconcile does that first)."""
        verdict = self._verdict(record)
        if verdict.honoured is None or self._confirmed.get(record["metadata"]["name"]) != (verdict.by,
                                                                                           verdict.generation):
            return None
        return verdict.honoured

    async def _judge_approval(self, record: Body) -> approval.Verdict:
        """The record's approval as it counts now: a new one is confirmed by a fresh read of the policy first, and
        one the policy did not check is removed (approval.py, admission.py)."""
        name = record["metadata"]["name"]
        verdict = self._verdict(record)
        if verdict.honoured is not None and self._confirmed.get(name) != (verdict.by, verdict.generation):
            await self.admission.confirm()
            verdict = self._verdict(record)
            if verdict.honoured is not None:
                self._confirmed[name] = (verdict.by, verdict.generation)
        if verdict.reason == approval.UNVERIFIED and self.admission.known:
            verdict = await self._remove_approval(record, verdict)
        return verdict

    def _verdict(self, record: Body) -> approval.Verdict:
        if record["metadata"]["name"] in self._distrusted:
            return approval.judge(record, policy_in_force=False, why=RECREATED)
        return approval.judge(record, policy_in_force=self.admission.approval_in_force,
                              why=self.admission.approval_problem)

    async def _approvals_changed(self, recreated: bool) -> None:
        """The approval policy came or went, or was created again: every approved record is decided again."""
        if self.admission.approval_in_force:
            self._removed.clear()
        self._confirmed.clear()
        for record in self.cache.records():
            name = record["metadata"]["name"]
            if approval.APPROVED_BY in ((record.get("metadata") or {}).get("annotations") or {}):
                if recreated:
                    self._distrusted.add(name)
                self.record_queue.add(name)
            elif _condition_true(record, approval.CONDITION, status="False"):  # an approval removed: said no more
                self.record_queue.add(name)

    async def _remove_approval(self, record: Body, verdict: approval.Verdict) -> approval.Verdict:
        """Remove an approval set while the approval policy was not in force (approval.py), loudly; the verdict
        as the record's condition shows it."""
        name = record["metadata"]["name"]
        await self.kube.merge_patch_cluster_object(RECORDS_API, records.PLURAL, name, approval.removal(record))
        self._distrusted.discard(name)
        removed = dataclasses.replace(verdict, message=verdict.message + approval.REMOVED)
        self._removed[name] = removed
        metrics.APPROVALS_IGNORED.labels(verdict.reason).inc()
        log.warning("record %s: %s", name, removed.message)
        await self._event(record, "Warning", APPROVAL_REMOVED, removed.message)
        return removed

    def _claim_holders(self, claim: Body) -> dict[str, frozenset[str]]:
        pods = self.cache.pods()
        return breaker.claim_holders(claim, self.namespace, lambda claim: [
            str(pod["metadata"]["name"]) for pod in groups.group_pods(claim, pods, self.cache.pods_in_podgroup)])

    def _note_record(self, record: Body) -> None:
        """The record as the breaker's view knows it: its driver and whether it is approved."""
        name = record["metadata"]["name"]
        ref = records.record_ref(record)
        if ref is None:
            self.breaker_view.forget(name)
            return
        self.breaker_view.register(name, ref.driver, approved=self.approved(record) is not None,
                                   recent=lambda: list(self.evictions.recent(record)))

    def _on_recent(self, record_name: str, entry: breaker.Recent) -> None:
        self.breaker_view.add_recent(record_name, entry)

    async def _note_breaker(self, decision: breaker.Decision, record: Body | None) -> None:
        """On a change of the driver's breaker: metric, log, one Warning Event, and every record of the
        driver looked at again (their EvictionPaused conditions)."""
        driver = decision.driver
        # While open, a change in what its records' messages count (pending, evicted, the limit) refreshes them
        # too: with only (counted, limit) compared, a record paused before the last evictions kept saying
        # "5 pending, 11 evicted" once the count stood at 16 either way. Not the population: claim events move it
        # all the time, and every record of the driver would be written again for each.
        shown = (True, decision.counted, decision.pending, decision.recent, decision.limit) if decision.open \
            else (False, 0, 0, 0, None)
        if self._shown.get(driver, (False, 0, 0, 0, None)) == shown:
            return
        self._shown[driver] = shown
        for name in self.breaker_view.records_of(driver):
            self.record_queue.add(name)
        if self._open.get(driver, False) == decision.open:
            return
        self._open[driver] = decision.open
        metrics.EVICTION_BREAKER_OPEN.labels(driver).set(1 if decision.open else 0)
        if not decision.open:
            log.info("eviction breaker for driver %s closed", driver)
            return
        log.warning("%s", decision.reason)
        # After a restart the breaker is found open again: a record still showing the condition says it
        # was reported already.
        reported = any(r is not None and _condition_true(r, breaker.CONDITION)
                       for r in map(self.cache.record, self.breaker_view.records_of(driver)))
        if not reported and record is not None:
            await self._event(record, "Warning", BREAKER_OPEN, decision.reason)

    # --- records ------------------------------------------------------------------------------

    async def reconcile_record(self, key: Hashable) -> None:
        name = cast(str, key)
        await self.evictions.seed()  # the first time: the records' counts read live, before any decision
        record = self.cache.record(name)
        if record is None:
            ref = self._record_devices.get(name) or self.quarantine.device_labelled(records.label_value(name))
            self._forget_record(name)
            # Fewer marks in force (and the record's evictions leave the window with it): a breaker may close,
            # even when no record of its driver is left to reconcile.
            for driver in [d for d, is_open in self._open.items() if is_open]:
                await self._note_breaker(self.decision(driver), None)
            await self._record_gone(name, ref)
            self._record_devices.pop(name, None)  # only now: a retry after a failed release must still know the device
            return
        moment = now()
        if records.is_expired(record, moment):
            await self.kube.delete_cluster_object(RECORDS_API, records.PLURAL, name)
            log.info("record %s expired and was removed", name)
            return
        expires = records.expires_at(record)
        if expires is not None:
            self.record_queue.add_after(name, (expires - moment).total_seconds() + 0.5)
        ref = records.record_ref(record)
        if ref is None:
            return
        memory = self._memory_of(record)
        status = record.get("status") or {}
        marked_at = parse_rfc3339(status.get("markedAt")) or parse_rfc3339(
            record["metadata"].get("creationTimestamp")) or moment

        planned = time.monotonic()  # the device's quarantine sync ignores a plan older than the last it used
        holding = self.cache.claims_holding((ref.driver, ref.pool, ref.device))
        # Pods evicted moments ago count as gone at once: their count and podsPending then go out in one write.
        record_plan = plan.plan_record(record, holding, self.cache.pods(), marked_at, self.namespace,
                                       server_copies_tolerations=self.server_copies_tolerations(),
                                       evicted=self.evictions.evicted_pods(),
                                       podgroup_members=self.cache.pods_in_podgroup)
        if records.record_drain(record).mode == records.DRAIN_NODE and records.record_effect(record) == "NoExecute":
            record_plan = await self._drain_node(name, ref, record_plan, marked_at)
        holders = set(record_plan.holders)
        self._note_holders(name, holders, memory.holders)
        exclusive = set(record_plan.exclusive_holders)
        # The evictions go first; quarantine, rule and status follow (none of them protects anything while
        # the pods to evict still hold the device, docs/concepts/device-health.md "Keeping new work away").
        verdict = await self._judge_approval(record)
        approved = verdict.honoured
        decision = self._breaker_for(record, ref, record_plan, approved)
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
        evicting_now = evicting and any(eviction.due <= moment for eviction in record_plan.evict)
        await self._note_breaker(decision, record)
        quarantine = await self._sync_quarantine(record, ref, record_plan, planned)
        memory.holders, memory.exclusive = holders, exclusive
        # The rule waits for evictions under way, not for ones held back, and not for long.
        blocked = self.evictions.blocked(name)
        # Not where the scheduler retries pending pods on a claim's deletion (1.37+): the evicted pods' claims may
        # go before the rule is there, and the rule is what keeps those pods off the device then (rule 4).
        defer_rule = evicting_now and not blocked and not self.settings.claim_deletion_wakes_pods and \
            (moment - marked_at).total_seconds() < RULE_DEFER_MAX
        rule = await self.quarantine.sync_taint_rule(record, needed=record_plan.quarantine_needed, defer=defer_rule)
        paused = decision.reason if decision.open and approved is None and record_plan.evict else ""
        held_back = bool(paused) or blocked
        await self._write_status(record, marked_at, record_plan, quarantine, rule, paused=paused, verdict=verdict,
                                 held_back=held_back,
                                 settle=_settling(record_plan, evicting_now=evicting_now, held_back=held_back))

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

    async def _sync_quarantine(self, record: Body, ref: DeviceRef, record_plan: plan.RecordPlan,
                               planned: float) -> list[str]:
        """Sync the device's one quarantine claim (whichever of its records asks); return its names for the
        record's status ([] for a record whose effect does not quarantine).

        Rule 1 is the device's: the holders seen at the device's last sync decide whether one let go since,
        so that of two records seeing the same release only the first replaces the claim. A plan made
        (`planned`, monotonic) before the one the device's last sync used is stale: another record saw the
        holders later, and this one's older view would put back a holder gone since and replace the claim
        again for nothing. The record is looked at again instead.
        """
        self._record_devices[record["metadata"]["name"]] = ref
        siblings = self._records_for(ref)
        quarantining = [r for r in siblings if records.record_effect(r) in QUARANTINE_EFFECTS]
        if not record_plan.quarantine_needed and quarantining:
            return []  # another record of the device keeps it from new work
        names = sorted({record["metadata"]["name"], *(r["metadata"]["name"] for r in siblings)})
        async with self._device_locks.setdefault(ref, asyncio.Lock()):
            device = self._device_memory_of(ref, siblings)
            if planned < device.planned:
                self.record_queue.add(record["metadata"]["name"])
                return list((record.get("status") or {}).get("quarantineClaims") or [])
            device.planned = planned
            # Only a claim that kept the device allocated in kube-scheduler's eyes makes the quarantine claim be
            # asserted again when it goes: an admin-access holder (a diagnostics pod) was never counted.
            exclusive = set(record_plan.exclusive_holders)
            released = (device.exclusive if device.exclusive is not None else device.holders) - exclusive
            quarantine = await self.quarantine.sync(ref, needed=record_plan.quarantine_needed,
                                                    held=bool(exclusive), released=bool(released),
                                                    record_names=names)
            device.holders, device.exclusive = set(record_plan.holders), exclusive
        return quarantine

    def _device_memory_of(self, ref: DeviceRef, siblings: list[Body]) -> RecordMemory:
        """The device's memory; after a restart it starts from its records' status.deviceHolders (rule 1 across
        restarts)."""
        if ref not in self._device_memory:
            holders: set[str] = set()
            for sibling in siblings:
                holders.update((sibling.get("status") or {}).get("deviceHolders") or [])
            self._device_memory[ref] = RecordMemory(holders=holders)
        return self._device_memory[ref]

    async def _record_gone(self, name: str, ref: DeviceRef | None) -> None:
        """The record is gone. Its device's quarantine claim stays while another record marks the device
        (that one keeps it: releasing it would make the scheduler forget the device, the trap in
        health/__init__.py); else it is released, once a live read confirms the record is gone."""
        siblings = self._records_for(ref) if ref is not None else []
        if ref is not None and not siblings:
            self._device_memory.pop(ref, None)  # (its lock stays: a record of the device may be syncing now)
        # Freeing a device is destructive: confirm the record is really gone first.
        if await self.kube.get_cluster_object(RECORDS_API, records.PLURAL, name) is not None:
            return
        if siblings:
            for sibling in siblings:
                self.record_queue.add(sibling["metadata"]["name"])
            log.info("record %s is gone; %s still mark%s device %s, which stays quarantined", name,
                     ", ".join(r["metadata"]["name"] for r in siblings), "s" if len(siblings) == 1 else "", ref)
        elif ref is None:
            # A record this process never synced (gone before its first reconcile here): which device it
            # marked is not known, so every quarantine claim no live record accounts for is released now,
            # rather than at the next resync.
            await self.quarantine.release_orphans()
        else:
            claims = self.quarantine.claims_of(ref, [name])
            if claims:
                await self.quarantine.release(claims)
        await self.quarantine.drop_taint_rule(name)

    def _breaker_for(self, record: Body, ref: DeviceRef, record_plan: plan.RecordPlan,
                     approved: str | None) -> breaker.Decision:
        """Leave the record's pending pods in the breaker's view, then decide for its driver."""
        name = record["metadata"]["name"]
        self._seed_breaker_view()
        self._note_record(record)
        if records.record_effect(record) == "NoExecute" and approved is None and record_plan.evict:
            self.breaker_view.set_pending(name, ref.driver,
                                          frozenset(f"{e.namespace}/{e.pod}" for e in record_plan.evict))
        else:
            self.breaker_view.set_pending(name, None, frozenset())
        return self.decision(ref.driver)

    def _note_holders(self, record_name: str, holders: set[str], before: set[str]) -> None:
        claims = self._record_claims.setdefault(record_name, set())
        for holder in holders:
            namespace, claim = holder.split("/", 1)
            self._claim_records.setdefault((namespace, claim), set()).add(record_name)
            claims.add((namespace, claim))
        for holder in before - holders:
            namespace, claim = holder.split("/", 1)
            self._drop_claim_record((namespace, claim), record_name)

    def _drop_claim_record(self, key: tuple[str, str], record_name: str) -> None:
        names = self._claim_records.get(key, set())
        names.discard(record_name)
        if not names:
            self._claim_records.pop(key, None)
        claims = self._record_claims.get(record_name, set())
        claims.discard(key)
        if not claims:
            self._record_claims.pop(record_name, None)

    async def _write_status(self, record: Body, marked_at: datetime.datetime, record_plan: plan.RecordPlan,
                            quarantine: list[str], rule: str, *, paused: str, verdict: approval.Verdict,
                            held_back: bool = False, settle: bool = False) -> None:
        """Write the record's status when it changed, paced (counts.py). With `settle` (``_settling``) the
        first write waits until the claims holding the device have let go, for at most FIRST_WRITE_SETTLE
        seconds, so that one write carries the evictions and the quarantine claim rather than one each."""
        name = record["metadata"]["name"]
        effect = records.record_effect(record)
        ref = records.record_ref(record) or DeviceRef("", "", "")
        status = record.get("status") or {}
        written = self._status_written.get(name)
        if written is not None and resource_version(record) <= written[0]:
            # The watch has not brought our last write back yet (it lags under load): what was written is the
            # status to build on and compare with. Conditions built on the stale one got a new
            # lastTransitionTime on every lagging event, and each went out again (6.5 writes per record).
            status = {**status, **written[1]}
        pending = record_plan.pending
        version = self.evictions.counts.version(name)
        counts = self.evictions.counts_status(record)
        evicted = counts["podsEvicted"]
        drain = records.record_drain(record)
        if effect == "NoExecute":
            evicting = _evicting(pending, evicted, drain, record_plan.drain_deadline)
        else:
            evicting = ("False", "NoEviction", f"effect {effect} evicts nothing; "
                        f"{record_plan.would_evict} pod(s) would be evicted by NoExecute")
        conditions = [
            _condition(status, "Quarantined", *_quarantined(effect, quarantine, record_plan)),
            _condition(status, "Evicting", *evicting),
        ]
        if paused:
            conditions.append(_condition(status, breaker.CONDITION, "True", "BreakerOpen", paused))
        if verdict.reason:
            conditions.append(_condition(status, approval.CONDITION, "True" if verdict.honoured else "False",
                                         verdict.reason, verdict.message))
            await self._report_ignored(record, status, verdict)
        elif not self.admission.approval_in_force:
            # An approval removed for want of the policy stays reported while the policy is missing (its status
            # write may still be on its way: then from memory).
            removed = self._removed.get(name)
            if removed is not None:
                conditions.append(_condition(status, approval.CONDITION, "False", removed.reason, removed.message))
            else:
                conditions += [c for c in status.get("conditions") or []
                               if c.get("type") == approval.CONDITION and c.get("reason") == approval.UNVERIFIED]
        desired = {
            "observedGeneration": record["metadata"].get("generation"),
            "markedAt": format_rfc3339(marked_at),
            "podsPending": pending,
            "podsEvicted": evicted,
            "recentEvictions": counts["recentEvictions"],
            "podsWouldEvict": record_plan.would_evict,
            "podsWouldEvictNames": list(record_plan.would_evict_names[:plan.PREVIEW_NAMES_MAX]),
            "adminAccessPods": list(record_plan.admin_access[:plan.PREVIEW_NAMES_MAX]),
            "approval": approval.status_approval(verdict, status.get("approval"), format_rfc3339(now())),
            "quarantineClaims": quarantine,
            "deviceHolders": sorted(record_plan.holders),
            "deviceTaintRule": rule,
            "conditions": conditions,
            **siblings.domain_status(self.siblings.domain_of(ref), status, ref),
        }
        if self.evictions.ahead is not None:  # the breaker's window and the count are written ahead (window.py)
            del desired["podsEvicted"], desired["recentEvictions"]
        if any(status.get(k) != v for k, v in desired.items()):
            wait = self.evictions.counts.wait(name, time.monotonic(), settle=FIRST_WRITE_SETTLE if settle else 0.0)
            if wait <= 0 and not held_back and self.wave.holds(("status", name)):
                wait = HOLD_RECHECK  # evictions go first (wave.py)
            # A new set of quarantine claims goes out at once: a restart plans from status.deviceHolders and
            # status.quarantineClaims, and a stale pair would make it replace a quarantine claim for nothing.
            if wait > 0 and (status.get("quarantineClaims") or []) == quarantine:  # paced: comes back and writes
                self.record_queue.add_after(name, wait)
                return
            result = await self.kube.merge_patch_cluster_object(RECORDS_API, records.PLURAL, name,
                                                                {"status": desired}, subresource="status")
            self._status_written[name] = (resource_version(result), desired)
            if self.evictions.ahead is not None:  # the next write ahead is guarded by this version, not refused
                self.evictions.ahead.note(result)
        self.evictions.counts_written(name, version)

    async def flush(self) -> None:
        """At shutdown, once the workers have stopped: write what lives only in memory (eviction counts)."""
        await self.evictions.flush_counts()

    def _memory_of(self, record: Body) -> RecordMemory:
        """The record's memory; after a restart it starts from the record's status (rule 1 across restarts)."""
        name = record["metadata"]["name"]
        if name not in self._memory:
            status = record.get("status") or {}
            self._memory[name] = RecordMemory(holders=set(status.get("deviceHolders") or []))
        return self._memory[name]

    async def _report_ignored(self, record: Body, status: Body, verdict: approval.Verdict) -> None:
        """A Warning Event and a count, once, when a record's approval turns out not to count (the Approved
        condition in status remembers it across restarts)."""
        name = record["metadata"]["name"]
        shown = next((c.get("reason") for c in status.get("conditions") or [] if c.get("type") == approval.CONDITION),
                     None)
        if verdict.honoured is not None or verdict.reason == approval.UNVERIFIED:  # the removal reports that
            self._approval_reported.pop(name, None)
            return
        if verdict.reason in (shown, self._approval_reported.get(name)):
            return
        self._approval_reported[name] = verdict.reason
        metrics.APPROVALS_IGNORED.labels(verdict.reason).inc()
        log.warning("record %s: %s", name, verdict.message)
        await self._event(record, "Warning", APPROVAL_IGNORED, verdict.message)

    def _forget_record(self, name: str) -> None:
        self._memory.pop(name, None)
        self._node_drain_seen.pop(name, None)
        self._approval_reported.pop(name, None)
        self._distrusted.discard(name)
        self._removed.pop(name, None)
        self._confirmed.pop(name, None)
        self._status_written.pop(name, None)
        self.breaker_view.forget(name)
        self.evictions.forget(name)
        for key in list(self._record_claims.get(name, ())):
            self._drop_claim_record(key, name)

    async def _event(self, involved: Body, event_type: str, reason: str, message: str) -> None:
        try:
            await self.kube.post_event(involved, event_type, reason, message)
        except ApiError as exc:
            log.warning("could not post event %s on %s: %s", reason, involved["metadata"].get("name"), exc)


def _evicting(pending: int, evicted: int, drain: records.Drain,
              deadline: datetime.datetime | None) -> tuple[str, str, str]:
    """The Evicting condition of a NoExecute record: (status, reason, message), saying why pods wait."""
    if not pending:
        return "False", "Completed", f"{evicted} pod(s) evicted, none pending"
    if drain.mode == records.DRAIN_ALLOW_COMPLETION:
        return ("False", "WaitingForCompletion", f"{pending} pod(s) may run to completion (drain AllowCompletion); "
                "the device takes no new work")
    if deadline is not None and deadline > now():
        return ("True", "WaitingForDeadline", f"{pending} pod(s) may finish until {format_rfc3339(deadline)} "
                f"(drain {drain}), then they are evicted; the device takes no new work")
    return "True", "PodsPendingEviction", f"{pending} pod(s) still to evict"


def _settling(record_plan: plan.RecordPlan, *, evicting_now: bool, held_back: bool) -> bool:
    """True while the record's device is changing hands: claims the scheduler counts still hold a device to
    be quarantined, and its pods are being evicted now or have all been evicted (or need not be), with
    nothing (the breaker, a PodDisruptionBudget) holding the evictions back. Its first status then waits
    for them to let go."""
    if not record_plan.quarantine_needed or not record_plan.exclusive_holders or held_back:
        return False
    return evicting_now or record_plan.pending == 0


def _quarantined(effect: str, quarantine: list[str], record_plan: plan.RecordPlan) -> tuple[str, str, str]:
    """The Quarantined condition: (status, reason, message)."""
    if quarantine:
        return "True", "QuarantineClaimAllocated", f"held by {', '.join(quarantine)}"
    if record_plan.quarantine_needed and record_plan.exclusive_holders:
        # Claims that hold a device keep it from new work as well; the quarantine claim follows them.
        return ("True", "HeldByClaims", f"held by {', '.join(record_plan.exclusive_holders)}; a quarantine claim "
                "takes the device when they let go")
    if record_plan.quarantine_needed:
        return "False", "QuarantinePending", "the quarantine claim is being made"
    return "False", "NotQuarantined", f"effect {effect} does not quarantine"


def _until_room(decision: breaker.Decision, moment: datetime.datetime) -> float:
    """Seconds until the breaker may have room again."""
    if decision.frees_at is None:
        return IN_FLIGHT_RECHECK
    return max((decision.frees_at - moment).total_seconds(), 0.0) + 1


def _condition_true(record: Body, kind: str, status: str = "True") -> bool:
    return any(c.get("type") == kind and c.get("status") == status
               for c in (record.get("status") or {}).get("conditions") or [])


def _condition(status: Body, kind: str, state: str, reason: str, message: str) -> dict[str, Any]:
    previous = next((c for c in status.get("conditions") or [] if c.get("type") == kind), None)
    changed = previous is None or previous.get("status") != state
    since = format_rfc3339(now()) if changed or previous is None else previous.get("lastTransitionTime")
    return {"type": kind, "status": state, "reason": reason, "message": message,
            "lastTransitionTime": since or format_rfc3339(now())}
