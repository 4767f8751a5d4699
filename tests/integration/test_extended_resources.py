"""Extended resources backed by DRA (KEP-5004) and device taints on Kubernetes 1.37 (and 1.36), where
DRAExtendedResource is GA, DeviceTaintRule is served at resource.k8s.io/v1 and upstream's
device-taint-eviction controller runs by default.

A DeviceClass with `spec.extendedResourceName` lets a pod ask for `example.com/gpu` in its limits;
the scheduler creates one special claim for the pod and names it in
`status.extendedResourceClaimStatus`. Its release, deletion and evictions are claimwarden's when it
replaces kube-controller-manager's resourceclaim controller (the lab's default), and must then match
what that controller does (`upstream_claims=True`).

The labs are always 1.37 (one test 1.36, where DRAExtendedResource is beta and on by default),
whatever $CLAIMWARDEN_KUBERNETES says: without their binaries these tests fail.
"""

from __future__ import annotations

import datetime
import ssl
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from claimwarden_lab.cluster import LabState
from claimwarden_lab.driver import DRIVER

from .auditor import Rules, _get, _is_eviction, audit_events, read_from
from .conftest import extra_lab, service_account_kubeconfig
from .health_helpers import events, mark, record_for, unmark, wait_gone
from .helpers import pod_with_claims, taint_rule_version, template, wait_for
from .operator import Operator

KUBERNETES = "1.37"
EXTENDED = "example.com/gpu"
EXTENDED_CLASS = "gpu-extended.example.com"
EXTENDED_ANNOTATION = "resource.kubernetes.io/extended-resource-claim"
DELETE_PROTECTION = "resource.kubernetes.io/delete-protection"
NODE, GPUS = "kwok-node-0", 4
TAINT_KEY = "claimwarden.io/unhealthy"
EVICTED = "EvictedUnhealthyDevice"
# Three tests reuse the lab's four devices, so one device's record lives (and writes its status) more than once.
LAB_RULES = Rules(max_writes=40)


@pytest.fixture(scope="module")
def lab37(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LabState]:
    with extra_lab(tmp_path_factory, LAB_RULES, kubernetes=KUBERNETES, nodes=1, gpus_per_node=GPUS) as state:
        api = config.new_client_from_config(config_file=str(state.kubeconfig))
        try:
            client.ResourceV1Api(api).create_device_class(body=extended_class())
        finally:
            api.close()
        yield state


@pytest.fixture(scope="module")
def claimwarden37(lab37: LabState, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Operator]:
    operator = Operator(service_account_kubeconfig(lab37), tmp_path_factory.mktemp("extended") / "cw.log")
    operator.start()
    yield operator
    assert operator.stop() == 0


def extended_class() -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": EXTENDED_CLASS},
            "spec": {"selectors": [{"cel": {"expression": f"device.driver == '{DRIVER}'"}}],
                     "extendedResourceName": EXTENDED}}


def extended_pod(name: str, count: int = 1) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"terminationGracePeriodSeconds": 0, "restartPolicy": "Never",
                     "containers": [{"name": "ctr", "image": "registry.example/busybox:1",
                                     "resources": {"limits": {EXTENDED: str(count)}}}]}}


def raw_pod(api: client.ApiClient, namespace: str, name: str) -> dict[str, Any] | None:
    try:
        return _get(api, f"/api/v1/namespaces/{namespace}/pods/{name}")
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise


