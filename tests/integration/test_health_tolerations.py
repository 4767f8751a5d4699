"""Upstream's toleration rules, in a lab where claims may carry tolerations (DRADeviceTaints on).

From 1.35 the scheduler copies a request's tolerations into status.allocation.devices.results[];
1.34's allocator honours them but never copies them, so claimwarden falls back to the request's
tolerations in the claim spec. This lab runs 1.34, so it exercises that fallback.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client, config

from claimwarden_lab.cluster import LabState

from .conftest import extra_lab, service_account_kubeconfig
from .health_helpers import device_of, events, mark, wait_gone
from .helpers import pod_with_claims, template, wait_for
from .operator import Operator


@pytest.fixture(scope="module")
def taint_lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LabState]:
    with extra_lab(tmp_path_factory, nodes=1, gpus_per_node=4, presets="device-taints") as state:
        yield state


def _tolerating(seconds: int | None) -> dict[str, Any]:
    toleration: dict[str, Any] = {"key": "claimwarden.io/unhealthy", "operator": "Exists", "effect": "NoExecute"}
    if seconds is not None:
        toleration["tolerationSeconds"] = seconds
    return {"devices": {"requests": [{"name": "gpu", "exactly": {
        "deviceClassName": "gpu.example.com", "tolerations": [toleration]}}]}}


def test_toleration_seconds_delay_eviction_and_a_toleration_without_them_prevents_it(
        taint_lab: LabState, tmp_path_factory: pytest.TempPathFactory) -> None:
    api = config.new_client_from_config(config_file=str(taint_lab.kubeconfig))
    core, resource = client.CoreV1Api(api), client.ResourceV1Api(api)
    namespace = "tolerations"
    core.create_namespace(body={"metadata": {"name": namespace}})
    resource.create_namespaced_resource_claim_template(namespace, body=template("for-a-while", _tolerating(6)))
    resource.create_namespaced_resource_claim_template(namespace, body=template("forever", _tolerating(None)))
    operator = Operator(service_account_kubeconfig(taint_lab), tmp_path_factory.mktemp("tolerations") / "cw.log")
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
        assert claim.status.allocation.devices.results[0].tolerations is None  # 1.34 copies nothing

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
    finally:
        assert operator.stop() == 0
        api.close()
