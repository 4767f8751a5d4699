"""Writing a record's status: only when it changed, paced, and built on our own last write.

A record's reconcile hands over what it decided (its plan, its quarantine claims and rule, the
breaker's pause, the approval verdict); this module turns that into ``status`` and writes it.

- **Paced** (counts.py): at most once per interval, not once per pod; a wave of evictions under way goes
  first (wave.py); and the first write of a record whose device is changing hands (``settle``,
  record_status.settling) waits up to FIRST_WRITE_SETTLE s for the claims holding it to let go, so that
  one write carries the evictions and the quarantine claim rather than one each. A paced record is
  looked at again when its write may go out. A new set of quarantine claims is never paced.
- **Built on our last write** (``_written``): the watch may not have brought that write back yet, and
  conditions built on the stale status would get a new lastTransitionTime at every lagging event.
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Callable
from typing import Any

from ..cache import Body, resource_version
from ..kube.api import Kube
from ..timestamps import format_rfc3339, now
from . import approval, breaker, plan, record_status, records, siblings
from .approval_judge import ApprovalJudge
from .evictions import Evictions
from .records import DeviceRef
from .sibling_records import SiblingRecords
from .wave import HOLD_RECHECK, Wave

FIRST_WRITE_SETTLE = 10.0  # seconds a record's first status may wait for its device to settle


class StatusWrites:
    """Each record's status writes, and the last status this process wrote for it."""

    def __init__(self, *, kube: Kube, evictions: Evictions, approvals: ApprovalJudge, siblings: SiblingRecords,
                 wave: Wave, look_again_after: Callable[[str, float], None]) -> None:
        """`look_again_after(record, delay)`: queue the record's reconcile after `delay` s (a paced write)."""
        self.kube = kube
        self.evictions = evictions
        self.approvals = approvals
        self.siblings = siblings
        self.wave = wave
        self._look_again_after = look_again_after
        # record -> (resourceVersion our last status write returned, the status it wrote).
        self._written: dict[str, tuple[int, dict[str, Any]]] = {}

    async def write(self, record: Body, marked_at: datetime.datetime, record_plan: plan.RecordPlan,
                    quarantine: list[str], rule: str, *, paused: str, verdict: approval.Verdict,
                    held_back: bool = False, settle: bool = False) -> None:
        """Write the record's status when it changed, paced (see the module's docstring)."""
        name = record["metadata"]["name"]
        effect = records.record_effect(record)
        ref = records.record_ref(record) or DeviceRef("", "", "")
        status = record.get("status") or {}
        written = self._written.get(name)
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
            evicting = record_status.evicting(pending, evicted, drain, record_plan.drain_deadline)
        else:
            evicting = ("False", "NoEviction", f"effect {effect} evicts nothing; "
                        f"{record_plan.would_evict} pod(s) would be evicted by NoExecute")
        conditions = [
            record_status.condition(status, "Quarantined", *record_status.quarantined(effect, quarantine, record_plan)),
            record_status.condition(status, "Evicting", *evicting),
        ]
        if paused:
            conditions.append(record_status.condition(status, breaker.CONDITION, "True", "BreakerOpen", paused))
        conditions += await self.approvals.conditions(record, status, verdict)
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
                self._look_again_after(name, wait)
                return
            result = await self.kube.merge_patch_cluster_object(records.API_VERSION, records.PLURAL, name,
                                                                {"status": desired}, subresource="status")
            self._written[name] = (resource_version(result), desired)
            if self.evictions.ahead is not None:  # the next write ahead is guarded by this version, not refused
                self.evictions.ahead.note(result)
        self.evictions.counts_written(name, version)

    async def flush(self) -> None:
        """At shutdown, once the workers have stopped: write what lives only in memory (eviction counts)."""
        await self.evictions.flush_counts()

    def forget(self, name: str) -> None:
        self._written.pop(name, None)
