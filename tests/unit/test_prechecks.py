"""Pre-checks before queueing (claims: `pod_needs_work`, reservations: `pod_may_release`), and the
triggers app.py's event handlers keep with them.

The pre-checks must be supersets of what the plans act on: each test below pins one trigger, and
two exhaustive tests walk every combination of a small world of pods and claims.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Iterator
from typing import Any

import kopf
import pytest

from claimwarden import app
from claimwarden.cache import Cache, index_views
from claimwarden.claims import plan as claims_plan
from claimwarden.claims.controller import ClaimsController
from claimwarden.claims.podgroups import GroupView
from claimwarden.objects.claims import DELETE_PROTECTION_FINALIZER, POD_CLAIM_NAME_ANNOTATION
from claimwarden.reservations import plan as reservations_plan
from claimwarden.reservations.controller import ReservationsController
from claimwarden.runtime.operator import Runtime

NS = "ns"
UID = "pod-uid"
PG_UID = "pg-uid"
ALLOCATION = {"devices": {"results": [{"request": "gpu", "driver": "d", "pool": "n1", "device": "gpu-0"}]}}
TEMPLATE_ENTRY = {"name": "gpu", "resourceClaimTemplateName": "t"}
SHARED_ENTRY = {"name": "shared", "resourceClaimName": "s"}
POD_RESERVATION = {"resource": "pods", "name": "p", "uid": UID}
GROUP_RESERVATION = {"apiGroup": "scheduling.k8s.io", "resource": "podgroups", "name": "team", "uid": PG_UID}


def pod(*, recorded: str | None = None, node: str | None = None, phase: str = "Pending", deleting: bool = False,
        entries: list[dict[str, Any]] | None = None, group: str | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"apiVersion": "v1", "kind": "Pod",
                            "metadata": {"name": "p", "namespace": NS, "uid": UID, "resourceVersion": "1",
                                         "creationTimestamp": "2026-01-01T00:00:00Z"},
                            "spec": {"resourceClaims": entries if entries is not None else [TEMPLATE_ENTRY]},
                            "status": {"phase": phase}}
    if recorded is not None:
        body["status"]["resourceClaimStatuses"] = [{"name": "gpu", "resourceClaimName": recorded}]
    if node:
        body["spec"]["nodeName"] = node
    if deleting:
        body["metadata"]["deletionTimestamp"] = "2026-01-01T00:01:00Z"
    if group:
        body["spec"]["schedulingGroup"] = {"podGroupName": group}
    return body


def claim(name: str = "c1", *, owner: str | None = "pod", allocated: bool = False,
          reserved: list[dict[str, Any]] | None = None, deleting: bool = False, pod_claim: str = "gpu",
          created: str = "2026-01-01T00:00:00Z") -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": NS, "uid": f"uid-{name}", "resourceVersion": "7",
                            "creationTimestamp": created}
    if owner == "pod":
        meta["ownerReferences"] = [{"apiVersion": "v1", "kind": "Pod", "name": "p", "uid": UID, "controller": True}]
    elif owner == "other-pod":
        meta["ownerReferences"] = [{"apiVersion": "v1", "kind": "Pod", "name": "p", "uid": "old", "controller": True}]
    elif owner == "group":
        meta["ownerReferences"] = [{"apiVersion": "scheduling.k8s.io/v1beta1", "kind": "PodGroup", "name": "team",
                                    "uid": PG_UID, "controller": True}]
    if owner is not None:
        meta["annotations"] = {POD_CLAIM_NAME_ANNOTATION: pod_claim}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:01:00Z"
    body: dict[str, Any] = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": meta,
                            "status": {}}
    if allocated:
        body["status"]["allocation"] = ALLOCATION
        meta["finalizers"] = [DELETE_PROTECTION_FINALIZER]
    if reserved:
        body["status"]["reservedFor"] = reserved
    return body


def podgroup(entries: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {"apiVersion": "scheduling.k8s.io/v1beta1", "kind": "PodGroup",
            "metadata": {"name": "team", "namespace": NS, "uid": PG_UID},
            "spec": {"resourceClaims": entries if entries is not None else [TEMPLATE_ENTRY]}}


def needs_work(subject: dict[str, Any], *claims: dict[str, Any], group: GroupView | None = None) -> bool:
    owned = [c for c in claims if (c["metadata"].get("ownerReferences") or [{}])[0].get("uid") == UID]
    return claims_plan.pod_needs_work(subject, {c["metadata"]["name"]: c for c in claims}, owned, group)


# --- claims: pod_needs_work, one trigger each ------------------------------------------------------

def test_a_template_claim_not_recorded_yet_needs_work() -> None:
    assert needs_work(pod())


def test_a_recorded_claim_that_is_cached_and_the_pods_own_needs_nothing() -> None:
    assert not needs_work(pod(recorded="c1"), claim())


def test_a_recorded_claim_missing_from_the_cache_needs_work() -> None:
    """Deleted while the pod needs it (re-created), or not watched yet and not created here."""
    assert needs_work(pod(recorded="c1"))


def test_a_recorded_claim_just_created_here_counts_as_known() -> None:
    """`claims` holds the claims created but not cached yet (the controller's `_recent`)."""
    assert not needs_work(pod(recorded="c1"), claim())


def test_a_recorded_claim_that_is_not_the_pods_own_needs_work() -> None:
    assert needs_work(pod(recorded="c1"), claim(owner="other-pod"))
    assert needs_work(pod(recorded="c1"), claim(owner=None))


def test_a_pod_claim_deliberately_without_a_claim_needs_nothing() -> None:
    assert not needs_work(pod(recorded=""))


def test_another_claim_reserved_for_the_pod_wins_over_the_status() -> None:
    assert needs_work(pod(recorded="c1"), claim(), claim("c2", allocated=True, reserved=[POD_RESERVATION]))


def test_a_duplicate_claim_needs_work_even_for_a_pod_that_is_done() -> None:
    for subject in (pod(recorded="c1"), pod(recorded="c1", phase="Succeeded"), pod(recorded="c1", deleting=True)):
        assert needs_work(subject, claim(), claim("c2"))


def test_a_scheduled_pod_with_an_allocated_unreserved_claim_needs_work() -> None:
    assert needs_work(pod(recorded="c1", node="n1"), claim(allocated=True))
    shared = pod(recorded="c1", node="n1", entries=[TEMPLATE_ENTRY, SHARED_ENTRY])
    assert needs_work(shared, claim(allocated=True, reserved=[POD_RESERVATION]), claim("s", owner=None, allocated=True))


def test_reserved_unallocated_unscheduled_or_deleting_claims_need_nothing() -> None:
    assert not needs_work(pod(recorded="c1", node="n1"), claim(allocated=True, reserved=[POD_RESERVATION]))
    assert not needs_work(pod(recorded="c1", node="n1"), claim())
    assert not needs_work(pod(recorded="c1"), claim(allocated=True))
    assert not needs_work(pod(recorded="c1", node="n1"), claim(allocated=True, deleting=True))


def test_a_pod_that_is_done_or_going_needs_nothing_but_duplicates() -> None:
    assert not needs_work(pod(phase="Failed"))
    assert not needs_work(pod(deleting=True))
    assert not needs_work(pod(recorded="c1", node="n1", deleting=True), claim(allocated=True))


def test_a_pod_without_claims_in_its_spec_needs_nothing() -> None:
    """An extended-resource claim alone is never the claims controller's (the scheduler makes it)."""
    assert not needs_work(pod(entries=[]))


def test_a_member_waiting_for_its_podgroup_needs_work() -> None:
    assert needs_work(pod(recorded="c1", group="team"), claim(), group=GroupView("team", None))


def test_a_member_that_recorded_the_groups_claim_needs_nothing() -> None:
    member = pod(recorded="g1", group="team")
    assert not needs_work(member, claim("g1", owner="group"), group=GroupView("team", podgroup()))
    assert needs_work(member, group=GroupView("team", podgroup()))  # not cached


def test_a_member_whose_status_names_its_own_claim_for_a_group_entry_needs_work() -> None:
    """The group's claim replaces it (recorded by the plan once the group has one)."""
    assert needs_work(pod(recorded="c1", group="team"), claim(), group=GroupView("team", podgroup()))


def test_a_member_claim_that_does_not_bind_to_the_group_is_checked_as_the_pods_own() -> None:
    group = GroupView("team", podgroup(entries=[{"name": "other", "resourceClaimTemplateName": "t"}]))
    assert not needs_work(pod(recorded="c1", group="team"), claim(), group=group)


def test_a_claim_reserved_for_the_podgroup_counts_as_reserved_for_its_member() -> None:
    member = pod(recorded="g1", group="team", node="n1")
    group = GroupView("team", podgroup())
    assert not needs_work(member, claim("g1", owner="group", allocated=True, reserved=[GROUP_RESERVATION]),
                          group=group)
    assert needs_work(member, claim("g1", owner="group", allocated=True), group=group)


# --- claims: the superset, exhaustively --------------------------------------------------------------

def _worlds() -> Iterator[tuple[dict[str, Any], dict[str, dict[str, Any]], list[dict[str, Any]], GroupView | None,
                                GroupView | None]]:
    """(pod, claims as the controller gathers them, owned claims, the plan's group view, the pre-check's)."""
    pods = [dict(node=None), dict(node="n1"), dict(phase="Succeeded"), dict(deleting=True),
            dict(deleting=True, node="n1")]
    recorded = [None, "c1", ""]
    groups = [None, "binds", "apart", "missing"]
    owners = [None, "pod", "other-pod", "group"]
    reservations: list[list[dict[str, Any]]] = [[], [POD_RESERVATION], [GROUP_RESERVATION]]
    seconds = [None, "spare", "in-use"]
    shared = [None, "free", "allocated", "reserved"]
    group_claims = [False, True]
    for (state, rec, grp, c1_owner, c1_alloc, c1_res, c1_del, second, sh, gc) in itertools.product(
            pods, recorded, groups, owners, [False, True], reservations, [False, True], seconds, shared, group_claims):
        if (c1_owner is None and (c1_alloc or c1_res or c1_del)) or (gc and grp in (None, "missing")):
            continue
        subject = pod(recorded=rec, entries=[TEMPLATE_ENTRY, SHARED_ENTRY], group="team" if grp else None, **state)
        world: list[dict[str, Any]] = []
        if c1_owner is not None:
            world.append(claim(owner=c1_owner, allocated=c1_alloc, reserved=c1_res, deleting=c1_del))
        if second == "spare":
            world.append(claim("c2", created="2026-01-01T00:00:05Z"))
        elif second == "in-use":
            world.append(claim("c2", allocated=True, reserved=[POD_RESERVATION]))
        if sh is not None:
            world.append(claim("s", owner=None, allocated=sh != "free",
                               reserved=[POD_RESERVATION] if sh == "reserved" else None))
        group_owned = [claim("g2", owner="group")] if gc else []
        owned = [c for c in world if (c["metadata"].get("ownerReferences") or [{}])[0].get("uid") == UID]
        named = {c["metadata"]["name"]: c for c in world if c["metadata"]["name"] in ("c1", "s")}
        claims = {**named, **{c["metadata"]["name"]: c for c in owned}}
        if grp is None:
            yield subject, claims, owned, None, None
            continue
        found = None if grp == "missing" else podgroup(
            entries=[TEMPLATE_ENTRY] if grp == "binds" else [{"name": "other", "resourceClaimTemplateName": "t"}])
        yield subject, claims, owned, GroupView("team", found, tuple(group_owned)), GroupView("team", found)


def test_whenever_the_plan_or_the_duplicate_clean_up_acts_the_pre_check_says_yes() -> None:
    checked = acting = 0
    for subject, claims, owned, group, seen in _worlds():
        planned = claims_plan.plan_pod(subject, claims, owned, {"t": {"spec": {"spec": {}}}}, group=group)
        acts = not planned.idle or bool(claims_plan.duplicate_claims(subject, owned))
        checked += 1
        acting += acts
        if acts:
            assert claims_plan.pod_needs_work(subject, claims, owned, seen), (subject, claims, group, planned)
    assert checked > 10_000 and 0 < acting < checked


# --- reservations: pod_may_release -------------------------------------------------------------------

@pytest.mark.parametrize(("subject", "deleted", "may"), [
    (pod(), True, True),
    (pod(phase="Succeeded"), False, True),
    (pod(phase="Failed", node="n1"), False, True),
    (pod(deleting=True), False, True),  # deleted before it was scheduled: done
    (pod(deleting=True, node="n1"), False, True),  # terminating on its node: not done yet, said yes anyway
    (pod(), False, False),
    (pod(node="n1", phase="Running", recorded="c1"), False, False),
])
def test_a_pods_claims_are_queued_only_when_the_pod_may_let_them_go(subject: dict[str, Any], deleted: bool,
                                                                     may: bool) -> None:
    assert reservations_plan.pod_may_release(subject, deleted=deleted) is may


def test_a_pod_event_the_pre_check_skips_never_makes_the_claim_plan_destructive() -> None:
    """Whatever the claim, a pod that is alive and not going (the only pods the check skips) is kept,
    and so is its own claim."""
    for phase, node in itertools.product(["Pending", "Running", "Unknown", None], [None, "n1"]):
        subject = pod(phase=phase or "", node=node, recorded="c1")
        assert not reservations_plan.pod_may_release(subject, deleted=False)
        view = reservations_plan.pod_view(subject)
        for allocated, reserved, deleting in itertools.product([False, True], [[], [POD_RESERVATION]],
                                                               [False, True]):
            decided = reservations_plan.plan_claim(claim(allocated=allocated, reserved=reserved, deleting=deleting),
                                                   {"p": view}, view)
            assert not (decided.drop or decided.delete_claim or (decided.deallocate and reserved)), decided


# --- the event handlers: what each event queues -------------------------------------------------------

class Indices:
    """Kopf's index for pods and claims as app.py's index functions fill it."""

    def __init__(self) -> None:
        self.pods: dict[Any, list[Any]] = {}
        self.claims: dict[Any, list[Any]] = {}

    def put(self, index: dict[Any, list[Any]], key: str, result: dict[Any, Any] | None) -> None:
        for values in index.values():
            values[:] = [v for v in values if not (isinstance(v, tuple) and v[0] == key) and v != key
                         and not (isinstance(v, dict) and v["metadata"]["name"] == key)]
        for k in [k for k, v in index.items() if not v]:
            del index[k]
        for k, value in (result or {}).items():
            index.setdefault(k, []).append(value)

    def pod(self, body: dict[str, Any]) -> None:
        self.put(self.pods, body["metadata"]["name"],
                 asyncio.run(app.pods(namespace=NS, name=body["metadata"]["name"], body=kopf.Body(body))))

    def claim(self, body: dict[str, Any]) -> None:
        self.put(self.claims, body["metadata"]["name"],
                 asyncio.run(app.claims(namespace=NS, name=body["metadata"]["name"], body=kopf.Body(body),
                                        labels={})))


@pytest.fixture
def world() -> tuple[Indices, Runtime]:
    indices = Indices()
    cache = Cache(index_views({"pods": indices.pods, "claims": indices.claims, "templates_by_name": {}}))
    runtime = Runtime(cache=cache, kube=None, workers_per_queue=1, resync_seconds=300)  # type: ignore[arg-type]
    runtime.claims = ClaimsController(cache, None)  # type: ignore[arg-type]
    runtime.reservations = ReservationsController(cache, None)  # type: ignore[arg-type]
    runtime.leading = True
    return indices, runtime


def queued(runtime: Runtime) -> tuple[list[Any], list[Any]]:
    """The keys in the claims and the reservations queues, emptied."""
    found: tuple[list[Any], list[Any]] = ([], [])
    for queue, keys in ((runtime.claims.queue, found[0]), (runtime.reservations.queue, found[1])):  # type: ignore[union-attr]
        while len(queue):
            key = queue._queue.get_nowait()
            queue._dirty.discard(key)
            keys.append(key)
    return found


def pod_event(runtime: Runtime, indices: Indices, body: dict[str, Any], type: str = "MODIFIED") -> None:
    if type == "DELETED":
        indices.put(indices.pods, body["metadata"]["name"], None)  # Kopf discards before the handler runs
    else:
        indices.pod(body)
    asyncio.run(app.pod_event(type=type, namespace=NS, name=body["metadata"]["name"], body=kopf.Body(body),
                              memo=kopf.Memo(runtime=runtime)))


def claim_event(runtime: Runtime, indices: Indices, body: dict[str, Any], type: str = "MODIFIED") -> None:
    if type == "DELETED":
        indices.put(indices.claims, body["metadata"]["name"], None)
    else:
        indices.claim(body)
    asyncio.run(app.claim_event(type=type, namespace=NS, name=body["metadata"]["name"], body=kopf.Body(body),
                                memo=kopf.Memo(runtime=runtime)))


def test_a_new_pod_is_queued_for_its_claim_and_its_echo_is_not(world: tuple[Indices, Runtime]) -> None:
    indices, runtime = world
    pod_event(runtime, indices, pod(), "ADDED")
    assert queued(runtime) == ([(NS, "p")], [])
    claim_event(runtime, indices, claim(), "ADDED")
    assert queued(runtime) == ([(NS, "p")], [(NS, "c1")])  # the status does not name it yet
    pod_event(runtime, indices, pod(recorded="c1"))
    assert queued(runtime) == ([], [])
    pod_event(runtime, indices, {**pod(recorded="c1"), "status": {
        "phase": "Pending", "resourceClaimStatuses": [{"name": "gpu", "resourceClaimName": "c1"}],
        "conditions": [{"type": "PodScheduled", "status": "False"}]}})
    assert queued(runtime) == ([], [])
    claim_event(runtime, indices, claim(allocated=True, reserved=[POD_RESERVATION]))
    assert queued(runtime) == ([], [(NS, "c1")])  # claim events always queue the claim


def test_a_pod_bound_without_the_scheduler_is_queued_to_reserve_its_claim(world: tuple[Indices, Runtime]) -> None:
    indices, runtime = world
    claim_event(runtime, indices, claim(allocated=True), "ADDED")
    queued(runtime)
    pod_event(runtime, indices, pod(recorded="c1", node="n1"))
    assert queued(runtime) == ([(NS, "p")], [])


def test_a_claim_deleted_while_its_pod_needs_it_queues_the_pod(world: tuple[Indices, Runtime]) -> None:
    indices, runtime = world
    pod_event(runtime, indices, pod(recorded="c1"), "ADDED")
    claim_event(runtime, indices, claim(), "ADDED")
    queued(runtime)
    claim_event(runtime, indices, claim(), "DELETED")
    assert queued(runtime) == ([(NS, "p")], [(NS, "c1")])


@pytest.mark.parametrize("going", [dict(phase="Succeeded"), dict(phase="Failed"), dict(deleting=True),
                                   dict(deleting=True, node="n1")])
def test_a_pod_that_is_done_or_going_queues_its_claims(world: tuple[Indices, Runtime], going: dict[str, Any]) -> None:
    indices, runtime = world
    claim_event(runtime, indices, claim(allocated=True, reserved=[POD_RESERVATION]), "ADDED")
    pod_event(runtime, indices, pod(recorded="c1", node="n1", phase="Running"), "ADDED")
    assert queued(runtime) == ([], [(NS, "c1")])
    pod_event(runtime, indices, pod(**{"recorded": "c1", "node": "n1", **going}))
    assert queued(runtime) == ([], [(NS, "c1")])


def test_a_deleted_pod_is_forgotten_and_its_claims_queued(world: tuple[Indices, Runtime]) -> None:
    indices, runtime = world
    claim_event(runtime, indices, claim(), "ADDED")
    pod_event(runtime, indices, pod(), "ADDED")
    queued(runtime)
    runtime.claims._recent[UID] = {"c9": (0.0, claim("c9"))}  # type: ignore[union-attr]
    pod_event(runtime, indices, pod(), "DELETED")
    assert queued(runtime) == ([], [(NS, "c1")])  # found by its owner reference, not named in the status
    assert UID not in runtime.claims._recent  # type: ignore[union-attr]


def test_an_extended_resource_claim_is_queued_when_its_pod_finishes(world: tuple[Indices, Runtime]) -> None:
    indices, runtime = world
    running = {**pod(entries=[], node="n1", phase="Running"),
               "status": {"phase": "Running", "extendedResourceClaimStatus": {"resourceClaimName": "x"}}}
    pod_event(runtime, indices, running, "ADDED")
    assert queued(runtime) == ([], [])
    pod_event(runtime, indices, {**running, "status": {**running["status"], "phase": "Succeeded"}})
    assert queued(runtime) == ([], [(NS, "x")])
