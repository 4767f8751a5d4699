"""Look-ups that respect UIDs, and finding objects deleted while a watch was down."""

from __future__ import annotations

import asyncio
from typing import Any

from claimwarden.cache import Cache, index_views
from claimwarden.runtime.staleness import is_confirmed_gone, missing_from

from .claim_fixtures import pod_owner_reference


class FakeIndex(dict[Any, list[Any]]):
    """A plain dict in the shape of a Kopf index: key -> values."""


def obj(name: str, uid: str, *, namespace: str = "ns", created: str = "2026-01-01T00:00:00Z",
        version: str = "1", **extra: Any) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": namespace, "uid": uid, "creationTimestamp": created,
                         "resourceVersion": version, **extra}}


def cache(**indices: FakeIndex) -> Cache:
    names = ("pods_by_name", "pods_by_claim", "pods_by_template", "claims_by_name", "claims_by_owner",
             "claims_by_device", "claims_by_record", "templates_by_name", "records_by_name", "records_by_device")
    return Cache({name: indices.get(name, FakeIndex()) for name in names})


def test_a_stale_object_never_shadows_the_live_one_of_the_same_name() -> None:
    stale = obj("p", "old", created="2026-01-01T00:00:00Z", version="90")
    live = obj("p", "new", created="2026-01-01T00:05:00Z", version="40")
    for order in ([stale, live], [live, stale]):
        assert cache(pods_by_name=FakeIndex({("ns", "p"): order})).pod("ns", "p") == live


def test_same_second_creation_falls_back_to_the_newer_resource_version() -> None:
    old, new = obj("p", "old", version="100"), obj("p", "new", version="250")
    assert cache(pods_by_name=FakeIndex({("ns", "p"): [new, old]})).pod("ns", "p") == new


def _record(name: str, device: str) -> dict[str, Any]:
    return {**obj(name, f"{name}-uid", namespace=""), "spec": {"driver": "d", "pool": "p", "device": device}}


def test_records_of_a_device_are_found_by_the_index_whatever_their_names() -> None:
    annotated, admins, other = _record("p.gpu-0.abc", "gpu-0"), _record("my-mark", "gpu-0"), _record("x", "gpu-1")
    view = cache(records_by_name=FakeIndex({"p.gpu-0.abc": [annotated], "my-mark": [admins], "x": [other]}),
                 records_by_device=FakeIndex({("d", "p", "gpu-0"): ["p.gpu-0.abc", "my-mark"],
                                              ("d", "p", "gpu-1"): ["x"]}))
    assert view.records_marking(("d", "p", "gpu-0")) == [admins, annotated]
    assert view.records_marking(("d", "p", "gpu-1")) == [other]
    assert view.records_marking(("d", "p", "gpu-2")) == []


def test_a_record_whose_device_changed_is_not_found_under_its_old_device() -> None:
    """The two indices are updated one after the other: the record's own spec has the last word."""
    moved = _record("m", "gpu-1")
    view = cache(records_by_name=FakeIndex({"m": [moved]}),
                 records_by_device=FakeIndex({("d", "p", "gpu-0"): ["m"], ("d", "p", "gpu-1"): ["m"]}))
    assert view.records_marking(("d", "p", "gpu-0")) == []
    assert view.records_marking(("d", "p", "gpu-1")) == [moved]


def test_owned_claims_are_looked_up_within_the_pods_namespace() -> None:
    mine = obj("c", "c-uid", ownerReferences=[pod_owner_reference("pod-uid")])
    view = cache(claims_by_name=FakeIndex({("ns", "c"): [mine]}),
                 claims_by_owner=FakeIndex({("ns", "pod-uid"): ["c"]}))
    assert view.claims_owned_by("ns", "pod-uid") == [mine]
    assert view.claims_owned_by("elsewhere", "pod-uid") == []


def test_owned_claims_skip_a_same_named_claim_that_is_not_controlled_by_the_pod() -> None:
    other = obj("c", "c2-uid")
    view = cache(claims_by_name=FakeIndex({("ns", "c"): [other]}),
                 claims_by_owner=FakeIndex({("ns", "pod-uid"): ["c"]}))
    assert view.claims_owned_by("ns", "pod-uid") == []


def test_missing_from_the_live_list_are_only_candidates() -> None:
    a, b = obj("a", "a-uid"), obj("b", "b-uid")
    assert missing_from([a, b], {"a-uid"}) == [b]


def test_confirmed_gone_when_the_fresh_read_finds_nothing_or_another_uid() -> None:
    indexed = obj("a", "a-uid")
    assert is_confirmed_gone(indexed, None)
    assert is_confirmed_gone(indexed, obj("a", "other"))
    assert not is_confirmed_gone(indexed, obj("a", "a-uid"))


