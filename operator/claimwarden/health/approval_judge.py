"""Judging each record's approval as it counts now, and saying so once when it does not.

approval.py decides on one record and the state of the approval policy; admission.py reads that policy
every 15 s. What lies between them lives here, per record: an approval counts only once a fresh read of
the policy after it was seen confirmed it (``confirmed``); the approvals present when the policy or its
binding was found created again are distrusted until approved again (``distrusted``); an approval set
while the policy was missing is removed, loudly (``removed``, remembered while the policy stays missing,
for the record's Approved condition); and an approval that does not count is reported by one Warning
Event (``reported``). When the policy comes or goes, every approved record is looked at again.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from .. import metrics
from ..cache import Body, Cache
from ..kube.api import Kube
from . import approval, records
from .admission import AdmissionPolicies
from .record_status import condition, condition_true

log = logging.getLogger("claimwarden.health")

APPROVAL_IGNORED = "ApprovalIgnored"
APPROVAL_REMOVED = "ApprovalRemoved"
RECREATED = (f"the ValidatingAdmissionPolicy {approval.POLICY} or its binding was created again since claimwarden last "
             "read it, and the approval may have been set in between")

PostEvent = Callable[[Body, str, str, str], Awaitable[None]]


class ApprovalJudge:
    """Each record's approval verdict, with the per-record memory that verdict needs."""

    def __init__(self, *, cache: Cache, kube: Kube, post_event: PostEvent,
                 look_again: Callable[[str], None]) -> None:
        """`look_again(record)`: queue the record's reconcile (its approval may count differently now)."""
        self.cache = cache
        self.kube = kube
        self._post_event = post_event
        self._look_again = look_again
        self.admission = AdmissionPolicies(kube, on_change=self._policy_changed)
        self._reported: dict[str, str] = {}  # record -> the ignored approval's reason an Event said
        # Records whose approval was there when the approval policy was found created again (admission.py).
        self._distrusted: set[str] = set()
        self._removed: dict[str, approval.Verdict] = {}  # record -> the approval removed, while the policy is missing
        # record -> (by, generation) of the approval a fresh read of the policy confirmed (admission.confirm).
        self._confirmed: dict[str, tuple[str, int | None]] = {}

    def approved(self, record: Body) -> str | None:
        """Who approved the record's evictions past the breaker, when the approval counts (approval.py) and a read
        of the policy after it was seen confirmed it (its record's reconcile does that first)."""
        verdict = self._verdict(record)
        if verdict.honoured is None or self._confirmed.get(record["metadata"]["name"]) != (verdict.by,
                                                                                           verdict.generation):
            return None
        return verdict.honoured

    async def judge(self, record: Body) -> approval.Verdict:
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
            verdict = await self._remove(record, verdict)
        return verdict

    async def conditions(self, record: Body, status: Body, verdict: approval.Verdict) -> list[dict[str, Any]]:
        """The record's Approved condition as its status should show it (none, or one), built on `status`; an
        approval that does not count is reported once on the way."""
        if verdict.reason:
            shown = condition(status, approval.CONDITION, "True" if verdict.honoured else "False",
                              verdict.reason, verdict.message)
            await self._report_ignored(record, status, verdict)
            return [shown]
        if self.admission.approval_in_force:
            return []
        # An approval removed for want of the policy stays reported while the policy is missing (its status
        # write may still be on its way: then from memory).
        removed = self._removed.get(record["metadata"]["name"])
        if removed is not None:
            return [condition(status, approval.CONDITION, "False", removed.reason, removed.message)]
        return [c for c in status.get("conditions") or []
                if c.get("type") == approval.CONDITION and c.get("reason") == approval.UNVERIFIED]

    def forget(self, name: str) -> None:
        self._reported.pop(name, None)
        self._distrusted.discard(name)
        self._removed.pop(name, None)
        self._confirmed.pop(name, None)

    def _verdict(self, record: Body) -> approval.Verdict:
        if record["metadata"]["name"] in self._distrusted:
            return approval.judge(record, policy_in_force=False, why=RECREATED)
        return approval.judge(record, policy_in_force=self.admission.approval_in_force,
                              why=self.admission.approval_problem)

    async def _policy_changed(self, recreated: bool) -> None:
        """The approval policy came or went, or was created again: every approved record is decided again."""
        if self.admission.approval_in_force:
            self._removed.clear()
        self._confirmed.clear()
        for record in self.cache.records():
            name = record["metadata"]["name"]
            if approval.APPROVED_BY in ((record.get("metadata") or {}).get("annotations") or {}):
                if recreated:
                    self._distrusted.add(name)
                self._look_again(name)
            elif condition_true(record, approval.CONDITION, status="False"):  # an approval removed: said no more
                self._look_again(name)

    async def _remove(self, record: Body, verdict: approval.Verdict) -> approval.Verdict:
        """Remove an approval set while the approval policy was not in force (approval.py), loudly; the verdict
        as the record's condition shows it."""
        name = record["metadata"]["name"]
        await self.kube.merge_patch_cluster_object(records.API_VERSION, records.PLURAL, name, approval.removal(record))
        self._distrusted.discard(name)
        removed = dataclasses.replace(verdict, message=verdict.message + approval.REMOVED)
        self._removed[name] = removed
        metrics.APPROVALS_IGNORED.labels(verdict.reason).inc()
        log.warning("record %s: %s", name, removed.message)
        await self._post_event(record, "Warning", APPROVAL_REMOVED, removed.message)
        return removed

    async def _report_ignored(self, record: Body, status: Body, verdict: approval.Verdict) -> None:
        """A Warning Event and a count, once, when a record's approval turns out not to count (the Approved
        condition in status remembers it across restarts)."""
        name = record["metadata"]["name"]
        shown = next((c.get("reason") for c in status.get("conditions") or [] if c.get("type") == approval.CONDITION),
                     None)
        if verdict.honoured is not None or verdict.reason == approval.UNVERIFIED:  # the removal reports that
            self._reported.pop(name, None)
            return
        if verdict.reason in (shown, self._reported.get(name)):
            return
        self._reported[name] = verdict.reason
        metrics.APPROVALS_IGNORED.labels(verdict.reason).inc()
        log.warning("record %s: %s", name, verdict.message)
        await self._post_event(record, "Warning", APPROVAL_IGNORED, verdict.message)
