"""Objects deleted while a watch was down: found with live LISTs, confirmed, and forgotten.

Kopf removes an object from its indices only on a DELETED event. When a watch breaks (a restart of
the apiserver, a frozen operator, a 410 Gone after etcd compaction) Kopf lists again and so learns
of every object that exists, but never of those deleted meanwhile: they would stay indexed for good,
holding devices for pods that are gone or shadowing a new object of the same name. So, at every
resync, the uids of each indexed kind are compared with a live metadata-only LIST; an indexed object
missing from it is read once more by name (it may have been created after the LIST), and only if
that read confirms it is gone, or replaced under another UID, is it discarded from the indices.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass

from ..cache import Body, Cache
from ..kube.api import Kube
from ..objects.meta import metadata

log = logging.getLogger("claimwarden.staleness")


@dataclass(frozen=True)
class Kind:
    api: str
    """The API path prefix, e.g. /api/v1 or /apis/resource.k8s.io/v1."""
    plural: str
    namespaced: bool


KINDS = {
    "pods": Kind("/api/v1", "pods", namespaced=True),
    "resourceclaims": Kind("/apis/resource.k8s.io/v1", "resourceclaims", namespaced=True),
    "resourceclaimtemplates": Kind("/apis/resource.k8s.io/v1", "resourceclaimtemplates", namespaced=True),
    "resourceslices": Kind("/apis/resource.k8s.io/v1", "resourceslices", namespaced=False),
    "unhealthydevices": Kind("/apis/claimwarden.io/v1alpha1", "unhealthydevices", namespaced=False),
    "healthpolicies": Kind("/apis/claimwarden.io/v1alpha1", "healthpolicies", namespaced=False),
    "deviceclasses": Kind("/apis/resource.k8s.io/v1", "deviceclasses", namespaced=False),
    "nodes": Kind("/api/v1", "nodes", namespaced=False),
}


def missing_from(indexed: Iterable[Body], live_uids: set[str]) -> list[Body]:
    """The indexed objects whose UID the live list does not have (candidates, to be confirmed)."""
    return [obj for obj in indexed if str(metadata(obj).get("uid") or "") not in live_uids]


def is_confirmed_gone(indexed: Body, fresh: Body | None) -> bool:
    """True when a fresh read by name found nothing, or an object with another UID."""
    return fresh is None or metadata(fresh).get("uid") != metadata(indexed).get("uid")


async def prune_stale(kube: Kube, cache: Cache, forget: Callable[[Body], Awaitable[None]]) -> list[Body]:
    """Forget every indexed object that is confirmed gone; return them."""
    pruned: list[Body] = []
    for name, objects in cache.indexed().items():
        if not objects:
            continue
        # PodGroups are watched at whichever version the server serves; their projection keeps it.
        kind = KINDS.get(name) or Kind(f"/apis/{objects[0].get('apiVersion')}", name, namespaced=True)
        live = await kube.list_uids(kind.api, kind.plural)
        for obj in missing_from(objects, live):
            meta = metadata(obj)
            fresh = await kube.get_object(kind.api, kind.plural, str(meta.get("name") or ""),
                                          namespace=str(meta.get("namespace") or "") if kind.namespaced else None)
            if is_confirmed_gone(obj, fresh):
                await forget(obj)
                pruned.append(obj)
                log.info("forgot %s %s/%s (uid %s): deleted while a watch was down", name,
                         meta.get("namespace") or "", meta.get("name"), meta.get("uid"))
    return pruned