def test_record_claims_are_only_those_in_the_given_namespace() -> None:
    own, users = obj("q-1", "q-uid", namespace="claimwarden-system"), obj("mine", "m-uid")
    view = cache(claims_by_name=FakeIndex({("claimwarden-system", "q-1"): [own], ("ns", "mine"): [users]}),
                 claims_by_record=FakeIndex({("claimwarden-system", "rec"): ["q-1"], ("ns", "rec"): ["mine"]}))
    assert view.claims_labelled_for_record("claimwarden-system") == {"rec": [own]}
    assert view.claims_for_record("claimwarden-system", "rec") == [own]


# --- one Kopf index per kind (app.py), split again into the look-ups -----------------------------

def _indexed(*results: dict[Any, Any] | None) -> FakeIndex:
    """What Kopf's index holds after the index function returned `results` for several objects."""
    index = FakeIndex()
    for result in results:
        for key, value in (result or {}).items():
            index.setdefault(key, []).append(value)
    return index


def test_one_index_per_kind_answers_every_look_up_the_cache_makes() -> None:
    from claimwarden import app

    pod = {"apiVersion": "v1", "kind": "Pod", **obj("p", "pod-uid"),
           "spec": {"resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "t"},
                                       {"name": "shared", "resourceClaimName": "s"}]},
           "status": {"resourceClaimStatuses": [{"name": "gpu", "resourceClaimName": "p-gpu-x"}]}}
    plain_pod = {**obj("q", "q-uid"), "spec": {"containers": []}}
    generated = {**obj("p-gpu-x", "c-uid", ownerReferences=[pod_owner_reference("pod-uid")]),
                 "status": {"allocation": {"devices": {"results": [
                     {"request": "gpu", "driver": "gpu.example.com", "pool": "node-1", "device": "gpu-0"}]}}}}
    quarantine = obj("q-1", "q1-uid", namespace="claimwarden-system", labels={"claimwarden.io/record": "rec"})
    pods = _indexed(*(asyncio.run(app.pods(namespace="ns", name=p["metadata"]["name"], body=p))
                      for p in (pod, plain_pod)))
    claims = _indexed(*(asyncio.run(app.claims(namespace=c["metadata"]["namespace"], name=c["metadata"]["name"],
                                               body=c, labels=c["metadata"].get("labels") or {}))
                        for c in (generated, quarantine)))
    view = Cache(index_views({"pods": pods, "claims": claims, "templates_by_name": FakeIndex()}))

    assert view.pod_keys() == [("ns", "p")]  # no projection for a pod without claims, no tagged keys
    assert view.pod("ns", "p")["metadata"]["uid"] == "pod-uid"
    assert view.pods_using_claim("ns", "p-gpu-x") == ["p"] and view.pods_using_claim("ns", "s") == ["p"]
    assert view.pods_using_template("ns", "t") == ["p"] and view.pods_using_template("other", "t") == []
    assert sorted(view.claim_keys()) == [("claimwarden-system", "q-1"), ("ns", "p-gpu-x")]
    assert [c["metadata"]["name"] for c in view.claims_owned_by("ns", "pod-uid")] == ["p-gpu-x"]
    assert [c["metadata"]["name"] for c in view.claims_holding(("gpu.example.com", "node-1", "gpu-0"))] == ["p-gpu-x"]
    assert view.claims_holding(("gpu.example.com", "node-1", "gpu-1")) == []
    assert list(view.claims_labelled_for_record("claimwarden-system")) == ["rec"]
    assert [c["metadata"]["name"] for c in view.claims_for_record("claimwarden-system", "rec")] == ["q-1"]
    assert sorted(o["metadata"]["name"] for o in view.indexed()["resourceclaims"]) == ["p-gpu-x", "q-1"]
    assert [o["metadata"]["name"] for o in view.indexed()["pods"]] == ["p"]


