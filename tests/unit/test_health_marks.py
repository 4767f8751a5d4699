"""The slice queue's shell around slice_marks.plan_slice: what it writes for a re-created slice, and which slices
it looks at again when one is gone. A fake API records the calls; the cache is the real `Cache`."""

from __future__ import annotations

import asyncio
from typing import Any

from claimwarden import app
from claimwarden.cache import Cache, index_views
from claimwarden.health.marks import Marks
from claimwarden.health.records import ANNOTATION_PREFIX, SLICE_LABEL, SOURCE_ANNOTATION, DeviceRef, record_name

DRIVER = "gpu.example.com"
REF = DeviceRef(DRIVER, "n0", "gpu-0")


class FakeKube:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str, Any]] = []
        self.refuse: Exception | None = None
        self.preconditions: dict[str, Any] = {}

    async def merge_patch_cluster_object(self, api: str, plural: str, name: str, body: Any, **_: Any) -> Any:
        self.calls.append(("patch", name, body))
        return {"metadata": {"name": name, "resourceVersion": "11"}}

    async def delete_cluster_object(self, api: str, plural: str, name: str, **preconditions: Any) -> None:
        self.calls.append(("delete", name, None))
        self.preconditions = preconditions
        if self.refuse is not None:
            raise self.refuse

    async def create_cluster_object(self, api: str, plural: str, body: Any) -> Any:
        self.calls.append(("create", body["metadata"]["name"], body))
        return body


def _slice(name: str, pool: str = "n0", annotations: dict[str, str] | None = None) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": name, "uid": f"{name}-uid", "annotations": annotations or {}},
            "spec": {"driver": DRIVER, "nodeName": pool, "pool": {"name": pool, "generation": 1},
                     "devices": [{"name": "gpu-0"}, {"name": "gpu-1"}]}}


def _record(slice_label: str) -> dict[str, Any]:
    return {"apiVersion": "claimwarden.io/v1alpha1", "kind": "UnhealthyDevice",
            "metadata": {"name": record_name(REF), "uid": "r-uid", "resourceVersion": "10",
                         "labels": {SLICE_LABEL: slice_label}},
            "spec": {"driver": DRIVER, "pool": "n0", "device": "gpu-0", "reason": "XID 79",
                     "source": SOURCE_ANNOTATION, "drain": "Immediate"}}


def _marks(slices: list[dict[str, Any]], records: list[dict[str, Any]],
           slice_index: dict[Any, list[Any]] | None = None) -> tuple[Marks, FakeKube]:
    """`slice_index`, when given, is filled with the slices and read by the cache: a test may change it."""
    def indexed(results: list[dict[Any, Any]]) -> dict[Any, list[Any]]:
        index: dict[Any, list[Any]] = {}
        for result in results:
            for key, value in result.items():
                index.setdefault(key, []).append(value)
        return index

    slice_index = slice_index if slice_index is not None else {}
    slice_index.update(indexed([asyncio.run(app.slices_by_name(name=s["metadata"]["name"], body=s)) for s in slices]))
    record_index = indexed([asyncio.run(app.device_records(name=r["metadata"]["name"], body=r)) for r in records])
    cache = Cache(index_views({"pods": {}, "claims": {}, "templates_by_name": {}, "slices_by_name": slice_index,
                               "device_records": record_index}))
    kube = FakeKube()

    async def post_event(*_: Any) -> None:
        return None

    return Marks(cache=cache, kube=kube, post_event=post_event), kube  # type: ignore[arg-type]


def test_a_mark_on_the_recreated_slice_relabels_the_record_once_and_its_removal_deletes_it() -> None:
    marked = _slice("n0-new", annotations={ANNOTATION_PREFIX + "gpu-0": "XID 79"})
    marks, kube = _marks([marked], [_record("n0-old")])
    asyncio.run(marks.reconcile("n0-new"))
    assert kube.calls == [("patch", record_name(REF), {"metadata": {"labels": {SLICE_LABEL: "n0-new"}}})]

    marks, kube = _marks([_slice("n0-new")], [_record("n0-new")])
    asyncio.run(marks.reconcile("n0-new"))
    assert kube.calls == [("delete", record_name(REF), None)]


def test_a_gone_slice_queues_the_other_slices_of_its_records_pools() -> None:
    """So that a slice still carrying the mark takes the record over before its mark is removed there."""
    slices = [_slice("n0-new", annotations={ANNOTATION_PREFIX + "gpu-0": "XID 79"}), _slice("n1-a", pool="n1")]
    marks, kube = _marks(slices, [_record("n0-old")])

    async def gone() -> list[Any]:
        await marks.reconcile("n0-old")
        return [await marks.queue.get() for _ in range(len(marks.queue))]

    assert asyncio.run(gone()) == ["n0-new"]
    assert kube.calls == []


def test_a_mark_removed_before_the_cache_has_the_new_label_still_clears_the_record() -> None:
    """The annotation's removal may be reconciled before the watch brings the relabelled record back."""
    slices: dict[Any, list[Any]] = {}
    marks, kube = _marks([_slice("n0-new", annotations={ANNOTATION_PREFIX + "gpu-0": "XID 79"})],
                         [_record("n0-old")], slices)
    asyncio.run(marks.reconcile("n0-new"))
    assert [call[0] for call in kube.calls] == ["patch"]
    unmarked = asyncio.run(app.slices_by_name(name="n0-new", body=_slice("n0-new")))
    slices.update({key: [value] for key, value in unmarked.items()})
    asyncio.run(marks.reconcile("n0-new"))  # the cache still has the record at resourceVersion 10, labelled n0-old
    assert kube.calls[-1] == ("delete", record_name(REF), None)


def test_a_record_cleared_is_deleted_only_as_planned_and_planned_again_if_it_changed() -> None:
    """Another slice of the pool may take the record over meanwhile (50 slice workers at once)."""
    from claimwarden.kube.errors import ApiError

    marks, kube = _marks([_slice("n0-new")], [_record("n0-new")])
    kube.refuse = ApiError(409, "Conflict", "Precondition failed: ResourceVersion in precondition: 10")

    async def run() -> list[Any]:
        await marks.reconcile("n0-new")
        await asyncio.sleep(0.6)
        return [await marks.queue.get() for _ in range(len(marks.queue))]

    assert asyncio.run(run()) == ["n0-new"], "planned again"
    assert kube.preconditions == {"uid": "r-uid", "resource_version": "10"}
