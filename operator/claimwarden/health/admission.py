"""Whether the admission policies claimwarden relies on are installed, read every ``INTERVAL`` seconds.

Approvals count only while the ValidatingAdmissionPolicy `claimwarden-approval` and a binding that
denies are in place (approval.py). Every replica reads them (one GET per policy and one LIST of the
bindings, a few objects), so a new leader knows at once; the first read happens at start-up, before the
controllers run. Until a read succeeded the policy counts as missing. A change is logged, shown by
``claimwarden_admission_policy_installed{policy}`` and handed to ``on_change`` (the health controller
looks at every approved record again); so is a policy or binding found with a new UID (deleted and
created again between two reads: ``on_change(recreated=True)``, whose approvals may have been set
unchecked in between). The marking policy (manifests/marking) is optional: it is
only reported.

Reads every 15 s leave a gap: a binding deleted just after a read, an approval forged, and neither
seen for up to 15 s. So before an approval counts for the first time, ``confirm`` reads again (a read
that starts after the approval was seen, shared by the approvals that wait for one): the binding is
then found missing, or created again (new UID), and the approval is removed instead.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine
from typing import Any

from .. import metrics
from ..kube.api import Kube
from ..kube.errors import ApiError
from . import approval

log = logging.getLogger("claimwarden.health")

API = "admissionregistration.k8s.io/v1"
INTERVAL = 15.0
MARKING_POLICY = "claimwarden-marking"


class AdmissionPolicies:
    def __init__(self, kube: Kube, on_change: Callable[[bool], Coroutine[Any, Any, None]] | None = None) -> None:
        self.kube = kube
        self.on_change = on_change
        self.approval_in_force = False
        self.approval_problem = "the admission policies were not read yet"
        self.marking_in_force: bool | None = None
        self.known = False
        """False until a read succeeded: approvals do not count then, but are not removed either."""
        self._uids: tuple[str, ...] = ()
        self._lock = asyncio.Lock()
        self._read_started = float("-inf")  # time.monotonic() when the last read began

    async def confirm(self) -> bool:
        """Read again (or wait for a read that began after this call): True when the approval policy is still in
        force, unchanged. A change found is handled as any other (``on_change``)."""
        asked = time.monotonic()
        async with self._lock:
            if self._read_started < asked:
                await self.refresh()
        return self.approval_in_force

    async def refresh(self) -> None:
        self._read_started = time.monotonic()
        try:
            await self._refresh()
        except ApiError as exc:
            if exc.status not in (401, 403):
                raise
            # Not allowed to look (the ClusterRole of manifests/base grants it): the policy cannot be vouched for.
            await self._found(False, f"claimwarden may not read ValidatingAdmissionPolicies ({exc})", False, ())

    async def _refresh(self) -> None:
        policy = await self.kube.get_cluster_object(API, "validatingadmissionpolicies", approval.POLICY)
        marking = await self.kube.get_cluster_object(API, "validatingadmissionpolicies", MARKING_POLICY)
        bindings = await self.kube.list_cluster_objects(API, "validatingadmissionpolicybindings")
        in_force, problem = approval.policy_in_force(policy, bindings)
        await self._found(in_force, problem, approval.policy_bound(MARKING_POLICY, marking, bindings),
                          approval.policy_uids(policy, bindings) if in_force else ())

    async def _found(self, in_force: bool, problem: str, marking_in_force: bool, uids: tuple[str, ...]) -> None:
        changed = in_force != self.approval_in_force or not self.known
        # A binding added is no gap; the policy or a binding seen before with another UID (or gone) may be one.
        # Back after a read found it missing: approvals set in between were not checked, and one whose record was
        # not reconciled (and so not removed) meanwhile must not count now.
        recreated = in_force and ((self.known and not self.approval_in_force) or (
            self.approval_in_force and bool(self._uids) and (
                uids[0] != self._uids[0] or not set(self._uids[1:]) <= set(uids[1:]))))
        self.approval_in_force, self.approval_problem, self.known = in_force, problem, True
        self._uids = uids
        metrics.ADMISSION_POLICY.labels(approval.POLICY).set(1 if in_force else 0)
        metrics.ADMISSION_POLICY.labels(MARKING_POLICY).set(1 if marking_in_force else 0)
        if marking_in_force != self.marking_in_force:
            self.marking_in_force = marking_in_force
            if not marking_in_force:
                log.info("ValidatingAdmissionPolicy %s is not installed: whoever may write a ResourceSlice may mark "
                         "its devices (docs/concepts/safety.md \"Who may mark\")", MARKING_POLICY)
        if recreated:
            log.warning("ValidatingAdmissionPolicy %s or its binding was created again since the last read: approvals "
                        "present now may have been set unchecked meanwhile and are removed", approval.POLICY)
        elif not changed:
            return
        elif in_force:
            log.info("ValidatingAdmissionPolicy %s and its binding are installed: approvals are honoured",
                     approval.POLICY)
        else:
            log.warning("approvals are not honoured: %s (apply manifests/approval)", problem)
        if self.on_change is not None:
            await self.on_change(recreated)

    async def run(self) -> None:
        while True:
            await asyncio.sleep(INTERVAL)
            try:
                async with self._lock:  # so that ``confirm`` waits for a read under way rather than skip it
                    await self.refresh()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the next round retries; what was read last stays in force
                log.warning("reading the admission policies failed: %s", exc)