def test_podgroups_and_records_fold_into_the_one_index_of_their_kind() -> None:
    from claimwarden import app
    from claimwarden.claims import podgroups

    member = {"apiVersion": "v1", "kind": "Pod", **obj("m", "m-uid"),
              "spec": {"schedulingGroup": {"podGroupName": "team"},
                       "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "t"}]}}
    loner = {"apiVersion": "v1", "kind": "Pod", **obj("l", "l-uid"),
             "spec": {"schedulingGroup": {"podGroupName": "team"}, "containers": []}}  # no claims: not indexed
    group = {"apiVersion": "scheduling.k8s.io/v1beta1", "kind": "PodGroup", **obj("team", "pg-uid"),
             "spec": {"resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "t"},
                                         {"name": "nic", "resourceClaimName": "shared-nic"}]}}
    group_claim = obj("team-gpu-x", "gc-uid", annotations={"resource.kubernetes.io/pod-claim-name": "gpu"},
                      ownerReferences=[{"apiVersion": "scheduling.k8s.io/v1beta1", "kind": "PodGroup",
                                        "name": "team", "uid": "pg-uid", "controller": True}])
    marked, admins = _record("p.gpu-0.abc", "gpu-0"), _record("my-mark", "gpu-0")
    pods = _indexed(*(asyncio.run(app.pods(namespace="ns", name=p["metadata"]["name"], body=p))
                      for p in (member, loner)))
    claims = _indexed(asyncio.run(app.claims(namespace="ns", name="team-gpu-x", body=group_claim, labels={})))
    groups = _indexed(asyncio.run(app.pod_groups(namespace="ns", name="team", body=group)))
    records = _indexed(*(asyncio.run(app.device_records(name=r["metadata"]["name"], body=r)) for r in (marked, admins)))
    view = Cache(index_views({"pods": pods, "claims": claims, "templates_by_name": FakeIndex(),
                              "pod_groups": groups, "device_records": records}))

    assert view.pods_in_podgroup("ns", "team") == ["m"] and view.pods_in_podgroup("other", "team") == []
    assert view.pod_keys() == [("ns", "m")]
    assert [c["metadata"]["name"] for c in view.claims_owned_by_podgroup("ns", "pg-uid")] == ["team-gpu-x"]
    assert view.claims_owned_by("ns", "pg-uid") == []  # a PodGroup's claim is not a pod's
    assert podgroups.controlling_podgroup_uid(view.claim("ns", "team-gpu-x") or {}) == "pg-uid"
    assert view.podgroup_keys() == [("ns", "team")]
    assert (view.podgroup("ns", "team") or {})["spec"] == group["spec"]
    assert view.podgroups_using_template("ns", "t") == ["team"] and view.podgroups_using_template("ns", "u") == []
    assert sorted(r["metadata"]["name"] for r in view.records()) == ["my-mark", "p.gpu-0.abc"]
    assert view.record("my-mark") == app.trimmed.record(admins)
    assert view.records_marking(("d", "p", "gpu-0")) == [view.record("my-mark"), view.record("p.gpu-0.abc")]
    assert view.records_marking(("d", "p", "gpu-1")) == []
    assert sorted(o["metadata"]["name"] for o in view.indexed()["unhealthydevices"]) == ["my-mark", "p.gpu-0.abc"]
    assert [o["metadata"]["name"] for o in view.indexed()["podgroups"]] == ["team"]


def test_without_podgroups_or_records_watched_their_look_ups_are_empty() -> None:
    view = Cache(index_views({"pods": FakeIndex(), "claims": FakeIndex(), "templates_by_name": FakeIndex()}))
    assert view.records() == [] and view.record("x") is None and view.records_marking(("d", "p", "g")) == []
    assert view.podgroup_keys() == [] and view.pods_in_podgroup("ns", "team") == []


def _slice(name: str, pool: str, driver: str = "d") -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", **obj(name, f"{name}-uid", namespace=""),
            "spec": {"driver": driver, "nodeName": pool, "pool": {"name": pool, "generation": 1}, "devices": []}}


def test_the_slices_of_a_pool_are_found_by_the_slice_index() -> None:
    """Two slices of one pool while a driver re-creates it; the names stay the only primary keys."""
    from claimwarden import app

    old, new, other, foreign = _slice("n0-a", "n0"), _slice("n0-b", "n0"), _slice("n1-a", "n1"), _slice("x", "n0", "e")
    slices = _indexed(*(asyncio.run(app.slices_by_name(name=s["metadata"]["name"], body=s))
                        for s in (old, new, other, foreign)))
    view = Cache(index_views({"pods": FakeIndex(), "claims": FakeIndex(), "templates_by_name": FakeIndex(),
                              "slices_by_name": slices}))
    assert [s["metadata"]["name"] for s in view.resource_slices_of_pool("d", "n0")] == ["n0-a", "n0-b"]
    assert [s["metadata"]["name"] for s in view.resource_slices_of_pool("e", "n0")] == ["x"]
    assert view.resource_slices_of_pool("d", "n2") == []
    assert sorted(view.resource_slice_names()) == ["n0-a", "n0-b", "n1-a", "x"]
    assert len(view.resource_slices()) == 4 and view.resource_slice("n1-a") == app.trimmed.resource_slice(other)