def raw_claim(api: client.ApiClient, namespace: str, name: str) -> dict[str, Any] | None:
    try:
        return _get(api, f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims/{name}")
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise


def running(api: client.ApiClient, namespace: str, name: str, timeout: float = 60) -> dict[str, Any]:
    try:
        return wait_for(f"pod {namespace}/{name} Running", lambda: (
            pod if (pod := raw_pod(api, namespace, name)) and (pod.get("status") or {}).get("phase") == "Running"
            else None), timeout)
    except AssertionError as exc:
        status = (raw_pod(api, namespace, name) or {}).get("status") or {}
        raise AssertionError(f"{exc}; its conditions: {status.get('conditions')}") from None


def extended_claim_of(api: client.ApiClient, namespace: str, pod: str) -> dict[str, Any]:
    """The pod's extended-resource claim, once the scheduler has named it in the pod's status."""
    def named() -> str | None:
        status = (raw_pod(api, namespace, pod) or {}).get("status") or {}
        return (status.get("extendedResourceClaimStatus") or {}).get("resourceClaimName")

    name = wait_for(f"status.extendedResourceClaimStatus of {namespace}/{pod}", named, 30)
    claim = raw_claim(api, namespace, name)
    assert claim is not None, f"claim {namespace}/{name} named by pod {pod} does not exist"
    return claim


def devices_of(claim: dict[str, Any]) -> list[str]:
    return sorted(r["device"] for r in claim["status"]["allocation"]["devices"]["results"])


def gone(api: client.ApiClient, namespace: str, name: str) -> bool:
    return raw_claim(api, namespace, name) is None


# --- run, finish, release: side by side with kube-controller-manager's controller -------------------

def lifecycle(api: client.ApiClient, namespace: str) -> dict[str, Any]:
    """Pods asking for every device of the node one after another: each can run only once the one
    before has released its extended-resource claim. What happened, for comparison."""
    core = client.CoreV1Api(api)
    core.create_namespace(body={"metadata": {"name": namespace}})
    seen: dict[str, Any] = {}
    core.create_namespaced_pod(namespace, body=extended_pod("first", GPUS))
    first = running(api, namespace, "first")
    claim = extended_claim_of(api, namespace, "first")
    meta = claim["metadata"]
    seen["claim"] = {
        "generateName": meta.get("generateName"),
        "annotations": meta.get("annotations"),
        "owner": [(r["kind"], r["name"], r["uid"] == first["metadata"]["uid"], r.get("controller"))
                  for r in meta.get("ownerReferences") or []],
        "finalizers": meta.get("finalizers"),
        "reservedFor": [(e.get("resource"), e["name"]) for e in claim["status"].get("reservedFor") or []],
        "devices": devices_of(claim),
    }
    core.create_namespaced_pod(namespace, body=extended_pod("second", GPUS))
    time.sleep(3)
    second = raw_pod(api, namespace, "second") or {}
    seen["second waits"] = not (second.get("spec") or {}).get("nodeName")

    # The kubelet's part (kwok plays it): the pod finishes. Its claim is released and deleted while
    # the pod object stays, and the devices go to the waiting pod.
    finished = time.monotonic()
    core.patch_namespaced_pod_status("first", namespace, {"status": {"phase": "Succeeded"}})
    wait_for("the finished pod's claim deleted", lambda: gone(api, namespace, meta["name"]), 60, 0.1)
    released = time.monotonic() - finished
    seen["finished pod kept"] = raw_pod(api, namespace, "first") is not None
    running(api, namespace, "second")
    print(f"{namespace}: claim deleted {released:.2f} s after its pod Succeeded, the waiting pod Running after "
          f"{time.monotonic() - finished:.2f} s")
    second_claim = extended_claim_of(api, namespace, "second")
    seen["second devices"] = devices_of(second_claim)

    # A deleted pod's claim goes too (the garbage collector, after the reservation is dropped).
    core.delete_namespaced_pod("second", namespace, grace_period_seconds=0)
    wait_for("the deleted pod's claim deleted", lambda: gone(api, namespace, second_claim["metadata"]["name"]), 60)
    core.delete_namespaced_pod("first", namespace, grace_period_seconds=0)
    wait_for("no claim left", lambda: not client.ResourceV1Api(api).list_namespaced_resource_claim(namespace).items,
             30)
    core.delete_namespace(namespace)
    return seen


def test_extended_resource_claims_are_released_and_deleted_as_upstream_does(
        lab37: LabState, claimwarden37: Operator, tmp_path_factory: pytest.TempPathFactory) -> None:
    api = config.new_client_from_config(config_file=str(lab37.kubeconfig))
    try:
        ours = lifecycle(api, "extended-claimwarden")
    finally:
        api.close()
    assert ours["claim"]["annotations"] == {EXTENDED_ANNOTATION: "true"}
    assert ours["claim"]["owner"] == [("Pod", "first", True, True)]
    assert ours["claim"]["finalizers"] == [DELETE_PROTECTION]
    assert ours["claim"]["reservedFor"] == [("pods", "first")]
    assert ours["claim"]["devices"] == ours["second devices"] == [f"gpu-{i}" for i in range(GPUS)]
    assert ours["second waits"] and ours["finished pod kept"]
    assert "removed reservations for first; deallocated" in claimwarden37.log_tail(400)

    with extra_lab(tmp_path_factory, kubernetes=KUBERNETES, nodes=1, gpus_per_node=GPUS,
                   upstream_claims=True) as upstream_lab:
        api = config.new_client_from_config(config_file=str(upstream_lab.kubeconfig))
        try:
            client.ResourceV1Api(api).create_device_class(body=extended_class())
            theirs = lifecycle(api, "extended-upstream")
        finally:
            api.close()
    assert ours == theirs


def test_on_1_36_too_where_extended_resources_are_beta_and_on_by_default(
        tmp_path_factory: pytest.TempPathFactory) -> None:
    seen = {}
    for kind, options in (("claimwarden", {}), ("upstream", {"upstream_claims": True})):
        with extra_lab(tmp_path_factory, kubernetes="1.36", nodes=1, gpus_per_node=GPUS, **options) as lab:
            operator = None
            if kind == "claimwarden":
                operator = Operator(service_account_kubeconfig(lab), tmp_path_factory.mktemp("ext136") / "cw.log")
                operator.start()
            api = config.new_client_from_config(config_file=str(lab.kubeconfig))
            try:
                client.ResourceV1Api(api).create_device_class(body=extended_class())
                seen[kind] = lifecycle(api, f"extended-{kind}")
            finally:
                api.close()
                if operator is not None:
                    assert operator.stop() == 0
    assert seen["claimwarden"] == seen["upstream"]
    assert seen["claimwarden"]["claim"]["annotations"] == {EXTENDED_ANNOTATION: "true"}
    assert seen["claimwarden"]["second waits"] and seen["claimwarden"]["finished pod kept"]


# --- evictions: a pod of each kind, upstream's eviction controller running --------------------------

def evictions(state: LabState) -> Counter[tuple[str, str]]:
    """Successful evictions (pods/eviction, 201) per pod over the lab's life, from its audit log."""
    lines, _ = read_from(state.audit_log, 0)
    counted: Counter[tuple[str, str]] = Counter()
    for event in audit_events(lines):
        if _is_eviction(event) and (event.get("responseStatus") or {}).get("code") == 201:
            ref = event.get("objectRef") or {}
            counted[(ref.get("namespace"), ref.get("name"))] += 1
    return counted


def kcm_metric(state: LabState, name: str) -> float:
    """A kube-controller-manager counter (its /metrics needs no credentials in the lab)."""
    context = ssl.create_default_context()
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    port = state.ports["controller-manager"]
    with urllib.request.urlopen(f"https://127.0.0.1:{port}/metrics", context=context, timeout=10) as response:
        text = response.read().decode()
    values = [float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name)]
    assert values or f"# HELP {name}" in text, f"kube-controller-manager serves no {name}: is its controller off?"
    return sum(values)


