"""Upstream's toleration rules, in labs where claims may carry tolerations (DRADeviceTaints on).

From 1.35 (with DRADeviceTaints on; on by default from 1.36) the scheduler copies a request's
tolerations into status.allocation.devices.results[]; 1.34's allocator honours them but never
copies them, so there claimwarden falls back to the request's tolerations in the claim spec. Each
version's lab is named explicitly: a missing version fails, it never skips.

The same labs show where DeviceTaintRule is served (claimwarden's NoSchedule rule follows it):
v1alpha3 with runtime-config on 1.34 and 1.35, v1beta2 with runtime-config on 1.36 (v1 on 1.37:
test_extended_resources.py).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from kubernetes import client, config

from claimwarden_lab.cluster import LabState

from .conftest import extra_lab, service_account_kubeconfig
from .health_helpers import device_of, events, mark, record_for, wait_gone
from .helpers import pod_with_claims, taint_rule_version, template, wait_for
from .operator import Operator


@dataclass(frozen=True)
class Version:
    kubernetes: str
    copies: bool
    """The allocator copies tolerations into allocation results."""
    rule_version: str

# Each lab gets the version's device-taints preset (claimwarden_lab/presets.py): the gates and the
# runtime-config that serve DeviceTaintRule and make the scheduler honour it.
VERSIONS = [
    Version("1.34", copies=False, rule_version="v1alpha3"),
    Version("1.35", copies=True, rule_version="v1alpha3"),
    Version("1.36", copies=True, rule_version="v1beta2"),
]

@pytest.fixture(scope="module", params=VERSIONS, ids=[v.kubernetes for v in VERSIONS])
def taint_lab(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[
        tuple[Version, LabState]]:
    version: Version = request.param
    with extra_lab(tmp_path_factory, nodes=1, gpus_per_node=4, kubernetes=version.kubernetes,
                   presets="device-taints") as state:
        yield version, state

def _tolerating(seconds: int | None) -> dict[str, Any]:
    toleration: dict[str, Any] = {"key": "claimwarden.io/unhealthy", "operator": "Exists", "effect": "NoExecute"}
    if seconds is not None:
        toleration["tolerationSeconds"] = seconds
    return {"devices": {"requests": [{"name": "gpu", "exactly": {
        "deviceClassName": "gpu.example.com", "tolerations": [toleration]}}]}}

def test_toleration_seconds_delay_eviction_and_a_toleration_without_them_prevents_it(
        taint_lab: tuple[Version, LabState], tmp_path_factory: pytest.TempPathFactory) -> None:
    version, lab = taint_lab
    api = config.new_client_from_config(config_file=str(lab.kubeconfig))
    core, resource = client.CoreV1Api(api), client.ResourceV1Api(api)
    namespace = "tolerations"
    core.create_namespace(body={"metadata": {"name": namespace}})
    resource.create_namespaced_resource_claim_template(namespace, body=template("for-a-while", _tolerating(6)))
    resource.create_namespaced_resource_claim_template(namespace, body=template("forever", _tolerating(None)))
    operator = Operator(service_account_kubeconfig(lab), tmp_path_factory.mktemp("tolerations") / "cw.log")
    operator.start()
    try:
        for pod, tmpl in (("patient", "for-a-while"), ("stubborn", "forever")):
            core.create_namespaced_pod(namespace, body=pod_with_claims(
                pod, [{"name": "gpu", "resourceClaimTemplateName": tmpl}]))
        for pod in ("patient", "stubborn"):
            wait_for(f"{pod} Running", lambda pod=pod: core.read_namespaced_pod(pod, namespace).status.phase
                     == "Running")
        name = core.read_namespaced_pod("patient", namespace).status.resource_claim_statuses[0].resource_claim_name
        claim = resource.read_namespaced_resource_claim(name, namespace)
        assert claim.spec.devices.requests[0].exactly.tolerations[0].toleration_seconds == 6
        copied = claim.status.allocation.devices.results[0].tolerations
        if version.copies:
            assert [t.toleration_seconds for t in copied or []] == [6]
        else:
            assert copied is None  # 1.34 copies nothing

        marked = time.monotonic()
        for pod in ("patient", "stubborn"):
            mark(api, *device_of(api, namespace, pod), reason="tolerated for a while")
        time.sleep(3)
        assert core.read_namespaced_pod("patient", namespace).metadata.deletion_timestamp is None
        wait_gone(api, namespace, "patient", 30)
        assert time.monotonic() - marked >= 5
        time.sleep(4)
        stubborn = core.read_namespaced_pod("stubborn", namespace)
        assert stubborn.metadata.deletion_timestamp is None and stubborn.status.phase == "Running"
        assert not events(api, namespace, "stubborn", "EvictedUnhealthyDevice")
        assert ("allocation results carry tolerations" in operator.log_tail(400)) == version.copies

        # claimwarden's NoSchedule DeviceTaintRule, at the version this server serves.
        assert taint_rule_version(api) == version.rule_version
        pool, device = device_of(api, namespace, "stubborn")
        record = wait_for("the record naming its DeviceTaintRule", lambda: (
            r if (r := record_for(api, pool, device)) and (r.get("status") or {}).get("deviceTaintRule") else None),
            30)
        rule = client.CustomObjectsApi(api).get_cluster_custom_object(
            "resource.k8s.io", version.rule_version, "devicetaintrules", record["status"]["deviceTaintRule"])
        assert rule["spec"]["taint"]["effect"] == "NoSchedule"
        assert rule["spec"]["deviceSelector"] == {"driver": "gpu.example.com", "pool": pool, "device": device}
    finally:
        assert operator.stop() == 0
        api.close()
