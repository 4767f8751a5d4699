"""Small copies of watched objects, in their API shape, for the in-memory indices.

Only the fields the controllers decide on are kept (no managedFields, no container specs), so a
cluster with many pods costs little memory. Each projection is still a valid input to the
planning functions, which read objects in the raw JSON shape.

Whoever may create a claim or a template decides how big its labels, annotations, owner references
and finalizers are (annotations alone may take 256 KiB), and both replicas index every one: 2,000
such claims would fill the 512 Mi the pod is given. So of those lists only the entries claimwarden
reads are kept, named below, and a template's spec only up to TEMPLATE_SPEC_KEPT bytes (a bigger
one is read by name when a claim is made from it). A new read of a label, annotation or finalizer
must add its key here.
"""

from __future__ import annotations

import copy
from collections.abc import Collection, Mapping
from typing import Any

import orjson

from ..claims.podgroups import PROTECTION_FINALIZER
from ..health.records import ANNOTATION_PREFIX, DRAIN_ANNOTATION_PREFIX, GROUP, RECORD_LABEL
from .claims import DELETE_PROTECTION_FINALIZER, EXTENDED_RESOURCE_CLAIM_ANNOTATION, POD_CLAIM_NAME_ANNOTATION

Body = dict[str, Any]
_META_KEYS = ("name", "namespace", "uid", "resourceVersion", "creationTimestamp", "deletionTimestamp")

CLAIM_ANNOTATIONS = frozenset({POD_CLAIM_NAME_ANNOTATION, EXTENDED_RESOURCE_CLAIM_ANNOTATION})
CLAIM_LABELS = frozenset({RECORD_LABEL})  # quarantine claims (health/plan.py is_quarantine_claim)
CLAIM_FINALIZERS = frozenset({DELETE_PROTECTION_FINALIZER})
SLICE_ANNOTATION_PREFIXES = (ANNOTATION_PREFIX, DRAIN_ANNOTATION_PREFIX)  # marks (health/records.py)
RECORD_KEY_PREFIX = f"{GROUP}/"
"""Records are claimwarden's own (cluster-scoped, written by admins and by claimwarden): every
claimwarden.io/ label and annotation is kept (the approval annotation, SLICE_LABEL, and any added
later); others, e.g. kubectl's last-applied-configuration, are not."""
TEMPLATE_SPEC_KEPT = 16 * 1024
"""Bytes (as JSON) of a template's spec held in memory; a bigger spec is left out (`is_trimmed`)."""
_TRIMMED = "claimwarden.io/spec-not-kept"


def _meta(body: Mapping[str, Any], *extra: str) -> Body:
    meta = body.get("metadata") or {}
    return {k: copy.deepcopy(meta[k]) for k in (*_META_KEYS, *extra) if meta.get(k) is not None}


def _picked(values: Mapping[str, Any] | None, keys: Collection[str] = (), prefixes: tuple[str, ...] = ()) -> Body:
    """The entries of a label or annotation map whose key is one of `keys` or starts with one of `prefixes`."""
    return {k: v for k, v in (values or {}).items() if k in keys or (prefixes and k.startswith(prefixes))}


def _with(meta: Body, field: str, kept: Any) -> Body:
    """`meta` with `field` set to `kept` (what is left of the object's own), unless nothing is left."""
    if kept:
        meta[field] = kept
    return meta


def pod(body: Mapping[str, Any]) -> Body:
    spec = body.get("spec") or {}
    status = body.get("status") or {}
    group = {"schedulingGroup": copy.deepcopy(spec["schedulingGroup"])} if spec.get("schedulingGroup") else {}
    projected: Body = {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": _meta(body),
        "spec": {"nodeName": spec.get("nodeName"),
                 "resourceClaims": copy.deepcopy(spec.get("resourceClaims") or []), **group},
        "status": {"phase": status.get("phase"),
                   "resourceClaimStatuses": copy.deepcopy(status.get("resourceClaimStatuses") or [])},
    }
    health = _device_health(status)
    if health:
        projected["status"].update(health)
    extended = status.get("extendedResourceClaimStatus") or {}
    if extended.get("resourceClaimName"):  # the request mappings are the kubelet's business
        projected["status"]["extendedResourceClaimStatus"] = {"resourceClaimName": extended["resourceClaimName"]}
    return projected


def _device_health(status: Mapping[str, Any]) -> Body:
    """Of the container statuses, only the KEP-4680 device health (signals/podhealth.py reads it): a
    container without it is left out, and so is the field when no container has it."""
    kept: Body = {}
    for field in ("containerStatuses", "initContainerStatuses"):
        entries = [{"name": c.get("name"), "allocatedResourcesStatus": copy.deepcopy(c["allocatedResourcesStatus"])}
                   for c in status.get(field) or [] if c.get("allocatedResourcesStatus")]
        if entries:
            kept[field] = entries
    return kept


