"""256 pods share one claim (the reservedFor limit); the 257th waits until one of them goes."""

from __future__ import annotations

import time

from kubernetes import client

from .helpers import delete_pods, gpu_claim_spec, pod_with_claims, wait_for
from .operator import Operator

LIMIT = 256


def _scheduled(core: client.CoreV1Api, namespace: str) -> set[str]:
    return {p.metadata.name for p in core.list_namespaced_pod(namespace).items if p.spec.node_name}


def test_256_pods_share_one_claim_and_the_257th_waits(api: client.ApiClient, namespace: str,
                                                      claimwarden: Operator) -> None:
    core, resource = client.CoreV1Api(api), client.ResourceV1Api(api)
    resource.create_namespaced_resource_claim(namespace, body={"metadata": {"name": "shared"},
                                                               "spec": gpu_claim_spec()})
    uses = [{"name": "gpu", "resourceClaimName": "shared"}]
    # One at a time: the scheduler binds concurrently, and concurrent sharers of one claim conflict on
    # its status and back off for seconds each (measured here: about 0.2 pods/s for 256 at once).
    for i in range(LIMIT):
        name = f"pod-{i:03d}"
        core.create_namespaced_pod(namespace, body=pod_with_claims(name, uses))
        wait_for(f"{name} scheduled", lambda name=name: core.read_namespaced_pod(name, namespace).spec.node_name,
                 60, interval=0.05)
    assert len(_scheduled(core, namespace)) == LIMIT
    claim = resource.read_namespaced_resource_claim("shared", namespace)
    assert len(claim.status.reserved_for) == LIMIT
    assert len(claim.status.allocation.devices.results) == 1

    core.create_namespaced_pod(namespace, body=pod_with_claims("pod-extra", uses))
    time.sleep(10)
    assert "pod-extra" not in _scheduled(core, namespace)

    warnings = [e for e in core.list_namespaced_event(
        namespace, field_selector="involvedObject.name=shared").items if e.reason == "ReservationsNearLimit"]
    assert warnings and warnings[0].type == "Warning"
    assert "claimwarden_claims_near_reservation_limit 1.0" in claimwarden.metrics()

    delete_pods(api, namespace, ["pod-000"])
    wait_for("pod-extra scheduled after a sharer left", lambda: "pod-extra" in _scheduled(core, namespace), 120)
    claim = resource.read_namespaced_resource_claim("shared", namespace)
    names = {r.name for r in claim.status.reserved_for}
    assert "pod-000" not in names and "pod-extra" in names and len(names) == LIMIT
