"""health: records of unhealthy devices, eviction of their pods, and quarantine of the devices.

Three queues: slices (annotations -> records), records (quarantine, taint rule, status, which
pods to evict) and evictions (one key per pod, retried until evicted, gone or cleared). The
decisions are in records.py, tolerations.py and plan.py.
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
from ..podclaims import is_allocated, is_being_deleted, is_reserved_for
from ..workqueue import Requeue, WorkQueue
from . import plan, records
from .records import DeviceRef
from .tolerations import allocation_results

log = logging.getLogger("claimwarden.health")

RECORDS_API = f"{records.GROUP}/{records.VERSION}"
TAINT_RULE_VERSIONS = ("v1", "v1beta2", "v1alpha3")
EVICTED = "EvictedUnhealthyDevice"
EVICTION_BLOCKED = "EvictionBlocked"
MARK_ERROR = "InvalidUnhealthyMark"
QUARANTINED = "DeviceQuarantined"
# Back-off for evictions refused by a PodDisruptionBudget (HTTP 429): 1 s doubling to 30 s.
PDB_RETRY_FIRST, PDB_RETRY_MAX = 1.0, 30.0


def now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def parse_time(text: str | None) -> datetime.datetime | None:
    if not text:
        return None
    try:
        return datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None


def format_time(moment: datetime.datetime) -> str:
    return moment.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class RecordMemory:
    """What the controller remembers per record between reconciles (rebuilt after a restart)."""

    evicted: int
    holders: set[str] = field(default_factory=set)
    quarantine_asserted: bool = False


class HealthController:
    def __init__(self, cache: Cache, kube: Kube, namespace: str) -> None:
        self.cache = cache
        self.kube = kube
        self.namespace = namespace
        self.slice_queue = WorkQueue("health-slices")
        self.record_queue = WorkQueue("health-records")
        self.eviction_queue = WorkQueue("health-evictions")
        self._memory: dict[str, RecordMemory] = {}
        self._claim_records: dict[tuple[str, str], set[str]] = {}
        self._reported_marks: set[tuple[str, str, str]] = set()
        self._pdb_attempts: dict[Hashable, int] = {}
        self._taint_rule_version: str | None = None
        self._taint_rule_checked = False

    # --- entry points from events -----------------------------------------------------------

    def enqueue_slice(self, name: str) -> None:
        self.slice_queue.add(name)

    def enqueue_record(self, name: str) -> None:
        self.record_queue.add(name)

    def enqueue_for_claim(self, namespace: str, name: str, body: Body) -> None:
        """A claim changed: look again at records whose device it holds or held."""
        names = set(self._claim_records.get((namespace, name), set()))
        for ref in _allocated_refs(body):
            names.update(r["metadata"]["name"] for r in self._records_for(ref))
        for record in names:
            if self.cache.record(record) is not None:
                self.record_queue.add(record)

    def quarantined(self, claim: Body) -> bool:
        """True if the claim holds a device that a NoExecute or NoSchedule record quarantines."""
        return any(records.record_effect(record) in ("NoExecute", "NoSchedule")
                   for ref in _allocated_refs(claim) for record in self._records_for(ref))

    def _records_for(self, ref: DeviceRef) -> list[Body]:
        """Records about the device, whatever their names (admins may name their own)."""
        return [r for r in self.cache.records() if records.record_ref(r) == ref]

    def device_samples(self) -> list[metrics.DeviceSample]:
        """Every published device with its state, for the device gauges."""
        tainted = {ref for r in self.cache.records() if records.record_effect(r) in ("NoExecute", "NoSchedule")
                   and (ref := records.record_ref(r)) is not None}
        allocated = {ref for claim in self.cache.claims() if not plan.is_quarantine_claim(claim)
                     for ref in _allocated_refs(claim)}
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

    def record_effects(self) -> list[str]:
        return [records.record_effect(r) for r in self.cache.records()]

    def record_names(self) -> list[str]:
        return [r["metadata"]["name"] for r in self.cache.records()]

    # --- slices: annotations -> records -----------------------------------------------------

    async def reconcile_slice(self, key: Hashable) -> None:
        name = cast(str, key)
        slice_ = self.cache.resource_slice(name)
        if slice_ is None:
            return
        existing = {r["metadata"]["name"]: r for r in self.cache.records()}
        sync = records.plan_slice(slice_, existing)
        for error in sync.errors:
            marker = (slice_["metadata"].get("uid", ""), error.key, error.message)
            if marker not in self._reported_marks:
                self._reported_marks.add(marker)
                await self._event(slice_, "Warning", MARK_ERROR, error.message)
                log.warning("slice %s: %s", name, error.message)
        for body in sync.create:
            try:
                await self.kube.create_cluster_object(RECORDS_API, records.PLURAL, body)
            except ApiError as exc:
                if exc.status != 409:
                    raise
            log.info("slice %s: device %s marked unhealthy: %s", name, body["spec"]["device"], body["spec"]["reason"])
        for record_name, reason in sync.update_reason:
            await self.kube.merge_patch_cluster_object(RECORDS_API, records.PLURAL, record_name,
                                                       {"spec": {"reason": reason}})
        for record_name in sync.delete:
            await self.kube.delete_cluster_object(RECORDS_API, records.PLURAL, record_name)
            log.info("slice %s: record %s cleared (annotation removed)", name, record_name)

    # --- records: quarantine, taint rule, status, evictions ---------------------------------

    async def reconcile_record(self, key: Hashable) -> None:
        name = cast(str, key)
        record = self.cache.record(name)
        if record is None:
            self._forget_record(name)
            claims = self._quarantine_claims(name)
            # Freeing a device is destructive: confirm the record is really gone first.
            if claims and await self.kube.get_cluster_object(RECORDS_API, records.PLURAL, name) is None:
                await self._release_quarantine(claims)
            return
        moment = now()
        if records.is_expired(record, moment):
            await self.kube.delete_cluster_object(RECORDS_API, records.PLURAL, name)
            log.info("record %s expired and was removed", name)
            return
        expires = parse_time(record["spec"].get("expiresAt"))
        if expires is not None:
            self.record_queue.add_after(name, (expires - moment).total_seconds() + 0.5)
        ref = records.record_ref(record)
        if ref is None:
            return
        memory = self._memory_of(record)
        status = record.get("status") or {}
        marked_at = parse_time(status.get("markedAt")) or parse_time(
            record["metadata"].get("creationTimestamp")) or moment

        record_plan = plan.plan_record(record, self.cache.claims(), self.cache.pods(), marked_at)
        holders = set(record_plan.holders)
        for holder in holders:
            claim_ns, claim_name = holder.split("/", 1)
            self._claim_records.setdefault((claim_ns, claim_name), set()).add(name)
        released = memory.holders - holders

        quarantine = await self._sync_quarantine(record, ref, record_plan.quarantine_needed,
                                                 reassert=bool(released) or not memory.quarantine_asserted)
        memory.quarantine_asserted = record_plan.quarantine_needed
        memory.holders = holders
        rule = await self._sync_taint_rule(record, record_plan.quarantine_needed)

        for eviction in record_plan.evict:
            delay = (eviction.due - moment).total_seconds()
            self.eviction_queue.add_after((name, eviction.namespace, eviction.pod, eviction.uid,
                                           eviction.claim), max(delay, 0))
        await self._write_status(record, marked_at, record_plan, quarantine, rule)

    async def _sync_quarantine(self, record: Body, ref: DeviceRef, needed: bool, reassert: bool) -> list[str]:
        """Keep the device held by an allocated quarantine claim; return the claims' names.

        The scheduler keeps allocated devices as a set and forgets a device whenever any claim holding
        it lets go. So after another holder released the device, a *new* quarantine claim is
        allocated: clearing and re-writing an existing one would itself be a deallocation, which
        also wakes pending pods while the device looks free.
        """
        existing = self._quarantine_claims(record["metadata"]["name"])
        if not needed:
            await self._release_quarantine(existing)
            return []
        names = sorted(c["metadata"]["name"] for c in existing)
        if existing and not reassert and all(is_allocated(c) for c in existing):
            return names
        for claim in existing:  # finish any claim a crash left unallocated
            if not is_allocated(claim):
                await self._allocate_quarantine(claim, ref)
        if not existing or reassert:
            node = plan.slice_node(self.cache.resource_slices(), ref)
            body = plan.quarantine_claim_body(record, self.namespace, node)
            try:
                created = await self.kube.create_claim(self.namespace, body)
            except ApiError as exc:
                if not exc.not_found:  # the namespace is missing (e.g. a local run): create it once
                    raise
                await self.kube.create_namespace(self.namespace)
                created = await self.kube.create_claim(self.namespace, body)
            await self._allocate_quarantine(created, ref, node)
            names.append(created["metadata"]["name"])
            log.info("device %s/%s/%s quarantined by claim %s/%s", ref.driver, ref.pool, ref.device,
                     self.namespace, created["metadata"]["name"])
        return sorted(names)

    def _quarantine_claims(self, record_name: str) -> list[Body]:
        label = records.label_value(record_name)
        return [c for c in self.cache.claims() if c["metadata"].get("namespace") == self.namespace
                and (c["metadata"].get("labels") or {}).get(records.RECORD_LABEL) == label]

    async def _release_quarantine(self, claims: list[Body]) -> None:
        """Free the device: delete all quarantine claims, deallocating only the last one first.

        Every claim event that drops the device makes the scheduler forget it, even while another
        claim holds it. Only a deallocation makes the scheduler retry waiting pods, so the extra
        claims are deleted as they are (the device stays parked by the last one), and the last one
        is deallocated (waking waiting pods, which may now take the device) and then deleted.
        """
        ordered = sorted(claims, key=lambda c: c["metadata"]["name"])
        for position, claim in enumerate(ordered):
            meta = claim["metadata"]
            if position == len(ordered) - 1 and is_allocated(claim):
                try:
                    await self.kube.patch_claim_status(self.namespace, meta["name"], [
                        {"op": "remove", "path": "/status/allocation"}])
                except ApiError as exc:
                    if not exc.not_found:
                        raise
            await self.kube.delete_claim(self.namespace, meta["name"], meta["uid"])
            log.info("quarantine claim %s/%s released", self.namespace, meta["name"])

    async def release_orphaned_quarantine(self) -> None:
        """Quarantine claims whose record is gone (deleted while claimwarden was down).

        Decided on a live list of the records, not the index: this runs beside the watches and
        must never free a device because an index was not filled yet.
        """
        candidates = [c for c in self.cache.claims() if c["metadata"].get("namespace") == self.namespace
                      and (c["metadata"].get("labels") or {}).get(records.RECORD_LABEL)]
        if not candidates:
            return
        listing = await self.kube.list_cluster_objects(RECORDS_API, records.PLURAL)
        live = {records.label_value(r["metadata"]["name"]) for r in listing}
        await self._release_quarantine([c for c in candidates
                                        if c["metadata"]["labels"][records.RECORD_LABEL] not in live])

    async def _allocate_quarantine(self, claim: Body, ref: DeviceRef, node: str | None = None) -> None:
        node = node or plan.slice_node(self.cache.resource_slices(), ref)
        await self.kube.patch_claim_status(self.namespace, claim["metadata"]["name"], [
            {"op": "test", "path": "/metadata/resourceVersion", "value": claim["metadata"]["resourceVersion"]},
            {"op": "add", "path": "/status", "value": {"allocation": plan.quarantine_allocation(ref, node)}}])

    async def _sync_taint_rule(self, record: Body, needed: bool) -> str:
        """Where DeviceTaintRule is served, keep a NoSchedule rule in step with the record."""
        if not self._taint_rule_checked:
            self._taint_rule_version = await self.kube.served_version("resource.k8s.io", "devicetaintrules",
                                                                      TAINT_RULE_VERSIONS)
            self._taint_rule_checked = True
            if self._taint_rule_version:
                log.info("DeviceTaintRule served as resource.k8s.io/%s: unhealthy devices also get a NoSchedule "
                         "rule", self._taint_rule_version)
        if not self._taint_rule_version:
            return ""
        api = f"resource.k8s.io/{self._taint_rule_version}"
        body = plan.device_taint_rule_body(record, api)
        body["metadata"]["ownerReferences"] = [{
            "apiVersion": RECORDS_API, "kind": records.KIND, "name": record["metadata"]["name"],
            "uid": record["metadata"]["uid"], "controller": True, "blockOwnerDeletion": False}]
        rule_name = body["metadata"]["name"]
        existing = await self.kube.get_cluster_object(api, "devicetaintrules", rule_name)
        if not needed:
            if existing is not None:
                await self.kube.delete_cluster_object(api, "devicetaintrules", rule_name)
            return ""
        if existing is None:
            await self.kube.create_cluster_object(api, "devicetaintrules", body)
        return rule_name

    async def _write_status(self, record: Body, marked_at: datetime.datetime, record_plan: plan.RecordPlan,
                            quarantine: list[str], rule: str) -> None:
        name = record["metadata"]["name"]
        memory = self._memory[name]
        effect = records.record_effect(record)
        status = record.get("status") or {}
        pending = len(record_plan.evict)
        if effect == "NoExecute":
            evicting = ("True", "PodsPendingEviction", f"{pending} pod(s) still to evict") if pending else (
                "False", "Completed", f"{memory.evicted} pod(s) evicted, none pending")
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
            "markedAt": format_time(marked_at),
            "podsPending": pending,
            "podsEvicted": memory.evicted,
            "podsWouldEvict": record_plan.would_evict,
            "quarantineClaims": quarantine,
            "deviceTaintRule": rule,
            "conditions": conditions,
        }
        if any(status.get(k) != v for k, v in desired.items()):
            await self.kube.merge_patch_cluster_object(RECORDS_API, records.PLURAL, name, {"status": desired},
                                                       subresource="status")

    def _memory_of(self, record: Body) -> RecordMemory:
        """The record's memory; after a restart the eviction count starts from its status."""
        name = record["metadata"]["name"]
        if name not in self._memory:
            self._memory[name] = RecordMemory(evicted=int((record.get("status") or {}).get("podsEvicted") or 0))
        return self._memory[name]

    def _forget_record(self, name: str) -> None:
        self._memory.pop(name, None)
        for names in self._claim_records.values():
            names.discard(name)

    # --- evictions --------------------------------------------------------------------------

    async def reconcile_eviction(self, key: Hashable) -> None:
        record_name, namespace, pod_name, uid, claim_name = cast(tuple[str, str, str, str, str], key)
        record = self.cache.record(record_name)
        if record is None or records.record_effect(record) != "NoExecute":
            self._pdb_attempts.pop(key, None)
            return
        pod = await self.kube.get_pod(namespace, pod_name)
        if pod is None or pod["metadata"].get("uid") != uid:
            metrics.EVICTIONS.labels("gone").inc()
            self._pdb_attempts.pop(key, None)
            return
        if is_being_deleted(pod):
            self._pdb_attempts.pop(key, None)
            return
        claim = await self.kube.get_claim(namespace, claim_name)
        ref = records.record_ref(record)
        if claim is None or ref is None or not plan.holds_device(claim, ref) or not is_reserved_for(claim, uid):
            self._pdb_attempts.pop(key, None)
            return
        reason = record["spec"].get("reason", "")
        try:
            await self.kube.evict_pod(namespace, pod_name, uid)
        except ApiError as exc:
            if exc.too_many_requests:
                metrics.EVICTIONS.labels("pdb_blocked").inc()
                attempts = self._pdb_attempts.get(key, 0) + 1
                self._pdb_attempts[key] = attempts
                if attempts == 1:
                    await self._event(pod, "Warning", EVICTION_BLOCKED,
                                      f"eviction for unhealthy device {_device(ref)} is blocked: {exc.message}")
                raise Requeue(min(PDB_RETRY_FIRST * 2 ** (attempts - 1), PDB_RETRY_MAX), "blocked") from None
            if exc.status in (404, 409):
                metrics.EVICTIONS.labels("gone").inc()
                self._pdb_attempts.pop(key, None)
                return
            metrics.EVICTIONS.labels("error").inc()
            raise
        self._pdb_attempts.pop(key, None)
        metrics.EVICTIONS.labels("evicted").inc()
        status = record.get("status") or {}
        marked_at = parse_time(status.get("markedAt")) or parse_time(record["metadata"].get("creationTimestamp"))
        if marked_at is not None:
            metrics.EVICTION_LATENCY.observe(max((now() - marked_at).total_seconds(), 0.0))
        await self._count_eviction(record)
        message = f"evicted: device {_device(ref)} is unhealthy: {reason}"
        await self._event(pod, "Warning", EVICTED, message)
        await self._event(record, "Normal", EVICTED, f"pod {namespace}/{pod_name} {message}")
        log.info("pod %s/%s evicted from unhealthy device %s (%s)", namespace, pod_name, _device(ref), reason)
        self.record_queue.add(record_name)

    async def _count_eviction(self, record: Body) -> None:
        """Store the new count at once: it lives only in memory until the record's status has it."""
        name = record["metadata"]["name"]
        memory = self._memory_of(record)
        memory.evicted += 1
        try:
            await self.kube.merge_patch_cluster_object(RECORDS_API, records.PLURAL, name,
                                                       {"status": {"podsEvicted": memory.evicted}},
                                                       subresource="status")
        except ApiError as exc:
            if not exc.not_found:
                log.warning("could not store the eviction count of record %s: %s", name, exc)

    async def _event(self, involved: Body, event_type: str, reason: str, message: str) -> None:
        try:
            await self.kube.post_event(involved, event_type, reason, message)
        except ApiError as exc:
            log.warning("could not post event %s on %s: %s", reason, involved["metadata"].get("name"), exc)


def _allocated_refs(claim: Body) -> list[DeviceRef]:
    return [DeviceRef(r.get("driver", ""), r.get("pool", ""), r.get("device", "")) for r in allocation_results(claim)]


def _device(ref: DeviceRef) -> str:
    return f"{ref.driver}/{ref.pool}/{ref.device}"


def _condition(status: Body, kind: str, state: str, reason: str, message: str) -> dict[str, Any]:
    previous = next((c for c in status.get("conditions") or [] if c.get("type") == kind), None)
    changed = previous is None or previous.get("status") != state
    since = format_time(now()) if changed or previous is None else previous.get("lastTransitionTime")
    return {"type": kind, "status": state, "reason": reason, "message": message,
            "lastTransitionTime": since or format_time(now())}
