"""health: one UnhealthyDevice record at a time, plus the wiring of marks, quarantine and evictions.

Three queues: slices (``marks``), records (here: quarantine, taint rule, status, which pods to
evict and when) and evictions (``evictions``, one key per pod). The decisions are in records.py,
tolerations.py and plan.py.
"""

from __future__ import annotations

import datetime
import logging
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any, cast

from .. import metrics
from ..cache import Body, Cache
from ..kube.api import Kube
from ..kube.errors import ApiError
from ..podclaims import allocated_devices, resolve_claim_names
from ..timestamps import format_rfc3339, now, parse_rfc3339
from ..workqueue import WorkQueue
from . import plan, records
from .evictions import Evictions
from .marks import Marks
from .quarantine import Quarantine
from .records import DeviceRef
from .taint_rules import UnselectiveRules

log = logging.getLogger("claimwarden.health")

RECORDS_API = f"{records.GROUP}/{records.VERSION}"
QUARANTINE_EFFECTS = ("NoExecute", "NoSchedule")


@dataclass
class RecordMemory:
    """What the controller knows of a record between reconciles, seeded from its status after a restart."""

    holders: set[str] = field(default_factory=set)
    """The other claims allocated the device when the quarantine was last asserted."""
    quarantined: bool = False


class HealthController:
    def __init__(self, cache: Cache, kube: Kube, namespace: str) -> None:
        self.cache = cache
        self.kube = kube
        self.namespace = namespace
        self.record_queue = WorkQueue("health-records")
        self.marks = Marks(cache=cache, kube=kube, post_event=self._event)
        self.quarantine = Quarantine(cache=cache, kube=kube, namespace=namespace)
        self.evictions = Evictions(kube=kube, post_event=self._event, on_evicted=self.enqueue_record)
        self.unselective_rules = UnselectiveRules(kube, self.quarantine.taint_rule_api)
        self._memory: dict[str, RecordMemory] = {}
        # claim (namespace, name) -> records whose device it held: wakes them when the claim lets go.
        self._claim_records: dict[tuple[str, str], set[str]] = {}

    @property
    def slice_queue(self) -> WorkQueue:
        return self.marks.queue

    @property
    def eviction_queue(self) -> WorkQueue:
        return self.evictions.queue

    # --- entry points from events -----------------------------------------------------------

    def enqueue_slice(self, name: str) -> None:
        self.marks.queue.add(name)

    def enqueue_record(self, name: str) -> None:
        self.record_queue.add(name)

    def enqueue_for_claim(self, namespace: str, name: str, body: Body) -> None:
        """A claim changed: look again at records whose device it holds or held."""
        names = set(self._claim_records.get((namespace, name), set()))
        for device in allocated_devices(body):
            names.update(r["metadata"]["name"] for r in self._records_for(DeviceRef(*device)))
        for record in names:
            if self.cache.record(record) is not None:
                self.record_queue.add(record)

    def enqueue_for_pod(self, namespace: str, pod: Body) -> None:
        """A pod changed (bound to a node, say): look again at the records of the devices it uses.

        A claim is reserved before its pod is bound, so a pod on a marked device becomes evictable
        only with the pod's own update, not the claim's.
        """
        for resolved in resolve_claim_names(pod):
            claim = self.cache.claim(namespace, resolved.claim_name) if resolved.claim_name else None
            if claim is not None:
                self.enqueue_for_claim(namespace, resolved.claim_name or "", claim)

    def quarantined(self, claim: Body) -> bool:
        """True if the claim holds a device that a NoExecute or NoSchedule record quarantines."""
        return any(records.record_effect(record) in QUARANTINE_EFFECTS
                   for device in allocated_devices(claim) for record in self._records_for(DeviceRef(*device)))

    def _records_for(self, ref: DeviceRef) -> list[Body]:
        """Records about the device, whatever their names (admins may name their own)."""
        return [r for r in self.cache.records() if records.record_ref(r) == ref]

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
        name = cast(str, key)
        record = self.cache.record(name)
        if record is None:
            self._forget_record(name)
            claims = self.quarantine.claims_of(name)
            # Freeing a device is destructive: confirm the record is really gone first.
            if claims and await self.kube.get_cluster_object(RECORDS_API, records.PLURAL, name) is None:
                await self.quarantine.release(claims)
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

        holding = self.cache.claims_holding((ref.driver, ref.pool, ref.device))
        record_plan = plan.plan_record(record, holding, self.cache.pods(), marked_at, self.namespace)
        holders = set(record_plan.holders)
        self._note_holders(name, holders, memory.holders)
        released = memory.holders - holders
        quarantine = await self.quarantine.sync(record, ref, needed=record_plan.quarantine_needed,
                                                reassert=bool(released) or not memory.quarantined)
        memory.quarantined = record_plan.quarantine_needed
        memory.holders = holders
        rule = await self.quarantine.sync_taint_rule(record, needed=record_plan.quarantine_needed)
        for eviction in record_plan.evict:
            self.evictions.schedule(name, eviction, moment)
        await self._write_status(record, marked_at, record_plan, quarantine, rule)

    def _note_holders(self, record_name: str, holders: set[str], before: set[str]) -> None:
        for holder in holders:
            namespace, claim = holder.split("/", 1)
            self._claim_records.setdefault((namespace, claim), set()).add(record_name)
        for holder in before - holders:
            namespace, claim = holder.split("/", 1)
            names = self._claim_records.get((namespace, claim), set())
            names.discard(record_name)
            if not names:
                self._claim_records.pop((namespace, claim), None)

    async def _write_status(self, record: Body, marked_at: datetime.datetime, record_plan: plan.RecordPlan,
                            quarantine: list[str], rule: str) -> None:
        name = record["metadata"]["name"]
        effect = records.record_effect(record)
        status = record.get("status") or {}
        pending = len(record_plan.evict)
        evicted = self.evictions.evicted(record)
        if effect == "NoExecute":
            evicting = ("True", "PodsPendingEviction", f"{pending} pod(s) still to evict") if pending else (
                "False", "Completed", f"{evicted} pod(s) evicted, none pending")
        else:
            evicting = ("False", "NoEviction", f"effect {effect} evicts nothing; "
                        f"{record_plan.would_evict} pod(s) would be evicted by NoExecute")
        conditions = [
            _condition(status, "Quarantined", *(("True", "QuarantineClaimAllocated",
                                                 f"held by {', '.join(quarantine)}") if quarantine else
                                                ("False", "NotQuarantined", f"effect {effect} does not quarantine"))),
            _condition(status, "Evicting", *evicting),
        ]
        desired = {
            "observedGeneration": record["metadata"].get("generation"),
            "markedAt": format_rfc3339(marked_at),
            "podsPending": pending,
            "podsEvicted": evicted,
            "podsWouldEvict": record_plan.would_evict,
            "quarantineClaims": quarantine,
            "deviceHolders": sorted(record_plan.holders),
            "deviceTaintRule": rule,
            "conditions": conditions,
        }
        if any(status.get(k) != v for k, v in desired.items()):
            await self.kube.merge_patch_cluster_object(RECORDS_API, records.PLURAL, name, {"status": desired},
                                                       subresource="status")

    def _memory_of(self, record: Body) -> RecordMemory:
        """The record's memory; after a restart it starts from the record's status (rule 1 across restarts)."""
        name = record["metadata"]["name"]
        if name not in self._memory:
            status = record.get("status") or {}
            self._memory[name] = RecordMemory(holders=set(status.get("deviceHolders") or []),
                                              quarantined=bool(status.get("quarantineClaims")))
        return self._memory[name]

    def _forget_record(self, name: str) -> None:
        self._memory.pop(name, None)
        self.evictions.forget(name)
        for key in [k for k, names in self._claim_records.items() if name in names]:
            self._claim_records[key].discard(name)
            if not self._claim_records[key]:
                del self._claim_records[key]

    async def _event(self, involved: Body, event_type: str, reason: str, message: str) -> None:
        try:
            await self.kube.post_event(involved, event_type, reason, message)
        except ApiError as exc:
            log.warning("could not post event %s on %s: %s", reason, involved["metadata"].get("name"), exc)


def _condition(status: Body, kind: str, state: str, reason: str, message: str) -> dict[str, Any]:
    previous = next((c for c in status.get("conditions") or [] if c.get("type") == kind), None)
    changed = previous is None or previous.get("status") != state
    since = format_rfc3339(now()) if changed or previous is None else previous.get("lastTransitionTime")
    return {"type": kind, "status": state, "reason": reason, "message": message,
            "lastTransitionTime": since or format_rfc3339(now())}
