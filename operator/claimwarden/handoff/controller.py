"""Hand-off, one UnhealthyDevice record at a time: its recommended action, and its NVSentinel request.

A reconcile decides the record's recommendation (``actions``), writes ``status.recommendedAction``,
``status.recommendedActionSource`` and ``status.externalFault`` only when they change (a resync writes nothing),
posts ``RepairRecommended`` when the action is set or changes, and keeps the gauge. With
``--nvsentinel-handoff`` it then hands the record's node-scoped fault to NVSentinel (``externalfaults``): the
node's faults go into one ExternalFault at a time; a record whose request is open is looked at again every
poll period (NVSentinel's objects are not watched: the CRD may come and go, and it is a handful of objects),
and when its request turns FaultCleared the signals controller is asked to look at the device again, so that
a verified clear held back meanwhile (``recovery_hold``) applies.

Where NVSentinel's CRD is not served, the hand-off logs it and posts one Warning Event, and does nothing else;
it looks again every SERVED_RECHECK seconds.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import cast

from .. import metrics
from ..cache import Body, Cache, resource_version
from ..health import records
from ..health.records import DeviceRef
from ..kube.api import Kube
from ..kube.errors import ApiError, NotLeader, NotServed
from ..runtime.workqueue import WorkQueue
from ..signals import policy
from ..signals import records as signal_records
from ..signals.observations import SOURCE_NODE
from ..timestamps import now
from . import actions, externalfaults
from .actions import Recommendation

log = logging.getLogger("claimwarden.handoff")

RECORDS_API = f"{records.GROUP}/{records.VERSION}"
RECOMMENDED = "RepairRecommended"
REQUESTED = "RepairRequested"
CLEARED = "RepairCleared"
NOT_SERVED = "RepairSystemNotServed"
REQUEST_FAILED = "RepairRequestFailed"
HELD = "RecoveryAwaitsRepair"
SERVED_RECHECK = 60.0  # seconds between looks for NVSentinel's CRD while it is not served
LISTING_TTL = 1.0  # seconds a listing of the ExternalFaults serves the reconciles of a burst
STATUS_FIELDS = ("recommendedAction", "recommendedActionSource", "externalFault")


@dataclass(frozen=True)
class HandoffSettings:
    nvsentinel: bool = False
    """--nvsentinel-handoff: create NVSentinel ExternalFaults for node-scoped faults (off by default)."""
    poll_seconds: float = 10.0
    """--nvsentinel-poll-period: how often a record with an open request reads it again."""


class HandoffController:
    def __init__(self, *, cache: Cache, kube: Kube, settings: HandoffSettings | None = None,
                 on_cleared: Callable[[DeviceRef], None] | None = None) -> None:
        self.cache = cache
        self.kube = kube
        self.settings = settings or HandoffSettings()
        self.on_cleared = on_cleared  # the signals controller's enqueue (None without signals)
        self.queue = WorkQueue("handoff")
        self._actions: dict[str, str] = {}
        self._counts: Counter[str] = Counter({action: 0 for action in actions.ACTIONS})
        for action in actions.ACTIONS:
            metrics.REPAIR_RECOMMENDED.labels(action).set(0)
        self._written: dict[str, tuple[int, Body]] = {}
        self._served: bool | None = None
        self._served_checked = float("-inf")
        self._not_served_reported = False
        self._listing: list[Body] | None = None
        self._listed_at = float("-inf")
        self._cleared_seen: set[str] = set()   # record faults whose request was seen cleared
        self._holding: set[str] = set()        # records whose verified clear the gate held (released once known)
        self._node_locks: dict[str, asyncio.Lock] = {}  # one plan-and-create at a time per node (many workers)
        self._reported: set[tuple[str, str]] = set()

    def enqueue(self, name: str) -> None:
        self.queue.add(name)

    def enqueue_all(self) -> None:
        present = {record["metadata"]["name"] for record in self.cache.records()}
        # A record deleted while a watch was down sent no event: its reconcile takes it out of the gauge.
        for name in sorted(present | set(self._actions)):
            self.queue.add(name)

    # --- deciding -----------------------------------------------------------------------------

    def recommendation(self, record: Body) -> tuple[Recommendation, bool]:
        """The record's recommendation, and whether a node's condition made its mark (a signal record's rule)."""
        rule, policy_name = self._deciding_rule(record)
        found = actions.recommend(record, rule=rule, policy=policy_name,
                                  observations=signal_records.record_observations(record))
        return found, rule is not None and rule.source == SOURCE_NODE

    def _deciding_rule(self, record: Body) -> tuple[policy.Rule | None, str | None]:
        if not signal_records.is_signal_record(record):
            return None, None
        decided = (record.get("status") or {}).get("decision") or {}
        name, rule_name = decided.get("policy"), decided.get("rule")
        if not name or not rule_name:
            return None, None
        body = next((b for b in self.cache.health_policies() if b["metadata"].get("name") == name), None)
        parsed = policy.parse_policy(body)[0] if body is not None else None
        return (parsed.rule(str(rule_name)) if parsed is not None else None), str(name)

    def _fault(self, record: Body, *, on_node: str | None = None) -> externalfaults.Fault | None:
        """The record's node-scoped fault, or None (not node-scoped, or its device is not published; or, with
        `on_node`, not on that node: the cheap look-ups go first, as every record is asked for a node's faults)."""
        ref = records.record_ref(record)
        if ref is None or records.record_effect(record) not in externalfaults.MARKED:
            return None
        published = externalfaults.device_node(ref, self.cache.resource_slices_of_pool(ref.driver, ref.pool))
        if published is None or (on_node is not None and published[0] != on_node):
            return None
        node, device = published
        found, node_condition = self.recommendation(record)
        if not externalfaults.node_scoped(record, found, node_condition=node_condition):
            return None
        why = f"{records.record_reason(record)[:200]} (recommends {found.action}: {found.source})"
        return externalfaults.Fault(record=record["metadata"]["name"], key=externalfaults.fault_key(record),
                                    node=node, gpu_uuid=externalfaults.gpu_uuid(ref.driver, device),
                                    action=found.action, why=why)

    def recovery_hold(self, record: Body) -> str | None:
        """Why a verified clear of this record must wait for NVSentinel's repair, or None (the signals controller
        asks before it applies one)."""
        if not self.settings.nvsentinel or self._served is False:
            return None
        fault = self._fault(record)
        if fault is None:
            return None
        if self._served is None:  # after a start or a failover, before the hand-off has looked: not known yet
            return "the hand-off has not read NVSentinel's ExternalFaults yet"
        return externalfaults.recovery_hold(fault.key, fault.node, self._listing or [])

    # --- reconcile ----------------------------------------------------------------------------

    async def reconcile(self, key: Hashable) -> None:
        name = cast(str, key)
        record = self.cache.record(name)
        if record is None:
            self._note_action(name, None)
            self._written.pop(name, None)
            return
        found, _ = self.recommendation(record)
        try:
            request = await self._hand_off(record) if self.settings.nvsentinel else None
        except ApiError as exc:
            # The hand-off failed (a 403 without manifests/nvsentinel's grant, NVSentinel's webhook refusing):
            # the recommendation any repair system reads is written all the same; the hand-off is retried.
            if not isinstance(exc, NotLeader):
                await self._write(record, found, (record.get("status") or {}).get("externalFault"))
            raise
        await self._write(record, found, request)

    async def _write(self, record: Body, found: Recommendation, request: str | None) -> None:
        name = record["metadata"]["name"]
        status = dict(record.get("status") or {})
        written = self._written.get(name)
        if written is not None and resource_version(record) <= written[0]:
            status.update(written[1])  # the watch has not brought our last write back yet
        desired: Body = {"recommendedAction": found.action, "recommendedActionSource": found.source[:1024],
                         "externalFault": request}
        before = status.get("recommendedAction")
        self._note_action(name, found.action)
        if found.action == actions.NONE and request is None and before in (None, actions.NONE):
            return  # nothing recommended and nothing said yet: absent means None, and a record costs no write
        if all(status.get(k) == v for k, v in desired.items()):
            return
        result = await self.kube.merge_patch_cluster_object(RECORDS_API, records.PLURAL, name, {"status": desired},
                                                            subresource="status")
        self._written[name] = (resource_version(result), desired)
        if found.action != before and (before is not None or found.action != actions.NONE):
            log.info("record %s: recommended action %s (%s)", name, found.action, found.source)
            await self._event(record, "Normal", RECOMMENDED, f"recommended action {found.action}: {found.source}")

    def _note_action(self, name: str, action: str | None) -> None:
        """The record's action in the gauge (None: the record is gone); counted as it changes, not recounted."""
        before = self._actions.pop(name, None)
        if action is not None:
            self._actions[name] = action
        for changed, step in ((before, -1), (action, 1)):
            if changed is not None and before != action:
                self._counts[changed] += step
                metrics.REPAIR_RECOMMENDED.labels(changed).set(self._counts[changed])

    # --- NVSentinel ---------------------------------------------------------------------------

    async def _hand_off(self, record: Body) -> str | None:
        """Hand the record's node-scoped fault off; the name of the request covering it (None: none)."""
        fault = self._fault(record)
        if fault is None:
            return None
        if not await self._nvsentinel_served(record):
            self._release(record)  # a clear held while it was not known yet
            return None
        async with self._node_locks.setdefault(fault.node, asyncio.Lock()):
            try:
                listing = await self._external_faults()
            except NotServed:  # the CRD went away: said once, looked for again at the next poll
                self._served, self._served_checked, self._listing = None, time.monotonic(), None
                self.queue.add_after(fault.record, self.settings.poll_seconds)
                return None
            # Every record is looked at only when a request may open: not at each poll of a handed-off record.
            if externalfaults.may_open(fault.key, fault.node, listing):
                faults = [f for r in self.cache.records() if (f := self._fault(r, on_node=fault.node)) is not None]
                node_plan = externalfaults.plan_node(fault.node, faults, listing, now())
                if node_plan.create is not None:
                    keys = externalfaults.covered_keys(node_plan.create)
                    await self._create(node_plan.create, [r for r in self.cache.records()
                                                          if externalfaults.fault_key(r) in keys])
                    listing = await self._external_faults(fresh=True)
        covering = [f for f in listing if fault.key in externalfaults.covered_keys(f)]
        if any(externalfaults.is_cleared(f) for f in covering):
            if fault.key not in self._cleared_seen:
                self._cleared_seen.add(fault.key)
                names = ", ".join(str(f["metadata"]["name"]) for f in covering)
                log.info("record %s: NVSentinel cleared the fault (ExternalFault %s)", fault.record, names)
                await self._event(record, "Normal", CLEARED, f"ExternalFault {names} is FaultCleared: a verified "
                                  "clear of this record now applies")
                self._release(record, held_only=False)
        else:
            self.queue.add_after(fault.record, self.settings.poll_seconds)
        return str(covering[-1]["metadata"]["name"]) if covering else None

    def _release(self, record: Body, *, held_only: bool = True) -> None:
        """The signals controller looks at the record again: a verified clear the gate held may apply now
        (`held_only`: only if the gate held one since this process started)."""
        name, ref = record["metadata"]["name"], records.record_ref(record)
        if (name in self._holding or not held_only) and self.on_cleared is not None and ref is not None:
            self._holding.discard(name)
            self.on_cleared(ref)

    async def _create(self, body: Body, covered: list[Body]) -> None:
        name = body["metadata"]["name"]
        try:
            await self.kube.create_cluster_object(externalfaults.API_VERSION, externalfaults.PLURAL, body)
        except ApiError as exc:
            if exc.status == 409:
                return  # made by an earlier reconcile: the listing did not show it yet
            metrics.REPAIR_REQUESTS.labels("error").inc()
            message = f"creating ExternalFault {name} failed: {exc}"
            log.error("%s", message)
            for record in covered[:1]:
                await self._event_once(record, REQUEST_FAILED, message)
            raise
        metrics.REPAIR_REQUESTS.labels("created").inc()
        event = body["spec"]["healthEvent"]
        uuids = ", ".join(e["entityValue"] for e in event["entitiesImpacted"]) or "no GPU UUID published"
        log.info("ExternalFault %s created for node %s (%s): %s", name, event["nodeName"], uuids, event["message"])
        for record in covered:
            await self._event(record, "Normal", REQUESTED, f"repair requested from NVSentinel: ExternalFault {name} "
                              f"for node {event['nodeName']} ({uuids})")

    async def _nvsentinel_served(self, record: Body) -> bool:
        if self._served is None or (not self._served and time.monotonic() - self._served_checked >= SERVED_RECHECK):
            self._served_checked = time.monotonic()
            self._served = await self.kube.served_version(externalfaults.GROUP, externalfaults.PLURAL,
                                                          (externalfaults.VERSION,)) is not None
            if self._served:
                self._not_served_reported = False
                log.info("NVSentinel's ExternalFault (%s/%s) is served: node-scoped faults are handed off",
                         externalfaults.GROUP, externalfaults.VERSION)
        if not self._served and not self._not_served_reported:
            self._not_served_reported = True
            message = (f"--nvsentinel-handoff is on but the cluster does not serve {externalfaults.PLURAL}."
                       f"{externalfaults.GROUP}/{externalfaults.VERSION} (is NVSentinel's janitor installed?): no "
                       f"repair is requested; claimwarden looks again every {SERVED_RECHECK:g} s")
            log.warning("%s", message)
            await self._event(record, "Warning", NOT_SERVED, message)
        return bool(self._served)

    async def _external_faults(self, *, fresh: bool = False) -> list[Body]:
        if fresh or self._listing is None or time.monotonic() - self._listed_at >= LISTING_TTL:
            self._listing = await self.kube.list_cluster_objects(externalfaults.API_VERSION, externalfaults.PLURAL)
            self._listed_at = time.monotonic()
        return self._listing

    # --- events -------------------------------------------------------------------------------

    async def held(self, record: Body, why: str) -> None:
        """A verified clear of the record waits for the repair: said once per record fault (the signals' gate)."""
        self._holding.add(record["metadata"]["name"])
        await self._event_once(record, HELD, f"the verified clear waits: {why}", event_type="Normal")

    async def _event_once(self, record: Body, reason: str, message: str, event_type: str = "Warning") -> None:
        marker = (externalfaults.fault_key(record), message)
        if marker in self._reported:
            return
        self._reported.add(marker)
        await self._event(record, event_type, reason, message)

    async def _event(self, involved: Body, event_type: str, reason: str, message: str) -> None:
        try:
            await self.kube.post_event(involved, event_type, reason, message)
        except ApiError as exc:
            log.warning("could not post event %s on %s: %s", reason, involved["metadata"].get("name"), exc)