def test_a_pod_of_each_kind_is_evicted_once_beside_upstreams_eviction_controller(
        lab37: LabState, claimwarden37: Operator) -> None:
    api = config.new_client_from_config(config_file=str(lab37.kubeconfig))
    core, resource = client.CoreV1Api(api), client.ResourceV1Api(api)
    custom = client.CustomObjectsApi(api)
    namespace = "evict-both-kinds"
    core.create_namespace(body={"metadata": {"name": namespace}})
    marked: list[str] = []
    try:
        resource.create_namespaced_resource_claim_template(namespace, body=template("gpu"))
        core.create_namespaced_pod(namespace, body=pod_with_claims(
            "templated", [{"name": "gpu", "resourceClaimTemplateName": "gpu"}]))
        core.create_namespaced_pod(namespace, body=extended_pod("extended"))
        for pod in ("templated", "extended"):
            running(api, namespace, pod)
        generated = raw_pod(api, namespace, "templated")["status"]["resourceClaimStatuses"][0]["resourceClaimName"]
        claims = {"templated": raw_claim(api, namespace, generated), "extended": extended_claim_of(api, namespace,
                                                                                                    "extended")}
        deletions_before = kcm_metric(lab37, "device_taint_eviction_controller_pod_deletions_total")

        for pod, claim in claims.items():
            assert claim is not None
            device = devices_of(claim)[0]
            marked.append(device)
            mark(api, NODE, device, reason=f"{pod} test")
        for pod in claims:
            wait_gone(api, namespace, pod, 60)

        counted = evictions(lab37)
        assert counted[(namespace, "templated")] == 1 and counted[(namespace, "extended")] == 1, counted
        for pod in claims:
            wait_for(f"one eviction Event on {pod}", lambda pod=pod: len(events(api, namespace, pod, EVICTED)) == 1)
            assert not events(api, namespace, pod, "DeviceTaintManagerEviction")
        # claimwarden's DeviceTaintRules are served at v1 here, NoSchedule only; upstream's eviction
        # controller sees them (it writes their status) and evicts nobody for them.
        assert taint_rule_version(api) == "v1"
        for device in marked:
            record = wait_for(f"the record of {device} naming its rule", lambda device=device: (
                r if (r := record_for(api, NODE, device)) and (r.get("status") or {}).get("deviceTaintRule")
                else None), 30)
            rule = custom.get_cluster_custom_object("resource.k8s.io", "v1", "devicetaintrules",
                                                    record["status"]["deviceTaintRule"])
            assert rule["spec"]["taint"] == {"key": TAINT_KEY, "value": rule["spec"]["taint"]["value"],
                                             "effect": "NoSchedule", "timeAdded": rule["spec"]["taint"]["timeAdded"]}
            assert rule["spec"]["deviceSelector"] == {"driver": DRIVER, "pool": NODE, "device": device}
            condition = wait_for(f"upstream's status on rule {rule['metadata']['name']}", lambda name=rule[
                "metadata"]["name"]: next((c for c in (custom.get_cluster_custom_object(
                    "resource.k8s.io", "v1", "devicetaintrules", name).get("status") or {}).get("conditions") or []
                    if c["type"] == "EvictionInProgress"), None), 30)
            assert (condition["status"], condition["reason"]) == ("False", "OtherEffect")
        assert kcm_metric(lab37, "device_taint_eviction_controller_pod_deletions_total") == deletions_before
    finally:
        for device in marked:
            unmark(api, NODE, device)
        for device in marked:
            wait_for(f"record of {device} gone", lambda device=device: record_for(api, NODE, device) is None, 30)
        core.delete_namespace(namespace)
        wait_for(f"namespace {namespace} gone", lambda: namespace not in {
            n.metadata.name for n in core.list_namespace().items}, 60)
        api.close()


