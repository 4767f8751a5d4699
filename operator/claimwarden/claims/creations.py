"""Claims this operator creates, for a pod or for a PodGroup: what both controllers share.

A created claim reaches the cache only when the watch delivers it. Until then it is remembered here
(`with_recent`), so that planning does not create a second one on a quick retry: upstream keeps a
mutation cache for the same reason. The templates a claim is made from come from the cache, read by
name only when their spec was too big to keep in memory (`complete_templates`). A failure is posted
as a Warning event with one reason (`FAILED_CREATION`), on the pod or on the PodGroup.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping
from typing import Any

from ..cache import Body, Cache
from ..kube.api import Kube
from ..kube.errors import ApiError
from ..objects import trimmed

log = logging.getLogger("claimwarden.claims")

FAILED_CREATION = "FailedResourceClaimCreation"
RECENT_TTL = 300.0
"""Seconds a created claim stays visible to planning while the cache does not show it."""
APPLIED_FRESH = 10.0
"""Seconds a status apply of the claims recorded on a pod or PodGroup counts as current: within them
the same entries are not applied again (the echo of our own apply changes nothing)."""

Recents = dict[str, dict[str, tuple[float, Body]]]
"""Owner UID -> claim name -> (monotonic creation time, claim): created, not in the cache yet."""


def with_recent(cached: list[Body], recents: Recents, owner_uid: str) -> list[Body]:
    """The owner's claims in the cache plus those created for it that the cache does not show yet.

    `recents` forgets a claim once the cache shows it or after RECENT_TTL.
    """
    now = time.monotonic()
    owned = {c["metadata"]["name"]: c for c in cached}
    recent = recents.get(owner_uid, {})
    for claim_name, (created_at, body) in list(recent.items()):
        if now - created_at > RECENT_TTL or claim_name in owned:
            del recent[claim_name]
        else:
            owned[claim_name] = body
    if not recent:
        recents.pop(owner_uid, None)
    return list(owned.values())


def remember_created(recents: Recents, owner_uid: str, created: Body) -> None:
    """Keep a claim just created (trimmed as the cache keeps it) until the cache shows it."""
    recents.setdefault(owner_uid, {})[created["metadata"]["name"]] = (time.monotonic(), trimmed.claim(created))


def cached_templates(cache: Cache, namespace: str, entries: Iterable[dict[str, Any]]) -> dict[str, Body]:
    """The cached templates that `resourceClaims` entries (of a pod or a PodGroup) name, by name."""
    templates = {}
    for entry in entries:
        template_name = entry.get("resourceClaimTemplateName")
        if template_name and (template := cache.template(namespace, template_name)) is not None:
            templates[template_name] = template
    return templates


async def complete_templates(kube: Kube, namespace: str, templates: Mapping[str, Body],
                             names: set[str]) -> dict[str, Body | None]:
    """The named templates to make claims from: the cached ones, but those whose spec was too big to keep
    in memory (`trimmed.is_trimmed`) read by name (None when gone meanwhile)."""
    return {name: await kube.get_template(namespace, name) if trimmed.is_trimmed(templates[name])
            else templates[name] for name in sorted(names)}


async def warn_failed_creation(kube: Kube, involved: Body, message: str, *, kind: str) -> None:
    """Post the failure as a Warning event on the pod or PodGroup (`kind` names it in the log when that fails)."""
    try:
        await kube.post_event(involved, "Warning", FAILED_CREATION, message)
    except ApiError as exc:
        log.warning("could not post event on %s %s/%s: %s", kind, involved["metadata"].get("namespace"),
                    involved["metadata"].get("name"), exc)
