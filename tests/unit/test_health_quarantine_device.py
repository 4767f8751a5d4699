"""One quarantine claim per device (health/quarantine.py): which claims are the device's, what a re-assert
merges, and which claims count as orphans. A fake API records every call; the cache is the real `Cache`."""

from __future__ import annotations

import asyncio
from typing import Any

from claimwarden.cache import Cache
from claimwarden.health.plan import device_label
from claimwarden.health.quarantine import Quarantine
from claimwarden.health.records import RECORD_LABEL, DeviceRef, label_value
from claimwarden.objects import trimmed
from claimwarden.objects.claims import allocated_devices

NS = "claimwarden-system"
REF = DeviceRef("gpu.example.com", "node-0", "gpu-0")
OTHER = DeviceRef("gpu.example.com", "node-0", "gpu-1")


def _claim(name: str, label: str, ref: DeviceRef | None) -> dict[str, Any]:
    status: dict[str, Any] = {}
    if ref is not None:
        status["allocation"] = {"devices": {"results": [
            {"request": "quarantine", "driver": ref.driver, "pool": ref.pool, "device": ref.device}]}}
    return {"metadata": {"name": name, "namespace": NS, "uid": f"uid-{name}", "resourceVersion": "5",
                         "labels": {RECORD_LABEL: label}}, "status": status}


def _record(name: str, ref: DeviceRef) -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": {"driver": ref.driver, "pool": ref.pool, "device": ref.device}}


class FakeKube:
    def __init__(self, records: list[dict[str, Any]] | None = None) -> None:
        self.records = records or []
        self.calls: list[tuple[str, str]] = []

    async def list_cluster_objects(self, group_version: str, plural: str) -> list[dict[str, Any]]:
        return self.records

    async def delete_claim(self, namespace: str, name: str, uid: str, resource_version: str | None = None) -> bool:
        self.calls.append(("delete", name))
        return True

    async def patch_claim_status(self, namespace: str, name: str, ops: list[dict[str, Any]]) -> dict[str, Any]:
        self.calls.append(("allocate" if any(op["op"] == "add" for op in ops) else "deallocate", name))
        return {"metadata": {"name": name, "namespace": NS, "uid": f"uid-{name}", "resourceVersion": "7"}}

    async def create_claim(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        self.calls.append(("create", body["metadata"]["labels"][RECORD_LABEL]))
        return {"metadata": {"name": "new", "namespace": NS, "uid": "uid-new", "resourceVersion": "6"}}


def _quarantine(claims: list[dict[str, Any]], kube: FakeKube) -> Quarantine:
    indices: dict[str, Any] = {name: {} for name in (
        "pods_by_name", "pods_by_claim", "pods_by_template", "claims_by_name", "claims_by_owner", "claims_by_device",
        "claims_by_record", "templates_by_name")}
    for claim in claims:
        name, label = claim["metadata"]["name"], claim["metadata"]["labels"][RECORD_LABEL]
        indices["claims_by_name"][(NS, name)] = [trimmed.claim(claim)]
        indices["claims_by_record"].setdefault((NS, label), []).append(name)
        for device in allocated_devices(claim):
            indices["claims_by_device"].setdefault(device, []).append((NS, name))
    return Quarantine(cache=Cache(indices), kube=kube, namespace=NS)  # type: ignore[arg-type]


def test_the_device_claims_are_found_by_its_label_by_allocation_and_by_its_records_labels() -> None:
    claims = [_claim("device", device_label(REF), REF),
              _claim("admins-old", label_value("admin"), REF),  # one per record, from an older version
              _claim("admins-bare", label_value("admin"), None),  # created, not allocated yet (a crash)
              _claim("elsewhere", label_value("admin"), OTHER),  # (a record of that name once named gpu-1)
              _claim("gpu-1", device_label(OTHER), OTHER)]
    quarantine = _quarantine(claims, FakeKube())
    names = [c["metadata"]["name"] for c in quarantine.claims_of(REF, ["admin"])]
    assert names == ["admins-bare", "admins-old", "device"]
    # Without the record's name, its allocated claim is still the device's (found by its allocation).
    assert [c["metadata"]["name"] for c in quarantine.claims_of(REF)] == ["admins-old", "device"]


def test_two_claims_of_one_device_are_merged_into_one_by_a_reassert() -> None:
    kube = FakeKube()
    quarantine = _quarantine([_claim("a", device_label(REF), REF), _claim("b", label_value("admin"), REF)], kube)
    names = asyncio.run(quarantine.sync(REF, needed=True, held=False, released=False, record_names=["admin"]))
    assert names == ["new"]
    assert kube.calls == [("delete", "a"), ("delete", "b"), ("create", device_label(REF)), ("allocate", "new")]


def test_one_claim_is_kept_and_released_only_when_not_needed() -> None:
    kube = FakeKube()
    quarantine = _quarantine([_claim("a", device_label(REF), REF)], kube)
    assert asyncio.run(quarantine.sync(REF, needed=True, held=False, released=False)) == ["a"]
    assert kube.calls == []
    assert asyncio.run(quarantine.sync(REF, needed=False, held=False, released=False)) == []
    assert kube.calls == [("deallocate", "a"), ("delete", "a")]


def test_orphans_are_claims_of_devices_no_record_marks() -> None:
    kube = FakeKube(records=[_record("admin", REF)])  # a manual record of gpu-0: its name is not the device's
    claims = [_claim("device", device_label(REF), REF),  # the device's, kept
              _claim("gone-record", label_value("gone"), REF),  # an older version's, of a gone record: still marked
              _claim("gpu-1", device_label(OTHER), OTHER)]  # nothing marks gpu-1 any more
    asyncio.run(_quarantine(claims, kube).release_orphans())
    assert kube.calls == [("deallocate", "gpu-1"), ("delete", "gpu-1")]
