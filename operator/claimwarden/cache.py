"""Read access to the operator's in-memory indices (Kopf indices of projections).

Kopf keys every indexed object by (namespace, name, uid) and removes it only on a DELETED event.
An object deleted while a watch was down (a restart, a 410 Gone re-list) therefore stays indexed
until `staleness.prune_stale` confirms it is gone and discards it. Until then a stale object can
share its name with the live one that replaced it: look-ups by name return the most recently
created object of that name, which is the only one that can still exist.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Iterator, Mapping
from typing import Any, Protocol

from .claims.podgroups import controlling_podgroup_uid
from .objects.claims import DeviceKey, allocated_devices, controlling_pod_uid

Body = dict[str, Any]
Key = tuple[str, str]


class IndexLike(Protocol):
    """The read-only part of ``kopf.Index``: key -> collection of values."""

    def __getitem__(self, key: Hashable) -> Iterable[Any]: ...
    def __contains__(self, key: object) -> bool: ...
    def __iter__(self) -> Iterator[Hashable]: ...


# Tags of the reverse look-ups in the one index per kind (app.py): ("claim", namespace, claim name) etc.
POD_BY_CLAIM = "claim"
POD_BY_TEMPLATE = "template"
POD_BY_PODGROUP = "podgroup"
CLAIM_BY_OWNER = "owner"
CLAIM_BY_DEVICE = "device"
CLAIM_BY_RECORD = "record"
CLAIM_BY_PODGROUP = "podgroup"
PODGROUP_BY_TEMPLATE = "template"
RECORD_BY_DEVICE = "device"
SLICE_BY_POOL = "pool"

# app.py's index of each kind, by its Kopf handler id.
POD_INDEX, CLAIM_INDEX, PODGROUP_INDEX, RECORD_INDEX = "pods", "claims", "pod_groups", "device_records"
SLICE_INDEX = "slices_by_name"
# The signals' indices (only with the health controller): plain name -> projection.
POLICY_INDEX, CLASS_INDEX, NODE_INDEX = "health_policies", "device_classes", "nodes_by_name"


class Primary:
    """The primary keys of a tagged index: (namespace, name) 2-tuples, or plain names for a cluster-scoped
    kind (`namespaced` False). Every other key is a tagged reverse look-up."""

    def __init__(self, index: IndexLike, *, namespaced: bool = True) -> None:
        self._index = index
        self._namespaced = namespaced

    def __getitem__(self, key: Hashable) -> Iterable[Any]:
        return self._index[key]

    def __contains__(self, key: object) -> bool:
        return key in self._index

    def __iter__(self) -> Iterator[Hashable]:
        if not self._namespaced:
            return (key for key in list(self._index) if not isinstance(key, tuple))
        return (key for key in list(self._index) if isinstance(key, tuple) and len(key) == 2)


class Tagged:
    """One reverse look-up of a tagged index: ``key`` here is ``(tag, *key)`` there."""

    def __init__(self, index: IndexLike, tag: str) -> None:
        self._index, self._tag = index, tag

    def __getitem__(self, key: Hashable) -> Iterable[Any]:
        return self._index[self._full(key)]

    def __contains__(self, key: object) -> bool:
        return isinstance(key, tuple) and self._full(key) in self._index

    def __iter__(self) -> Iterator[Hashable]:
        """Every key of the look-up: a walk over the whole index (only resyncs iterate)."""
        return (key[1:] for key in list(self._index)
                if isinstance(key, tuple) and len(key) > 2 and key[0] == self._tag)

    def _full(self, key: Hashable) -> tuple[Any, ...]:
        return (self._tag, *key) if isinstance(key, tuple) else (self._tag, key)


def index_views(indices: Mapping[str, IndexLike]) -> dict[str, IndexLike]:
    """The look-ups `Cache` reads, from app.py's one index per kind (pods, claims, and PodGroups and
    records where they are watched) and the others (templates, slices)."""
    folded = (POD_INDEX, CLAIM_INDEX, PODGROUP_INDEX, RECORD_INDEX)
    views = {name: index for name, index in indices.items() if name not in folded}
    pods, claims = indices[POD_INDEX], indices[CLAIM_INDEX]
    views.update(pods_by_name=Primary(pods), pods_by_claim=Tagged(pods, POD_BY_CLAIM),
                 pods_by_template=Tagged(pods, POD_BY_TEMPLATE), pods_by_podgroup=Tagged(pods, POD_BY_PODGROUP),
                 claims_by_name=Primary(claims),
                 claims_by_owner=Tagged(claims, CLAIM_BY_OWNER), claims_by_device=Tagged(claims, CLAIM_BY_DEVICE),
                 claims_by_record=Tagged(claims, CLAIM_BY_RECORD),
                 claims_by_podgroup=Tagged(claims, CLAIM_BY_PODGROUP))
    if PODGROUP_INDEX in indices:
        podgroups = indices[PODGROUP_INDEX]
        views.update(podgroups_by_name=Primary(podgroups),
                     podgroups_by_template=Tagged(podgroups, PODGROUP_BY_TEMPLATE))
    if SLICE_INDEX in indices:
        slices = indices[SLICE_INDEX]
        views.update(slices_by_name=Primary(slices, namespaced=False), slices_by_pool=Tagged(slices, SLICE_BY_POOL))
    if RECORD_INDEX in indices:
        records = indices[RECORD_INDEX]
        views.update(records_by_name=Primary(records, namespaced=False),
                     records_by_device=Tagged(records, RECORD_BY_DEVICE))
    return views


def resource_version(obj: Body) -> int:
    """The object's resourceVersion as a number (etcd's revision; 0 when it is not one)."""
    version = str((obj.get("metadata") or {}).get("resourceVersion") or "")
    return int(version) if version.isdigit() else 0


def _newest(values: Iterable[Body]) -> Body | None:
    """The most recently created of several objects sharing one name (see the module docstring)."""
    best: Body | None = None
    best_rank: tuple[str, int] = ("", -1)
    for value in values:
        meta = value.get("metadata") or {}
        version = str(meta.get("resourceVersion") or "")
        rank = (str(meta.get("creationTimestamp") or ""), int(version) if version.isdigit() else 0)
        if best is None or rank > best_rank:
            best, best_rank = value, rank
    return best


def _one(index: IndexLike, key: Hashable) -> Any:
    if key not in index:
        return None
    return _newest(index[key])


def _values(index: IndexLike) -> list[Any]:
    return [value for key in list(index) for value in index[key]]


def _all(index: IndexLike, key: Hashable) -> list[Any]:
    return list(index[key]) if key in index else []


class Cache:
    """Projections of pods (with claims), claims and templates, and the reverse look-ups."""

    def __init__(self, indices: Mapping[str, IndexLike]) -> None:
        self._pods = indices["pods_by_name"]
        self._pods_by_claim = indices["pods_by_claim"]
        self._pods_by_template = indices["pods_by_template"]
        self._claims = indices["claims_by_name"]
        self._claims_by_owner = indices["claims_by_owner"]
        self._claims_by_device = indices["claims_by_device"]
        self._claims_by_record = indices["claims_by_record"]
        self._templates = indices["templates_by_name"]
        # Only indexed when the health controller runs. (Not `or {}`: an index that is still empty
        # is falsy, and the live index must be kept.)
        self._slices: IndexLike = indices.get("slices_by_name", {})
        self._slices_by_pool: IndexLike = indices.get("slices_by_pool", {})
        self._records: IndexLike = indices.get("records_by_name", {})
        self._records_by_device: IndexLike = indices.get("records_by_device", {})
        self._policies: IndexLike = indices.get(POLICY_INDEX, {})
        self._classes: IndexLike = indices.get(CLASS_INDEX, {})
        self._nodes: IndexLike = indices.get(NODE_INDEX, {})
        # Only indexed where the cluster serves PodGroups.
        self._podgroups: IndexLike = indices.get("podgroups_by_name", {})
        self._podgroups_by_template: IndexLike = indices.get("podgroups_by_template", {})
        self._claims_by_podgroup: IndexLike = indices.get("claims_by_podgroup", {})
        self._pods_by_podgroup: IndexLike = indices.get("pods_by_podgroup", {})

    def pod(self, namespace: str, name: str) -> Body | None:
        pod: Body | None = _one(self._pods, (namespace, name))
        return pod

    def claim(self, namespace: str, name: str) -> Body | None:
        claim: Body | None = _one(self._claims, (namespace, name))
        return claim

    def template(self, namespace: str, name: str) -> Body | None:
        template: Body | None = _one(self._templates, (namespace, name))
        return template

    def podgroup(self, namespace: str, name: str) -> Body | None:
        found: Body | None = _one(self._podgroups, (namespace, name))
        return found

    def podgroup_keys(self) -> list[Key]:
        return [key for key in list(self._podgroups) if isinstance(key, tuple)]

    def podgroups_using_template(self, namespace: str, template_name: str) -> list[str]:
        return sorted(set(_all(self._podgroups_by_template, (namespace, template_name))))

    def pods_in_podgroup(self, namespace: str, podgroup_name: str) -> list[str]:
        """Pods (with claims) whose spec.schedulingGroup names the PodGroup."""
        return sorted(set(_all(self._pods_by_podgroup, (namespace, podgroup_name))))

    def claims_owned_by_podgroup(self, namespace: str, podgroup_uid: str) -> list[Body]:
        """Claims in `namespace` whose controller ownerReference names the PodGroup UID."""
        names = set(_all(self._claims_by_podgroup, (namespace, podgroup_uid)))
        claims = [self.claim(namespace, name) for name in sorted(names)]
        return [c for c in claims if c is not None and controlling_podgroup_uid(c) == podgroup_uid]

    def claims_owned_by(self, namespace: str, pod_uid: str) -> list[Body]:
        """Claims in `namespace` whose controller ownerReference names the pod UID.

        Keyed by namespace too: an ownerReference is only meaningful within its own namespace, and a
        claim elsewhere naming the UID is someone else's.
        """
        names = set(_all(self._claims_by_owner, (namespace, pod_uid)))
        claims = [self.claim(namespace, name) for name in sorted(names)]
        return [c for c in claims if c is not None and controlling_pod_uid(c) == pod_uid]

    def claims_holding(self, device: DeviceKey) -> list[Body]:
        """The claims whose allocation names the device (quarantine claims included)."""
        found = []
        for namespace, name in sorted(set(_all(self._claims_by_device, device))):
            claim = self.claim(namespace, name)
            if claim is not None and device in allocated_devices(claim):
                found.append(claim)
        return found

    def claims_labelled_for_record(self, namespace: str) -> dict[str, list[Body]]:
        """Record label value -> the claims in `namespace` carrying it (quarantine claims when `namespace`
        is claimwarden's own)."""
        found: dict[str, list[Body]] = {}
        for key in list(self._claims_by_record):
            if not isinstance(key, tuple) or key[0] != namespace:
                continue
            claims = [c for name in sorted(set(_all(self._claims_by_record, key)))
                      if (c := self.claim(namespace, name)) is not None]
            if claims:
                found[str(key[1])] = claims
        return found

    def claims_for_record(self, namespace: str, label: str) -> list[Body]:
        """The claims in `namespace` labelled for the record whose label value is `label`."""
        claims = [self.claim(namespace, name) for name in sorted(set(_all(self._claims_by_record, (namespace, label))))]
        return [c for c in claims if c is not None]

    def pods_using_claim(self, namespace: str, claim_name: str) -> list[str]:
        return sorted(set(_all(self._pods_by_claim, (namespace, claim_name))))

    def pods_using_template(self, namespace: str, template_name: str) -> list[str]:
        return sorted(set(_all(self._pods_by_template, (namespace, template_name))))

    def claim_keys(self) -> list[Key]:
        return [key for key in list(self._claims) if isinstance(key, tuple)]

    def pod_keys(self) -> list[Key]:
        return [key for key in list(self._pods) if isinstance(key, tuple)]

    def pods(self) -> PodsView:
        """The pods as a read-only mapping (namespace, name) -> pod, looked up on demand."""
        return PodsView(self)

    def resource_slice(self, name: str) -> Body | None:
        found: Body | None = _one(self._slices, name)
        return found

    def resource_slice_names(self) -> list[str]:
        return [str(name) for name in list(self._slices)]

    def resource_slices(self) -> list[Body]:
        return _values(self._slices)

    def resource_slices_of_pool(self, driver: str, pool: str) -> list[Body]:
        """The slices that publish the driver's pool (usually one; two while a driver re-creates it)."""
        found = []
        for name in sorted(set(_all(self._slices_by_pool, (driver, pool)))):
            slice_ = self.resource_slice(str(name))
            spec = (slice_ or {}).get("spec") or {}
            if slice_ is not None and (spec.get("driver"), (spec.get("pool") or {}).get("name")) == (driver, pool):
                found.append(slice_)
        return found

    def record(self, name: str) -> Body | None:
        found: Body | None = _one(self._records, name)
        return found

    def records_marking(self, device: DeviceKey) -> list[Body]:
        """The records that name the device (driver, pool, device), whatever their names."""
        found = []
        for name in sorted(set(_all(self._records_by_device, device))):
            record = self.record(str(name))
            spec = (record or {}).get("spec") or {}
            if record is not None and (spec.get("driver"), spec.get("pool"), spec.get("device")) == tuple(device):
                found.append(record)
        return found

    def record_count(self) -> int:
        return sum(1 for _ in self._records)

    def records(self) -> list[Body]:
        return [record for name in list(self._records) if (record := self.record(str(name))) is not None]

    def health_policies(self) -> list[Body]:
        return [found for name in sorted(str(n) for n in list(self._policies))
                if (found := _one(self._policies, name)) is not None]

    def device_class_selectors(self) -> dict[str, list[str]]:
        """DeviceClass name -> the CEL expressions of its selectors (a HealthPolicy's deviceClassName)."""
        found: dict[str, list[str]] = {}
        for name in list(self._classes):
            device_class = _one(self._classes, name)
            if device_class is not None:
                found[str(name)] = [str(((s.get("cel") or {}).get("expression")) or "")
                                    for s in (device_class.get("spec") or {}).get("selectors") or []]
        return found

    def node_names(self) -> list[str]:
        return sorted(str(name) for name in list(self._nodes))

    def node_conditions(self, name: str) -> list[Body]:
        node = _one(self._nodes, name)
        return list(((node or {}).get("status") or {}).get("conditions") or [])

    def claims(self) -> Iterator[Body]:
        for key in self.claim_keys():
            claim = self.claim(*key)
            if claim is not None:
                yield claim

    def indexed(self) -> dict[str, list[Body]]:
        """Every indexed object by kind (stale ones included), for `staleness.prune_stale`."""
        return {"pods": _values(self._pods), "resourceclaims": _values(self._claims),
                "resourceclaimtemplates": _values(self._templates), "resourceslices": _values(self._slices),
                "unhealthydevices": _values(self._records), "podgroups": _values(self._podgroups),
                "healthpolicies": _values(self._policies), "deviceclasses": _values(self._classes),
                "nodes": _values(self._nodes)}


class PodsView(Mapping[Key, Body]):
    """(namespace, name) -> pod without copying the index: plans look up only the pods they need."""

    def __init__(self, cache: Cache) -> None:
        self._cache = cache

    def __getitem__(self, key: Key) -> Body:
        pod = self._cache.pod(*key)
        if pod is None:
            raise KeyError(key)
        return pod

    def __iter__(self) -> Iterator[Key]:
        return iter(self._cache.pod_keys())

    def __len__(self) -> int:
        return len(self._cache.pod_keys())
