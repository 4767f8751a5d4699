"""Small copies of watched objects, in their API shape, for the in-memory indices.

Only the fields the controllers decide on are kept (no managedFields, no container specs), so a
cluster with many pods costs little memory. Each projection is still a valid input to the
planning functions, which read objects in the raw JSON shape.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

Body = dict[str, Any]
_META_KEYS = ("name", "namespace", "uid", "resourceVersion", "creationTimestamp", "deletionTimestamp")


def _meta(body: Mapping[str, Any], *extra: str) -> Body:
    meta = body.get("metadata") or {}
    return {k: copy.deepcopy(meta[k]) for k in (*_META_KEYS, *extra) if meta.get(k) is not None}


def pod(body: Mapping[str, Any]) -> Body:
    spec = body.get("spec") or {}
    status = body.get("status") or {}
    group = {"schedulingGroup": copy.deepcopy(spec["schedulingGroup"])} if spec.get("schedulingGroup") else {}
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": _meta(body),
        "spec": {"nodeName": spec.get("nodeName"),
                 "resourceClaims": copy.deepcopy(spec.get("resourceClaims") or []), **group},
        "status": {"phase": status.get("phase"),
                   "resourceClaimStatuses": copy.deepcopy(status.get("resourceClaimStatuses") or [])},
    }


def claim(body: Mapping[str, Any]) -> Body:
    status = body.get("status") or {}
    projected: Body = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                       "metadata": _meta(body, "annotations", "labels", "ownerReferences", "finalizers"),
                       "status": {}}
    requests = _request_tolerations(((body.get("spec") or {}).get("devices") or {}).get("requests") or [])
    if requests:
        projected["spec"] = {"devices": {"requests": requests}}
    allocation = status.get("allocation")
    if allocation:
        devices = allocation.get("devices") or {}
        projected["status"]["allocation"] = {"devices": {"results": copy.deepcopy(devices.get("results") or [])}}
    if status.get("reservedFor"):
        projected["status"]["reservedFor"] = copy.deepcopy(status["reservedFor"])
    return projected


def _request_tolerations(requests: list[Any]) -> list[Body]:
    """Only the request names and tolerations (1.34 never copies tolerations into results)."""
    kept = []
    for request in requests:
        exactly = request.get("exactly") or {}
        subs = [{"name": sub.get("name"), "tolerations": copy.deepcopy(sub["tolerations"])}
                for sub in request.get("firstAvailable") or [] if sub.get("tolerations")]
        if exactly.get("tolerations") or subs:
            entry: Body = {"name": request.get("name")}
            if exactly.get("tolerations"):
                entry["exactly"] = {"tolerations": copy.deepcopy(exactly["tolerations"])}
            if subs:
                entry["firstAvailable"] = subs
            kept.append(entry)
    return kept


def template(body: Mapping[str, Any]) -> Body:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": _meta(body), "spec": copy.deepcopy(dict(body.get("spec") or {}))}


def podgroup(body: Mapping[str, Any]) -> Body:
    """Only what PodGroup claims need: the claim entries and their statuses."""
    spec = body.get("spec") or {}
    status = body.get("status") or {}
    return {"apiVersion": body.get("apiVersion"), "kind": "PodGroup", "metadata": _meta(body, "finalizers"),
            "spec": {"resourceClaims": copy.deepcopy(spec.get("resourceClaims") or [])},
            "status": {"resourceClaimStatuses": copy.deepcopy(status.get("resourceClaimStatuses") or [])}}


def resource_slice(body: Mapping[str, Any]) -> Body:
    spec = body.get("spec") or {}
    pool = spec.get("pool") or {}
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": _meta(body, "annotations"),
            "spec": {"driver": spec.get("driver"), "nodeName": spec.get("nodeName"),
                     "pool": {"name": pool.get("name"), "generation": pool.get("generation")},
                     "devices": [{"name": d.get("name")} for d in spec.get("devices") or []]}}


def record(body: Mapping[str, Any]) -> Body:
    return {"apiVersion": body.get("apiVersion"), "kind": body.get("kind"),
            "metadata": _meta(body, "labels", "annotations", "generation"),
            "spec": copy.deepcopy(dict(body.get("spec") or {})),
            "status": copy.deepcopy(dict(body.get("status") or {}))}
