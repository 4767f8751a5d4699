"""Two records of one device, and one quarantine claim between them (issue 20, finding 4).

An annotation record and an admin's manual record may mark the same device. Each used to keep a
quarantine claim of its own; clearing the annotation then deallocated its claim, and kube-scheduler
(which keeps allocated devices as a plain set, health/__init__.py) forgot the device while the
manual record's claim still held it: the next pod got the marked device. The device now has one
quarantine claim, released only when no record of it is left.

The order matters, which is why a first lab run did not see it: a manual record made *before* the
annotation takes the mark over (``slice_marks.plan_slice`` counts a record of the device under any name as
its record), so no second record is made and clearing the annotation changes nothing. Only the
annotation first, then the manual record, gives two records.

The lab has one node with two devices and no DeviceTaintRule (turned off from 1.37, where it is on by
default): the quarantine claim alone keeps new work away.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from kubernetes import client, config

from claimwarden_lab.binaries import resolve_version
from claimwarden_lab.cluster import LabState

from .conftest import extra_lab, lab_kubernetes, service_account_kubeconfig
from .health_helpers import (
    GROUP,
    PLURAL,
    VERSION,
    DeviceWatch,
    create_record,
    delete_record,
    device_of,
    holders,
    mark,
    records,
    unmark,
)
from .helpers import pod_with_claims, taint_rule_version, template, wait_for
from .operator import Operator

POOL = "kwok-node-0"
QUARANTINE_NAMESPACE = "claimwarden-system"
TEMPLATE_CLAIM = [{"name": "gpu", "resourceClaimTemplateName": "single-gpu"}]
NO_TAINT_RULES_FROM_1_37 = {"feature_gates": "DRADeviceTaintRules=false",
                            "runtime_config": "resource.k8s.io/v1/devicetaintrules=false"}


@pytest.fixture(scope="module")
def two_device_lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LabState]:
    options = NO_TAINT_RULES_FROM_1_37 if int(resolve_version(lab_kubernetes()).split(".")[1]) >= 37 else {}
    with extra_lab(tmp_path_factory, nodes=1, gpus_per_node=2, **options) as state:
        yield state


def _quarantine_claims(api: client.ApiClient, device: str) -> list[str]:
    return [h for h in holders(api, POOL, device) if h.startswith(f"{QUARANTINE_NAMESPACE}/")]


def _record_names(api: client.ApiClient, device: str) -> list[str]:
    return sorted(r["metadata"]["name"] for r in records(api) if r["spec"]["device"] == device)


def _scheduled(core: client.CoreV1Api, namespace: str, pod: str) -> bool:
    return bool(core.read_namespaced_pod(pod, namespace).spec.node_name)


def test_clearing_one_of_two_records_keeps_the_device_quarantined(two_device_lab: LabState,
                                                                   tmp_path_factory: pytest.TempPathFactory) -> None:
    api = config.new_client_from_config(config_file=str(two_device_lab.kubeconfig))
    core, resource = client.CoreV1Api(api), client.ResourceV1Api(api)
    custom = client.CustomObjectsApi(api)
    assert taint_rule_version(api) is None, "this lab must not serve DeviceTaintRule"
    namespace = "two-records"
    core.create_namespace(body={"metadata": {"name": namespace}})
    resource.create_namespaced_resource_claim_template(namespace, body=template("single-gpu"))
    operator = Operator(service_account_kubeconfig(two_device_lab),
                        tmp_path_factory.mktemp("two-records") / "claimwarden.log")
    operator.start()
    try:
        # A manual record first: the annotation made after it joins it, no second record is made.
        create_record(api, "admin-gpu-1", POOL, "gpu-1", "NoSchedule", "checking")
        wait_for("gpu-1 quarantined", lambda: _quarantine_claims(api, "gpu-1"), 30)
        mark(api, POOL, "gpu-1", "XID 79")
        time.sleep(3)
        assert _record_names(api, "gpu-1") == ["admin-gpu-1"]
        unmark(api, POOL, "gpu-1")
        delete_record(api, "admin-gpu-1")
        wait_for("gpu-1 free again", lambda: holders(api, POOL, "gpu-1") == [], 30)

        # The annotation first, then an admin's NoSchedule record: two records, one quarantine claim.
        mark(api, POOL, "gpu-0", "XID 79")
        [annotation_record] = wait_for("the annotation's record", lambda: _record_names(api, "gpu-0") or None, 30)
        [claim] = wait_for("gpu-0 quarantined", lambda: _quarantine_claims(api, "gpu-0"), 30)
        create_record(api, "admin-gpu-0", POOL, "gpu-0", "NoSchedule", "the admin keeps it off")
        wait_for("the admin's record reports the device's quarantine claim", lambda: (custom.get_cluster_custom_object(
            GROUP, VERSION, PLURAL, "admin-gpu-0").get("status") or {}).get("quarantineClaims"), 30)
        assert _quarantine_claims(api, "gpu-0") == [claim], "one quarantine claim per device"

        # Every other device taken.
        core.create_namespaced_pod(namespace, body=pod_with_claims("filler", TEMPLATE_CLAIM))
        wait_for("filler scheduled", lambda: _scheduled(core, namespace, "filler"), 60)
        assert device_of(api, namespace, "filler") == (POOL, "gpu-1")

        with DeviceWatch(api, POOL, ("gpu-0",), QUARANTINE_NAMESPACE) as watch:
            # Clearing the annotation removes its record; the admin's still marks the device.
            unmark(api, POOL, "gpu-0")
            wait_for("the annotation's record gone",
                     lambda: _record_names(api, "gpu-0") == ["admin-gpu-0"], 30)
            core.create_namespaced_pod(namespace, body=pod_with_claims("waiting", TEMPLATE_CLAIM))
            time.sleep(10)
            assert not _scheduled(core, namespace, "waiting"), "the waiting pod must not get the marked device"
            assert _quarantine_claims(api, "gpu-0") == [claim], "the device's quarantine claim stays, unchanged"
            assert annotation_record not in _record_names(api, "gpu-0")

            # The last record cleared: the device is free, and the waiting pod takes it.
            cleared_at = time.monotonic()
            delete_record(api, "admin-gpu-0")
            wait_for("waiting scheduled on the freed device", lambda: _scheduled(core, namespace, "waiting"), 60)
        assert device_of(api, namespace, "waiting") == (POOL, "gpu-0")
        # Never given to anyone while a record marked it.
        early = {claim: round(cleared_at - at, 1) for claim, at in watch.first_seen.items() if at < cleared_at}
        assert early == {}, f"allocated the marked device (seconds before it was cleared): {early}"
        assert _quarantine_claims(api, "gpu-0") == []
    finally:
        core.delete_namespace(namespace)
        wait_for("the namespace gone", lambda: namespace not in {
            n.metadata.name for n in core.list_namespace().items}, 120, interval=1)
        assert operator.stop() in (None, 0)
        api.close()