def claim(body: Mapping[str, Any]) -> Body:
    status = body.get("status") or {}
    meta = body.get("metadata") or {}
    # Only the controller reference is read (controlling_pod_ref, controlling_podgroup_ref); there is one at most.
    owners = [copy.deepcopy(ref) for ref in meta.get("ownerReferences") or [] if ref.get("controller") is True]
    kept = _meta(body)
    _with(kept, "annotations", _picked(meta.get("annotations"), CLAIM_ANNOTATIONS))
    _with(kept, "labels", _picked(meta.get("labels"), CLAIM_LABELS))
    _with(kept, "ownerReferences", owners)
    # The reservations controller removes the delete-protection finalizer by its index here: another
    # finalizer before it makes that index wrong, the patch's test op fails and the claim is read again.
    _with(kept, "finalizers", [f for f in meta.get("finalizers") or [] if f in CLAIM_FINALIZERS])
    projected: Body = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": kept, "status": {}}
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
    """The template with its spec: the claim's spec and the labels and annotations every claim made from
    it inherits, which must stay exact. A spec over TEMPLATE_SPEC_KEPT bytes is not kept; the claims
    controllers read such a template by name when they make a claim from it (`is_trimmed`)."""
    spec = dict(body.get("spec") or {})
    projected: Body = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate", "metadata": _meta(body)}
    if len(orjson.dumps(spec)) <= TEMPLATE_SPEC_KEPT:
        projected["spec"] = copy.deepcopy(spec)
    else:
        projected[_TRIMMED] = True
    return projected


def is_trimmed(template: Mapping[str, Any]) -> bool:
    """True for a template projection without its spec (too big to keep): read the template by name."""
    return bool(template.get(_TRIMMED))


def podgroup(body: Mapping[str, Any]) -> Body:
    """Only what PodGroup claims need: the claim entries and their statuses."""
    spec = body.get("spec") or {}
    status = body.get("status") or {}
    meta = _with(_meta(body), "finalizers",
                 [f for f in (body.get("metadata") or {}).get("finalizers") or [] if f == PROTECTION_FINALIZER])
    return {"apiVersion": body.get("apiVersion"), "kind": "PodGroup", "metadata": meta,
            "spec": {"resourceClaims": copy.deepcopy(spec.get("resourceClaims") or [])},
            "status": {"resourceClaimStatuses": copy.deepcopy(status.get("resourceClaimStatuses") or [])}}


def resource_slice(body: Mapping[str, Any]) -> Body:
    spec = body.get("spec") or {}
    pool = spec.get("pool") or {}
    marks = _picked((body.get("metadata") or {}).get("annotations"), prefixes=SLICE_ANNOTATION_PREFIXES)
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": _with(_meta(body), "annotations", marks),
            "spec": {"driver": spec.get("driver"), "nodeName": spec.get("nodeName"),
                     "pool": {"name": pool.get("name"), "generation": pool.get("generation"),
                              "resourceSliceCount": pool.get("resourceSliceCount")},
                     **({"perDeviceNodeSelection": True} if spec.get("perDeviceNodeSelection") else {}),
                     # The counter sets: a device's fault domain and whether it is whole (health/domains.py).
                     **({"sharedCounters": copy.deepcopy(spec["sharedCounters"])} if spec.get("sharedCounters")
                        else {}),
                     "devices": [_slice_device(d) for d in spec.get("devices") or []]}}


SLICE_DEVICE_KEPT = ("name", "attributes", "capacity", "taints", "nodeName", "allowMultipleAllocations",
                     "consumesCounters")
"""Of a slice's device: the taints (a driver's health signal), the attributes and capacity (a HealthPolicy's
selector and DeviceClass route on them, an alert's UUID resolves through them), per-device nodeName, and the
counters it consumes (its fault domain, health/domains.py)."""


def _slice_device(device: Mapping[str, Any]) -> Body:
    return {k: copy.deepcopy(device[k]) for k in SLICE_DEVICE_KEPT if device.get(k) is not None}


def node(body: Mapping[str, Any]) -> Body:
    """Only the conditions' type, status, reason and time (a HealthPolicy's NodeCondition rules)."""
    conditions = [{k: c.get(k) for k in ("type", "status", "reason", "lastTransitionTime") if c.get(k) is not None}
                  for c in (body.get("status") or {}).get("conditions") or []]
    return {"apiVersion": "v1", "kind": "Node", "metadata": _meta(body), "status": {"conditions": conditions}}


def health_policy(body: Mapping[str, Any]) -> Body:
    """Spec, generation and the status fields claimwarden writes (signals/policy_status.py: written on change)."""
    status = body.get("status") or {}
    return {"apiVersion": body.get("apiVersion"), "kind": "HealthPolicy", "metadata": _meta(body, "generation"),
            "spec": copy.deepcopy(dict(body.get("spec") or {})),
            "status": {k: copy.deepcopy(status[k]) for k in ("observedGeneration", "rules", "enforced", "conditions")
                       if k in status}}


def device_class(body: Mapping[str, Any]) -> Body:
    """Only the CEL selectors (a HealthPolicy's deviceClassName routes by them)."""
    selectors = [{"cel": {"expression": (s.get("cel") or {}).get("expression")}}
                 for s in (body.get("spec") or {}).get("selectors") or [] if (s.get("cel") or {}).get("expression")]
    return {"apiVersion": body.get("apiVersion"), "kind": "DeviceClass", "metadata": _meta(body),
            "spec": {"selectors": selectors}}


def record(body: Mapping[str, Any]) -> Body:
    meta = body.get("metadata") or {}
    # ownerReferences: a record derived for a sibling names its origin there (health/siblings.py).
    kept = _meta(body, "generation", "ownerReferences")
    for field in ("labels", "annotations"):
        _with(kept, field, _picked(meta.get(field), prefixes=(RECORD_KEY_PREFIX,)))
    return {"apiVersion": body.get("apiVersion"), "kind": body.get("kind"),
            "metadata": kept,
            "spec": copy.deepcopy(dict(body.get("spec") or {})),
            "status": copy.deepcopy(dict(body.get("status") or {}))}