# --- tolerations: on a server that copies them, the allocation results are the truth ----------------

def tolerating(seconds: int | None = None) -> dict[str, Any]:
    toleration: dict[str, Any] = {"key": TAINT_KEY, "operator": "Exists", "effect": "NoExecute"}
    if seconds is not None:
        toleration["tolerationSeconds"] = seconds
    return toleration


def claim_spec(tolerations: list[dict[str, Any]]) -> dict[str, Any]:
    exactly: dict[str, Any] = {"deviceClassName": DRIVER}
    if tolerations:
        exactly["tolerations"] = tolerations
    return {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}


def allocate(resource: client.ResourceV1Api, namespace: str, name: str, device: str,
             tolerations: list[dict[str, Any]]) -> None:
    """Allocate a user claim as an allocator other than kube-scheduler would (the quarantine claims'
    way): the result carries exactly the given tolerations, whatever the request says."""
    result: dict[str, Any] = {"request": "gpu", "driver": DRIVER, "pool": NODE, "device": device}
    if tolerations:
        result["tolerations"] = tolerations
    # With binding conditions (on by default in 1.37) the scheduler stamps an allocation that has no
    # allocationTimestamp when it reserves the claim, which the apiserver refuses (an allocation is
    # immutable): an allocator must set it.
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    resource.patch_namespaced_resource_claim_status(name, namespace, {"status": {"allocation": {
        "allocationTimestamp": stamp,
        "devices": {"results": [result]},
        "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
            {"key": "metadata.name", "operator": "In", "values": [NODE]}]}]}}}})


