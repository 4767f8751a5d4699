"""What the indices keep of objects whose labels, annotations, owner references and finalizers their
users write: only the entries claimwarden reads (trimmed.py). Each test also runs the functions
that read those entries on the projection, so a read the projection drops fails here.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from claimwarden.cache import Cache
from claimwarden.claims import plan as claims_plan
from claimwarden.claims.controller import ClaimsController
from claimwarden.health import approval, records, slice_marks
from claimwarden.health.plan import is_quarantine_claim
from claimwarden.objects import trimmed
from claimwarden.objects.claims import (
    DELETE_PROTECTION_FINALIZER,
    EXTENDED_RESOURCE_CLAIM_ANNOTATION,
    POD_CLAIM_NAME_ANNOTATION,
    claim_source,
    controlling_pod_uid,
    is_extended_resource_claim,
    pod_claim_name_of,
)
from claimwarden.objects.meta import has_finalizer

NS = "ns"
KIB = 1024
# As much as the apiserver lets a user put on one object: 256 KiB of annotations in total.
FOREIGN_ANNOTATIONS = {f"example.com/note-{i}": "x" * (KIB - 40) for i in range(255)}
FOREIGN_LABELS = {f"example.com/l-{i}": "v" * 63 for i in range(500)}


def size(obj: Any) -> int:
    return len(json.dumps(obj))


def tenant_claim(**annotations: str) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": "c", "namespace": NS, "uid": "c-uid", "resourceVersion": "9",
                         "creationTimestamp": "2026-01-01T00:00:00Z",
                         "annotations": {**FOREIGN_ANNOTATIONS, **annotations},
                         "labels": {**FOREIGN_LABELS, records.RECORD_LABEL: "n1.gpu-0.abc"},
                         "ownerReferences": [
                             *({"apiVersion": "example.com/v1", "kind": "Thing", "name": f"t{i}", "uid": f"u{i}"}
                               for i in range(200)),
                             {"apiVersion": "v1", "kind": "Pod", "name": "p", "uid": "pod-uid", "controller": True}],
                         "finalizers": [*(f"example.com/f{i}" for i in range(300)), DELETE_PROTECTION_FINALIZER]},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu"}}]}},
            "status": {}}


def test_a_claim_keeps_only_the_labels_annotations_owners_and_finalizers_that_are_read() -> None:
    full = tenant_claim(**{POD_CLAIM_NAME_ANNOTATION: "gpu"})
    projected = trimmed.claim(full)
    meta = projected["metadata"]
    assert meta["annotations"] == {POD_CLAIM_NAME_ANNOTATION: "gpu"}
    assert meta["labels"] == {records.RECORD_LABEL: "n1.gpu-0.abc"}
    assert meta["ownerReferences"] == [full["metadata"]["ownerReferences"][-1]]
    assert meta["finalizers"] == [DELETE_PROTECTION_FINALIZER]
    assert size(full) > 256 * KIB and size(projected) < 2 * KIB, (size(full), size(projected))

    # Everything that reads them answers as it does on the whole object.
    for read in (claim_source, controlling_pod_uid, is_extended_resource_claim, pod_claim_name_of,
                 lambda c: has_finalizer(c, DELETE_PROTECTION_FINALIZER), lambda c: is_quarantine_claim(c, NS)):
        assert read(projected) == read(full)
    extended = tenant_claim(**{EXTENDED_RESOURCE_CLAIM_ANNOTATION: "true"})
    assert is_extended_resource_claim(trimmed.claim(extended)) is True
    assert claim_source(trimmed.claim(extended)) == claim_source(extended) == "extended_resource"


def test_a_claim_without_any_of_those_keeps_no_empty_maps() -> None:
    full = tenant_claim()
    del full["metadata"]["labels"][records.RECORD_LABEL]
    full["metadata"]["ownerReferences"] = full["metadata"]["ownerReferences"][:-1]
    full["metadata"]["finalizers"] = full["metadata"]["finalizers"][:-1]
    meta = trimmed.claim(full)["metadata"]
    assert not {"annotations", "labels", "ownerReferences", "finalizers"} & set(meta)
    assert claim_source(trimmed.claim(full)) == "user"


def test_a_slice_keeps_only_the_marks() -> None:
    marks = {f"{records.ANNOTATION_PREFIX}gpu-0": "XID 79",
             f"{records.DRAIN_ANNOTATION_PREFIX}gpu-0": "AllowCompletion"}
    full = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": "n1-gpu", "uid": "s-uid", "annotations": {**FOREIGN_ANNOTATIONS, **marks}},
            "spec": {"driver": "gpu.example.com", "nodeName": "n1", "pool": {"name": "n1", "generation": 1},
                     "devices": [{"name": "gpu-0"}]}}
    projected = trimmed.resource_slice(full)
    assert projected["metadata"]["annotations"] == marks
    assert slice_marks.marked_annotations(projected) == slice_marks.marked_annotations(full)
    assert slice_marks.parse_slice_marks(projected) == slice_marks.parse_slice_marks(full)


def test_a_record_keeps_claimwarden_io_keys_only() -> None:
    ours = {approval.APPROVED_BY: "alice", approval.APPROVED_GENERATION: "2", "claimwarden.io/later": "kept"}
    full = {"apiVersion": "claimwarden.io/v1alpha1", "kind": "UnhealthyDevice",
            "metadata": {"name": "r", "uid": "r-uid", "generation": 2,
                         "annotations": {**ours, "kubectl.kubernetes.io/last-applied-configuration": "x" * 100 * KIB},
                         "labels": {records.SLICE_LABEL: "n1-gpu", "team": "a"}},
            "spec": {"driver": "gpu.example.com", "pool": "n1", "device": "gpu-0"}, "status": {}}
    projected = trimmed.record(full)
    assert projected["metadata"]["annotations"] == ours
    assert projected["metadata"]["labels"] == {records.SLICE_LABEL: "n1-gpu"}
    assert approval.judge(projected, policy_in_force=True).honoured == "alice"
    assert projected["metadata"]["generation"] == 2


def test_a_podgroup_keeps_only_its_protection_finalizer() -> None:
    from claimwarden.claims.podgroups import PROTECTION_FINALIZER

    full = {"apiVersion": "scheduling.k8s.io/v1beta1", "kind": "PodGroup",
            "metadata": {"name": "team", "namespace": NS, "uid": "pg", "annotations": FOREIGN_ANNOTATIONS,
                         "finalizers": ["example.com/a", PROTECTION_FINALIZER]},
            "spec": {"resourceClaims": []}}
    assert trimmed.podgroup(full)["metadata"]["finalizers"] == [PROTECTION_FINALIZER]
    assert "annotations" not in trimmed.podgroup(full)["metadata"]


# --- templates: what every claim made from them inherits must stay exact ------------------------------

def template(annotations: dict[str, str]) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": "t", "namespace": NS, "uid": "t-uid", "resourceVersion": "4",
                         "annotations": FOREIGN_ANNOTATIONS},  # the template's own: never copied
            "spec": {"metadata": {"labels": {"team": "a"}, "annotations": annotations},
                     "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu"}}]}}}}


def pod() -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "p", "namespace": NS, "uid": "pod-uid", "resourceVersion": "1",
                         "creationTimestamp": "2026-01-01T00:00:00Z"},
            "spec": {"resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "t"}]},
            "status": {"phase": "Pending"}}


def test_a_small_template_is_kept_with_its_spec_and_makes_the_same_claim() -> None:
    full = template({"example.com/note": "copied to every claim"})
    projected = trimmed.template(full)
    assert not trimmed.is_trimmed(projected)
    assert "annotations" not in projected["metadata"]
    assert claims_plan.build_claim(pod(), "gpu", projected) == claims_plan.build_claim(pod(), "gpu", full)


def test_a_big_template_is_kept_without_its_spec() -> None:
    projected = trimmed.template(template(FOREIGN_ANNOTATIONS))
    assert trimmed.is_trimmed(projected) and "spec" not in projected
    assert size(projected) < KIB
    assert not trimmed.is_trimmed(trimmed.template(template({})))


class FakeKube:
    def __init__(self, live_template: dict[str, Any] | None) -> None:
        self.live_template = live_template
        self.created: list[dict[str, Any]] = []
        self.calls: list[str] = []

    async def get_template(self, namespace: str, name: str) -> dict[str, Any] | None:
        self.calls.append(f"get_template {name}")
        return self.live_template

    async def create_claim(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        self.calls.append("create_claim")
        created = {**body, "metadata": {**body["metadata"], "name": "p-gpu-abcde", "uid": "c-uid",
                                        "resourceVersion": "5"}}
        self.created.append(created)
        return created

    async def apply_pod_claim_statuses(self, namespace: str, name: str,
                                       entries: list[dict[str, str]]) -> dict[str, Any]:
        self.calls.append("apply_pod_claim_statuses")
        return {"metadata": {"resourceVersion": "2"}}

    async def post_event(self, *args: Any, **kwargs: Any) -> None:
        self.calls.append("post_event")


def claims_controller(kube: FakeKube, cached_template: dict[str, Any]) -> ClaimsController:
    names = ("pods_by_claim", "pods_by_template", "claims_by_name", "claims_by_owner", "claims_by_device",
             "claims_by_record")
    indices: dict[str, Any] = {name: {} for name in names}
    indices["pods_by_name"] = {(NS, "p"): [trimmed.pod(pod())]}
    indices["templates_by_name"] = {(NS, "t"): [trimmed.template(cached_template)]}
    return ClaimsController(Cache(indices), kube)  # type: ignore[arg-type]


def test_a_claim_from_a_big_template_is_made_from_the_template_read_by_name() -> None:
    full = template(FOREIGN_ANNOTATIONS)
    kube = FakeKube(full)
    controller = claims_controller(kube, full)
    asyncio.run(controller.reconcile((NS, "p")))
    assert kube.calls == ["get_template t", "create_claim", "apply_pod_claim_statuses"]
    [created] = kube.created
    assert created["metadata"]["annotations"] == {**FOREIGN_ANNOTATIONS, POD_CLAIM_NAME_ANNOTATION: "gpu"}
    assert created["spec"] == full["spec"]["spec"]
    # What the controller remembers of the claim until the watch shows it is the projection too.
    [(_, remembered)] = controller._recent["pod-uid"].values()
    assert remembered["metadata"]["annotations"] == {POD_CLAIM_NAME_ANNOTATION: "gpu"}


def test_a_big_template_deleted_before_the_read_is_a_missing_template() -> None:
    from claimwarden.claims.controller import ClaimRetry

    kube = FakeKube(None)
    with pytest.raises(ClaimRetry, match=r'resourceclaimtemplate\.resource\.k8s\.io "t" not found'):
        asyncio.run(claims_controller(kube, template(FOREIGN_ANNOTATIONS)).reconcile((NS, "p")))
    assert kube.created == [] and "post_event" in kube.calls
