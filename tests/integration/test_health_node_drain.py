"""drain Node (health/node_drain.py): a NoExecute record with `spec.drain: Node` empties its device's whole node on
the shared lab's kwok-node-1, in the drain order of `kubectl claimwarden drain`: the node's DRA consumers (a pod
with a template claim, two sharing a standalone claim) first, through claimwarden's evictions; then, once their
claims are released, the pod without claims. The node is not cordoned (README "Drain modes", drain Node)."""

from __future__ import annotations

from kubernetes import client

from claimwarden_lab.audit_policy import CLAIMWARDEN_USER
from claimwarden_lab.cluster import LabState

from .auditor import WRITE_VERBS, LabAudit
from .health_helpers import device_of, record_for
from .helpers import create_pods, gpu_claim_spec, pod_with_claims, template, wait_for
from .operator import Operator
from .test_health_drain import _mark, _unmark
from .test_plugin_drain import _evictions

NODE = "kwok-node-1"
CONSUMERS = {"solo", "sharer-0", "sharer-1"}


def _on_node(body: dict[str, object]) -> dict[str, object]:
    body["spec"] = {**body["spec"], "nodeSelector": {"kubernetes.io/hostname": NODE},  # type: ignore[dict-item]
                    "terminationGracePeriodSeconds": 0}
    return body


def _others_on_node(api: client.ApiClient, namespace: str) -> list[str]:
    """Pods of earlier tests on the node (their namespaces still being deleted): the drain would take them too."""
    pods = client.CoreV1Api(api).list_pod_for_all_namespaces(field_selector=f"spec.nodeName={NODE}").items
    return [f"{p.metadata.namespace}/{p.metadata.name}" for p in pods if p.metadata.namespace != namespace]


def test_a_drain_node_record_evicts_the_nodes_dra_consumers_then_after_their_claims_the_rest(
        api: client.ApiClient, lab: LabState, namespace: str, claimwarden: Operator) -> None:
    core, resource = client.CoreV1Api(api), client.ResourceV1Api(api)
    resource.create_namespaced_resource_claim_template(namespace, body=template("single-gpu"))
    resource.create_namespaced_resource_claim(namespace, body={"metadata": {"name": "shared"},
                                                               "spec": gpu_claim_spec()})
    bodies = [_on_node(pod_with_claims("solo", [{"name": "gpu", "resourceClaimTemplateName": "single-gpu"}]))]
    bodies += [_on_node(pod_with_claims(f"sharer-{i}", [{"name": "gpu", "resourceClaimName": "shared"}]))
               for i in range(2)]
    bodies.append(_on_node({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "web"},
                            "spec": {"containers": [{"name": "c", "image": "registry.example/busybox:1"}]}}))
    wait_for(f"no pod of an earlier test on {NODE}", lambda: not _others_on_node(api, namespace), 60)
    create_pods(api, namespace, bodies)
    wait_for("the 4 pods running", lambda: len([p for p in core.list_namespaced_pod(namespace).items
                                                if p.status.phase == "Running"]) == 4, 60)
    audit = LabAudit(lab)
    pool, device = device_of(api, namespace, "solo")
    _mark(api, pool, device, "node-scoped fault", "Node")
    try:
        wait_for("the node emptied", lambda: not core.list_namespaced_pod(namespace).items, 60)
        record = wait_for("the record's count", lambda: (r := record_for(api, pool, device)) and
                          r["status"].get("podsEvicted") == 4 and r["status"].get("podsPending") == 0 and r, 30)
        assert record["spec"]["drain"] == "Node"
    finally:
        _unmark(api, pool, device)
    wait_for("the record gone", lambda: record_for(api, pool, device) is None, 60)

    events = audit.new_events()
    evictions = _evictions(events, namespace)
    evicted = [pod for _, pod in evictions]
    assert sorted(evicted) == sorted(CONSUMERS | {"web"}), "each pod evicted exactly once"
    assert evicted[-1] == "web", evicted
    assert all((e.get("user") or {}).get("username") == CLAIMWARDEN_USER for e in events
               if (e.get("objectRef") or {}).get("subresource") == "eviction"
               and (e.get("objectRef") or {}).get("namespace") == namespace)
    # claimwarden's last write releasing a claim of the namespace came before the eviction of the pod without one.
    releases = sorted(e["stageTimestamp"] for e in events if e.get("stage") == "ResponseComplete"
                      and (e.get("user") or {}).get("username") == CLAIMWARDEN_USER and e.get("verb") in WRITE_VERBS
                      and (e.get("objectRef") or {}).get("resource") == "resourceclaims"
                      and e["objectRef"].get("namespace") == namespace)
    assert releases and releases[-1] < evictions[-1][0], (releases[-1:], evictions[-1])
    # Released: the generated claim gone, the standalone one unreserved and deallocated; nothing left Terminating.
    claims = resource.list_namespaced_resource_claim(namespace).items
    assert [c.metadata.name for c in claims] == ["shared"]
    assert not claims[0].status or (claims[0].status.allocation is None and not claims[0].status.reserved_for)
    assert not core.list_namespaced_pod(namespace).items
    assert not core.read_node(NODE).spec.unschedulable  # not cordoned
