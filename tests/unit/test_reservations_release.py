"""Releasing like upstream: which reads the reservations controller makes, and what it writes.

A fake API records every call; the cache is the real `Cache` over plain dicts of projections.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from claimwarden.cache import Cache
from claimwarden.kube.errors import ApiError, NotServed
from claimwarden.objects import trimmed
from claimwarden.objects.claims import DELETE_PROTECTION_FINALIZER, POD_CLAIM_NAME_ANNOTATION
from claimwarden.reservations.controller import DeletedPods, ReservationsController
from claimwarden.runtime.workqueue import Requeue

NS = "ns"
ALLOCATION = {"devices": {"results": [{"request": "gpu", "driver": "d", "pool": "n1", "device": "gpu-0"}]}}
GROUP_ENTRY = {"apiGroup": "scheduling.k8s.io", "resource": "podgroups", "name": "team", "uid": "pg-uid"}


def pod(uid: str = "uid-1", *, phase: str = "Running", node: str | None = "n1", name: str = "p") -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": NS, "uid": uid, "resourceVersion": "3",
                         "creationTimestamp": f"2026-01-01T00:00:0{uid[-1]}Z"},
            "spec": {"nodeName": node, "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "t"}]},
            "status": {"phase": phase}}


def claim(*, reserved: list[dict[str, Any]], generated: bool = True, version: str = "10",
          owner_uid: str = "uid-1") -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "c", "namespace": NS, "uid": "c-uid", "resourceVersion": version,
                            "creationTimestamp": "2026-01-01T00:00:00Z",
                            "finalizers": [DELETE_PROTECTION_FINALIZER]}
    if generated:
        meta["annotations"] = {POD_CLAIM_NAME_ANNOTATION: "gpu"}
        meta["ownerReferences"] = [{"apiVersion": "v1", "kind": "Pod", "name": "p", "uid": owner_uid,
                                    "controller": True}]
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": meta,
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu"}}]}},
            "status": {"allocation": ALLOCATION, "reservedFor": reserved}}


def reservation(uid: str = "uid-1", name: str = "p") -> dict[str, Any]:
    return {"resource": "pods", "name": name, "uid": uid}


class FakeKube:
    """Answers reads from `objects`, records every call, and refuses the next writes listed in `refuse`."""

    def __init__(self, *, pods: dict[str, dict[str, Any] | None] | None = None,
                 claim: dict[str, Any] | None = None, podgroup: dict[str, Any] | None = None,
                 served: dict[str, dict[str, Any] | None] | None = None) -> None:
        self.pods = pods or {}
        self.claim = claim
        self.podgroup = podgroup
        # PodGroup version -> the PodGroup there; other versions are not served. None: every version is.
        self.served = served
        self.calls: list[tuple[str, Any]] = []
        self.refuse: list[ApiError] = []

    def reads(self) -> list[tuple[str, Any]]:
        return [call for call in self.calls if call[0].startswith("get")]

    def writes(self) -> list[tuple[str, Any]]:
        return [call for call in self.calls if not call[0].startswith("get")]

    def _write(self, call: str, detail: Any) -> None:
        self.calls.append((call, detail))
        if self.refuse:
            raise self.refuse.pop(0)

    async def get_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        self.calls.append(("get_pod", name))
        return self.pods.get(name)

    async def get_claim(self, namespace: str, name: str) -> dict[str, Any] | None:
        self.calls.append(("get_claim", name))
        return self.claim

    async def get_podgroup(self, version: str, namespace: str, name: str) -> dict[str, Any] | None:
        self.calls.append(("get_podgroup", name))
        if self.served is None:
            return self.podgroup
        if version not in self.served:
            raise NotServed("NotFound", "the server could not find the requested resource")
        return self.served[version]

    async def served_version(self, group: str, plural: str, versions: tuple[str, ...]) -> str | None:
        self.calls.append(("get_discovery", (group, plural)))
        return next((v for v in versions if v in (self.served or {})), None)

    async def patch_claim_status(self, namespace: str, name: str, ops: list[dict[str, Any]]) -> dict[str, Any]:
        self._write("patch_claim_status", ops)
        patched = claim(reserved=[])
        patched["metadata"]["resourceVersion"] = "11"
        return patched

    async def patch_claim(self, namespace: str, name: str, ops: list[dict[str, Any]]) -> dict[str, Any]:
        self._write("patch_claim", ops)
        patched = claim(reserved=[])
        patched["metadata"].update(resourceVersion="12", finalizers=[])
        return patched

    async def delete_claim(self, namespace: str, name: str, uid: str, resource_version: str | None = None) -> bool:
        self._write("delete_claim", (uid, resource_version))
        return True

    async def post_event(self, *args: Any, **kwargs: Any) -> None:
        self.calls.append(("post_event", args))


def controller(kube: FakeKube, *, cached_pods: list[dict[str, Any]] = (), cached_claim: dict[str, Any] | None = None,
               cached_podgroup: dict[str, Any] | None = None, quarantined: bool = False,
               podgroups: bool = False) -> ReservationsController:
    names = ("pods_by_claim", "pods_by_template", "claims_by_owner", "claims_by_device", "claims_by_record",
             "templates_by_name")
    indices: dict[str, Any] = {name: {} for name in names}
    indices["pods_by_name"] = {}
    for cached in cached_pods:
        indices["pods_by_name"].setdefault((NS, cached["metadata"]["name"]), []).append(trimmed.pod(cached))
    indices["claims_by_name"] = {(NS, "c"): [trimmed.claim(cached_claim)]} if cached_claim else {}
    if cached_podgroup is not None:
        indices["podgroups_by_name"] = {(NS, "team"): [trimmed.podgroup(cached_podgroup)]}
    return ReservationsController(Cache(indices), kube, lambda _claim: quarantined,  # type: ignore[arg-type]
                                  podgroup_version="v1beta1" if podgroups else None)


def reconcile(reservations: ReservationsController) -> None:
    asyncio.run(reservations.reconcile((NS, "c")))


def test_a_finished_pod_in_the_cache_is_released_without_a_single_read() -> None:
    kube = FakeKube()
    reservations = controller(kube, cached_pods=[pod(phase="Succeeded")], cached_claim=claim(reserved=[reservation()]))
    reconcile(reservations)
    assert kube.reads() == []
    (status, status_ops), (finalizer, _), (delete, precondition) = kube.writes()
    assert (status, finalizer, delete) == ("patch_claim_status", "patch_claim", "delete_claim")
    assert status_ops[0] == {"op": "test", "path": "/metadata/resourceVersion", "value": "10"}
    assert {"op": "remove", "path": "/status/allocation"} in status_ops
    assert precondition == ("c-uid", "12")  # pinned to the version the last write returned


def test_a_pod_seen_deleted_is_released_without_a_get() -> None:
    kube = FakeKube()
    reservations = controller(kube, cached_claim=claim(reserved=[reservation()]))
    reservations.note_deleted_pod("uid-1")
    reconcile(reservations)
    assert kube.reads() == []
    assert [call for call, _ in kube.writes()] == ["patch_claim_status", "patch_claim"]  # the GC deletes it


def test_a_pod_neither_cached_nor_known_deleted_is_confirmed_with_one_get() -> None:
    kube = FakeKube(pods={"p": pod()})
    reconcile(controller(kube, cached_claim=claim(reserved=[reservation()])))
    assert kube.reads() == [("get_pod", "p")] and kube.writes() == []  # it runs: kept

    kube = FakeKube(pods={"p": None})
    reconcile(controller(kube, cached_claim=claim(reserved=[reservation()])))
    assert kube.reads() == [("get_pod", "p")]
    assert [call for call, _ in kube.writes()] == ["patch_claim_status", "patch_claim"]


@pytest.mark.parametrize("phase", ["Pending", "Running", "Unknown"])
def test_a_cached_pod_that_is_not_done_is_never_dropped(phase: str) -> None:
    kube = FakeKube()
    reservations = controller(kube, cached_pods=[pod(phase=phase)], cached_claim=claim(reserved=[reservation()]))
    reservations.note_deleted_pod("another-uid")
    reconcile(reservations)
    assert kube.calls == []


def test_a_reservation_for_a_newer_pod_than_the_cache_holds_is_confirmed_not_dropped() -> None:
    """The cache may still hold the old pod of that name (its DELETED event not seen yet)."""
    kube = FakeKube(pods={"p": pod("uid-2")})
    reconcile(controller(kube, cached_pods=[pod("uid-1")], cached_claim=claim(reserved=[reservation("uid-2")],
                                                                                 owner_uid="uid-2")))
    assert kube.reads() == [("get_pod", "p")] and kube.writes() == []


def test_a_claim_whose_owner_the_cache_shows_replaced_is_deleted_only_after_a_get() -> None:
    kube = FakeKube(pods={"p": pod("uid-2")})
    reconcile(controller(kube, cached_pods=[pod("uid-2")], cached_claim=claim(reserved=[])))
    assert kube.reads() == [("get_pod", "p")]
    assert [call for call, _ in kube.writes()] == ["delete_claim"]


def test_a_stale_claim_is_read_once_and_planned_again() -> None:
    fresh = claim(reserved=[reservation("uid-2", "q")], version="20")  # the pod let go meanwhile, another joined
    kube = FakeKube(pods={"q": pod("uid-2", name="q")}, claim=fresh)
    kube.refuse = [ApiError(422, "Invalid", "the server rejected our request due to an error in our request")]
    reservations = controller(kube, cached_pods=[pod(phase="Failed")], cached_claim=claim(reserved=[reservation()]))
    reconcile(reservations)
    assert [call for call, _ in kube.calls] == ["patch_claim_status", "get_claim", "get_pod"]


def test_a_stale_claim_is_released_on_the_fresh_copy() -> None:
    kube = FakeKube(claim=claim(reserved=[reservation()], version="20"))
    kube.refuse = [ApiError(409, "Conflict", "the object has been modified")]
    reconcile(controller(kube, cached_pods=[pod(phase="Failed")], cached_claim=claim(reserved=[reservation()])))
    status_patches = [ops for call, ops in kube.calls if call == "patch_claim_status"]
    assert [ops[0]["value"] for ops in status_patches] == ["10", "20"]
    assert ("get_claim", "c") in kube.calls


def test_other_errors_are_not_taken_for_a_stale_claim() -> None:
    kube = FakeKube()
    kube.refuse = [ApiError(403, "Forbidden", "no")]
    with pytest.raises(ApiError):
        reconcile(controller(kube, cached_pods=[pod(phase="Failed")], cached_claim=claim(reserved=[reservation()])))
    assert kube.reads() == []


def test_a_quarantined_generated_claim_keeps_its_allocation() -> None:
    kube = FakeKube()
    reservations = controller(kube, cached_claim=claim(reserved=[reservation()]), quarantined=True)
    reservations.note_deleted_pod("uid-1")
    reconcile(reservations)
    # It goes with its allocation (the device stays held until it is gone) and its reservations: only its
    # finalizer is written.
    assert [call for call, _ in kube.calls] == ["patch_claim"]
    assert kube.reads() == []


def test_a_quarantined_podgroup_claim_is_deleted_with_its_allocation() -> None:
    """Rule 2 for any generated claim: a PodGroup's claim on a quarantined device, its PodGroup gone, is deleted
    with its allocation (a deallocation would wake pending pods while the device looks free)."""
    cached = claim(reserved=[GROUP_ENTRY], generated=False)
    cached["metadata"]["ownerReferences"] = [{"apiVersion": "scheduling.k8s.io/v1beta1", "kind": "PodGroup",
                                              "name": "team", "uid": "pg-uid", "controller": True}]
    replaced = {"metadata": {"name": "team", "namespace": NS, "uid": "another-pg"}, "spec": {}}
    kube = FakeKube(podgroup=None)
    reconcile(controller(kube, cached_claim=cached, cached_podgroup=replaced, podgroups=True, quarantined=True))
    assert [call for call, _ in kube.calls] == ["get_podgroup", "patch_claim", "delete_claim"]
    # Not quarantined: released as upstream does, deallocated (and left to the garbage collector).
    kube = FakeKube(podgroup=None)
    reconcile(controller(kube, cached_claim=cached, cached_podgroup=replaced, podgroups=True))
    assert [call for call, _ in kube.calls] == ["get_podgroup", "patch_claim_status", "patch_claim"]
    assert {"op": "remove", "path": "/status/allocation"} in kube.calls[1][1]


def test_a_claim_kept_on_a_quarantined_device_loses_its_reservations_only() -> None:
    """Rule 4 (1.37+ without DeviceTaintRule): the claim keeps its allocation and its finalizer until the mark
    is cleared, and is looked at again meanwhile."""
    kube = FakeKube()
    reservations = controller(kube, cached_claim=claim(reserved=[reservation()]), quarantined=True)
    reservations._kept = lambda _claim: True
    reservations.note_deleted_pod("uid-1")
    with pytest.raises(Requeue):
        reconcile(reservations)
    assert [call for call, _ in kube.calls] == ["patch_claim_status"]
    assert [op for op in kube.calls[0][1] if op["op"] != "test"] == [{"op": "remove", "path": "/status/reservedFor"}]
    # Being deleted by the garbage collector, reserved for nobody: nothing is written while the mark stays.
    deleting = claim(reserved=[])
    deleting["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:09Z"
    kube = FakeKube()
    reservations = controller(kube, cached_claim=deleting, quarantined=True)
    reservations._kept = lambda _claim: True
    with pytest.raises(Requeue):
        reconcile(reservations)
    assert kube.calls == []
    # The mark cleared: deallocated and unprotected, like any claim being deleted.
    reconcile(controller(kube, cached_claim=deleting))
    assert [call for call, _ in kube.calls] == ["patch_claim_status", "patch_claim"]
    # Its pod finished but still there, reserved for nobody: not deleted while the mark stays, then deleted.
    done = claim(reserved=[])
    kube = FakeKube()
    reservations = controller(kube, cached_claim=done, cached_pods=[pod(phase="Succeeded")], quarantined=True)
    reservations._kept = lambda _claim: True
    with pytest.raises(Requeue):
        reconcile(reservations)
    assert kube.calls == []
    reconcile(controller(kube, cached_claim=done, cached_pods=[pod(phase="Succeeded")]))
    assert [call for call, _ in kube.calls] == ["delete_claim"]


def test_a_podgroup_reservation_is_dropped_only_after_a_live_read() -> None:
    cached = claim(reserved=[GROUP_ENTRY], generated=False)
    other = {"metadata": {"name": "team", "namespace": NS, "uid": "another-pg"}, "spec": {}}
    same = {"metadata": {"name": "team", "namespace": NS, "uid": "pg-uid"}, "spec": {}}
    kube = FakeKube(podgroup=same)  # the cache lags: the live PodGroup is the reserved one
    reconcile(controller(kube, cached_claim=cached, cached_podgroup=other, podgroups=True))
    assert kube.calls == [("get_podgroup", "team")]

    kube = FakeKube(podgroup=None)
    reconcile(controller(kube, cached_claim=cached, cached_podgroup=other, podgroups=True))
    assert [call for call, _ in kube.calls] == ["get_podgroup", "patch_claim_status", "patch_claim"]


def test_a_podgroup_version_no_longer_served_releases_nothing_and_is_looked_up_again() -> None:
    """Started at v1beta1; the server now serves PodGroups at v1alpha3 only (an upgrade, a --runtime-config
    change). Its 404 for v1beta1 says nothing about the PodGroup: nothing is written, the claim is planned
    again at the version served now, and only a PodGroup gone at that version is released."""
    cached = claim(reserved=[GROUP_ENTRY], generated=False)
    live = {"metadata": {"name": "team", "namespace": NS, "uid": "pg-uid"}, "spec": {}}
    for podgroup_now, writes in ((live, []), (None, ["patch_claim_status", "patch_claim"])):
        kube = FakeKube(served={"v1alpha3": podgroup_now})
        reservations = controller(kube, cached_claim=cached, podgroups=True)  # its watch at v1beta1 is dead
        with pytest.raises(Requeue):
            reconcile(reservations)
        assert kube.writes() == []
        assert reservations.podgroup_version == "v1alpha3"
        reconcile(reservations)
        assert [call for call, _ in kube.writes()] == writes


def test_podgroups_served_at_no_version_any_more_keep_their_reservations() -> None:
    kube = FakeKube(served={})
    reservations = controller(kube, cached_claim=claim(reserved=[GROUP_ENTRY], generated=False), podgroups=True)
    with pytest.raises(Requeue):
        reconcile(reservations)
    assert reservations.podgroup_version is None
    reconcile(reservations)
    assert kube.writes() == []


def test_deleted_pods_are_remembered_up_to_the_limit_oldest_forgotten_first() -> None:
    deleted = DeletedPods(size=2)
    for uid in ("a", "b", "a", "c", ""):
        deleted.add(uid)
    assert "a" in deleted and "c" in deleted and "b" not in deleted and "" not in deleted
    assert len(deleted) == 2


def test_a_claim_released_a_moment_ago_waits_before_its_next_release() -> None:
    """Each write's echo queues the claim again at once: the next release of a shared claim waits out
    RELEASE_SPACING, so pods leaving one by one cost a write per second, not one per round trip."""
    from claimwarden.reservations import controller as module

    kube = FakeKube()
    shared = claim(reserved=[reservation("uid-1", "p"), reservation("uid-2", "q"), reservation("uid-3", "r")],
                   generated=False)
    reservations = controller(kube, cached_claim=shared,
                              cached_pods=[pod("uid-2", name="q"), pod("uid-3", name="r")])

    async def twice() -> float:
        reservations.note_deleted_pod("uid-1")
        await reservations.reconcile((NS, "c"))
        reservations.cache = controller(kube, cached_claim=shared, cached_pods=[pod("uid-3", name="r")]).cache
        reservations.note_deleted_pod("uid-2")
        with pytest.raises(Requeue) as again:
            await reservations.reconcile((NS, "c"))
        return again.value.delay

    delay = asyncio.run(twice())
    assert 0 < delay <= module.RELEASE_SPACING
    assert [call for call, _ in kube.writes()] == ["patch_claim_status"]


def test_a_foreign_finalizer_before_delete_protection_costs_one_read_not_a_wrong_removal() -> None:
    """The cached claim keeps only the finalizers claimwarden reads (trimmed.py), so the index of
    delete-protection in it is wrong when another finalizer comes first: the patch's test op fails, and
    the claim is read once and patched at the index of the live object."""
    full = claim(reserved=[], generated=False)
    full["metadata"]["finalizers"] = ["example.com/keep", DELETE_PROTECTION_FINALIZER]
    full["metadata"]["deletionTimestamp"] = "2026-01-01T00:01:00Z"
    del full["status"]["allocation"]  # unreserved and deallocated: only its finalizer is left to remove
    kube = FakeKube(claim=full)
    kube.refuse = [ApiError(422, "Invalid", "testing value /metadata/finalizers/0 failed")]
    reconcile(controller(kube, cached_claim=full))
    (first, first_ops), (read, _), (second, second_ops) = kube.calls
    assert (first, read, second) == ("patch_claim", "get_claim", "patch_claim")
    assert first_ops[1] == {"op": "test", "path": "/metadata/finalizers/0", "value": DELETE_PROTECTION_FINALIZER}
    assert second_ops[1:] == [{"op": "test", "path": "/metadata/finalizers/1", "value": DELETE_PROTECTION_FINALIZER},
                              {"op": "remove", "path": "/metadata/finalizers/1"}]
