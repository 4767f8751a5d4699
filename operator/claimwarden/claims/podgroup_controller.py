"""PodGroup claims: the queue and the API calls (decisions are in podgroups.py).

Runs only where the cluster serves PodGroups; `version` is the served one (discovery at start-up).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Hashable
from typing import cast

from .. import metrics
from ..cache import Body, Cache
from ..kube.api import Kube
from ..kube.errors import ApiError
from ..objects.pods import claim_statuses
from ..runtime.workqueue import Retry, WorkQueue
from . import generation, podgroups
from .creations import (
    APPLIED_FRESH,
    Recents,
    cached_templates,
    complete_templates,
    remember_created,
    warn_failed_creation,
    with_recent,
)

log = logging.getLogger("claimwarden.podgroups")

NAME = "podgroups"


class PodGroupRetry(Retry):
    """Some PodGroup claims could not be handled yet; the PodGroup is retried with back-off."""


class PodGroupsController:
    def __init__(self, cache: Cache, kube: Kube, version: str,
                 *, on_claim: Callable[[str, str], None] | None = None) -> None:
        self.cache = cache
        self.kube = kube
        self.version = version
        # Called with (namespace, PodGroup name) when a claim was created or recorded, so that member
        # pods record it without waiting for the claim's watch event (None in tests).
        self._on_claim = on_claim
        self.queue = WorkQueue(NAME)
        self._recent: Recents = {}  # keyed by PodGroup UID
        # PodGroup UID -> (when, entry name -> claim name): what the last status apply carried.
        self._applied: dict[str, tuple[float, dict[str, str]]] = {}

    @property
    def api_version(self) -> str:
        return f"{podgroups.GROUP}/{self.version}"

    def enqueue(self, namespace: str, name: str) -> None:
        self.queue.add((namespace, name))

    def forget(self, uid: str) -> None:
        self._recent.pop(uid, None)
        self._applied.pop(uid, None)

    def owned_claims(self, namespace: str, uid: str) -> list[Body]:
        """Claims the PodGroup controls: the cache's, plus those created here that it does not show yet."""
        return with_recent(self.cache.claims_owned_by_podgroup(namespace, uid), self._recent, uid)

    async def reconcile(self, key: Hashable) -> None:
        namespace, name = cast(tuple[str, str], key)
        podgroup = self.cache.podgroup(namespace, name)
        if podgroup is None:
            return
        uid = podgroup["metadata"].get("uid", "")
        owned = self.owned_claims(namespace, uid)
        claims = {c["metadata"]["name"]: c for c in owned}
        for entry in claim_statuses(podgroup).values():
            claim_name = entry.get("resourceClaimName")
            if claim_name and claim_name not in claims and (found := self.cache.claim(namespace, claim_name)):
                claims[claim_name] = found
        templates = cached_templates(self.cache, namespace, podgroup.get("spec", {}).get("resourceClaims") or [])

        group_plan = podgroups.plan_podgroup(podgroup, claims, owned, templates)
        sources = await complete_templates(self.kube, namespace, templates,
                                           {c.template_name for c in group_plan.create})
        recorded = {r.pod_claim_name: r.claim_name for r in group_plan.record}
        failures = [f"PodGroupResourceClaim {p.pod_claim_name}: {p.message}" for p in group_plan.problems]
        for create in group_plan.create:
            template = sources[create.template_name]
            if template is None:
                failures.append(f"PodGroupResourceClaim {create.pod_claim_name}: "
                                f"{generation.missing_template_message(create.template_name)}")
                continue
            body = podgroups.build_podgroup_claim(podgroup, create.pod_claim_name, template, self.api_version)
            try:
                created = await self.kube.create_claim(namespace, body)
            except ApiError as exc:
                metrics.CLAIM_CREATIONS.labels("failure").inc()
                failures.append(f"PodGroupResourceClaim {create.pod_claim_name}: create ResourceClaim: {exc.message}")
                continue
            metrics.CLAIM_CREATIONS.labels("success").inc()
            claim_name = created["metadata"]["name"]
            remember_created(self._recent, uid, created)
            recorded[create.pod_claim_name] = claim_name
            log.info("PodGroup %s/%s: created ResourceClaim %s from template %s for its claim %s", namespace, name,
                     claim_name, create.template_name, create.pod_claim_name)
        if recorded:
            applied_at, applied = self._applied.get(uid, (0.0, {}))
            entries = generation.status_entries(podgroup, recorded, applied)
            wanted = {e["name"]: e["resourceClaimName"] for e in entries}
            if wanted != applied or time.monotonic() - applied_at > APPLIED_FRESH:
                await self.kube.apply_podgroup_claim_statuses(self.version, namespace, name, entries)
                self._applied[uid] = (time.monotonic(), wanted)
            if self._on_claim is not None:
                self._on_claim(namespace, name)
        if failures:
            involved = {**podgroup, "apiVersion": self.api_version, "kind": podgroups.KIND}
            for message in failures:
                await warn_failed_creation(self.kube, involved, message, kind="PodGroup")
            raise PodGroupRetry("; ".join(failures))