def test_results_tolerations_are_what_is_read_where_the_server_copies_them(
        lab37: LabState, claimwarden37: Operator) -> None:
    api = config.new_client_from_config(config_file=str(lab37.kubeconfig))
    core, resource = client.CoreV1Api(api), client.ResourceV1Api(api)
    namespace = "results-tolerations"
    core.create_namespace(body={"metadata": {"name": namespace}})
    marked: list[str] = []
    try:
        # Allocated by kube-scheduler: 1.37 copies the request's toleration into the result.
        resource.create_namespaced_resource_claim_template(namespace, body=template("forever",
                                                                                    claim_spec([tolerating()])))
        core.create_namespaced_pod(namespace, body=pod_with_claims(
            "stubborn", [{"name": "gpu", "resourceClaimTemplateName": "forever"}]))
        running(api, namespace, "stubborn")
        generated = raw_pod(api, namespace, "stubborn")["status"]["resourceClaimStatuses"][0]["resourceClaimName"]
        scheduled = raw_claim(api, namespace, generated)
        assert scheduled is not None
        assert scheduled["status"]["allocation"]["devices"]["results"][0]["tolerations"] == [tolerating()]

        # Allocated by someone else: the request tolerates forever, its result carries nothing (as
        # upstream's eviction controller sees it, nothing protects the pod); and the other way round.
        free = sorted(set(f"gpu-{i}" for i in range(GPUS)) - set(devices_of(scheduled)))
        for claim, request, result, device in (("exposed", [tolerating()], [], free[0]),
                                               ("covered", [], [tolerating()], free[1])):
            resource.create_namespaced_resource_claim(namespace, body={
                "metadata": {"name": claim}, "spec": claim_spec(request)})
            allocate(resource, namespace, claim, device, result)
            core.create_namespaced_pod(namespace, body=pod_with_claims(claim, [{"name": "gpu",
                                                                               "resourceClaimName": claim}]))
        for pod in ("exposed", "covered"):
            running(api, namespace, pod)
        for device in (devices_of(scheduled)[0], free[0], free[1]):
            marked.append(device)
            mark(api, NODE, device, reason="tolerations from results")
        wait_gone(api, namespace, "exposed", 60)
        time.sleep(4)
        for pod in ("stubborn", "covered"):
            still = raw_pod(api, namespace, pod) or {}
            assert not still.get("metadata", {}).get("deletionTimestamp"), f"{pod} was evicted"
            assert (still.get("status") or {}).get("phase") == "Running"
            assert not events(api, namespace, pod, EVICTED)
        assert evictions(lab37)[(namespace, "exposed")] == 1
        assert "allocation results carry tolerations" in claimwarden37.log_tail(800)
    finally:
        for device in marked:
            unmark(api, NODE, device)
        for device in marked:
            wait_for(f"record of {device} gone", lambda device=device: record_for(api, NODE, device) is None, 30)
        core.delete_namespace(namespace)
        wait_for(f"namespace {namespace} gone", lambda: namespace not in {
            n.metadata.name for n in core.list_namespace().items}, 60)
        api.close()
