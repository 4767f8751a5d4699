"""Read access to the operator's in-memory indices (Kopf indices of projections)."""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Iterator, Mapping
from typing import Any, Protocol

Body = dict[str, Any]
Key = tuple[str, str]


class IndexLike(Protocol):
    """The read-only part of ``kopf.Index``: key -> collection of values."""

    def __getitem__(self, key: Hashable) -> Iterable[Any]: ...
    def __contains__(self, key: object) -> bool: ...
    def __iter__(self) -> Iterator[Hashable]: ...


def _one(index: IndexLike, key: Hashable) -> Any:
    if key not in index:
        return None
    for value in index[key]:
        return value
    return None


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
        self._templates = indices["templates_by_name"]
        # Only indexed when the health controller runs. (Not `or {}`: an index that is still empty
        # is falsy, and the live index must be kept.)
        self._slices: IndexLike = indices.get("slices_by_name", {})
        self._records: IndexLike = indices.get("records_by_name", {})

    def pod(self, namespace: str, name: str) -> Body | None:
        pod: Body | None = _one(self._pods, (namespace, name))
        return pod

    def claim(self, namespace: str, name: str) -> Body | None:
        claim: Body | None = _one(self._claims, (namespace, name))
        return claim

    def template(self, namespace: str, name: str) -> Body | None:
        template: Body | None = _one(self._templates, (namespace, name))
        return template

    def claims_owned_by(self, pod_uid: str) -> list[Body]:
        claims = [self.claim(ns, name) for ns, name in _all(self._claims_by_owner, pod_uid)]
        return [c for c in claims if c is not None]

    def pods_using_claim(self, namespace: str, claim_name: str) -> list[str]:
        return sorted(set(_all(self._pods_by_claim, (namespace, claim_name))))

    def pods_using_template(self, namespace: str, template_name: str) -> list[str]:
        return sorted(set(_all(self._pods_by_template, (namespace, template_name))))

    def claim_keys(self) -> list[Key]:
        return [key for key in self._claims if isinstance(key, tuple)]

    def pod_keys(self) -> list[Key]:
        return [key for key in self._pods if isinstance(key, tuple)]

    def pods(self) -> PodsView:
        """The pods as a read-only mapping (namespace, name) -> pod, looked up on demand."""
        return PodsView(self)

    def resource_slice(self, name: str) -> Body | None:
        found: Body | None = _one(self._slices, name)
        return found

    def resource_slices(self) -> list[Body]:
        return _values(self._slices)

    def record(self, name: str) -> Body | None:
        found: Body | None = _one(self._records, name)
        return found

    def records(self) -> list[Body]:
        return _values(self._records)

    def claims(self) -> Iterator[Body]:
        for key in self.claim_keys():
            claim = self.claim(*key)
            if claim is not None:
                yield claim


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
