"""PodGroup reservations (KEP-5729) on Kubernetes 1.37 with the gates: one claim per PodGroup, one
reservedFor entry however many pods share it, released when the PodGroup goes.

PodGroups exist only from 1.36 on, so this module always starts its own labs (`extra_lab(...,
kubernetes="1.37")`, and "1.36" for the side-by-side comparison), whatever $CLAIMWARDEN_KUBERNETES the
rest of the suite runs: the file means the same in every run, and fails (never skips) when those
binaries or the gates are missing.
Marked `podgroups` so that a run can select or leave it out (`-m podgroups`, `-m "not podgroups"`).
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from claimwarden_lab import disruptions
from claimwarden_lab.cluster import LabState

from .conftest import extra_lab, service_account_kubeconfig
from .helpers import create_pods, delete_pods, gpu_claim_spec, pod_with_claims, template, wait_for
from .operator import Operator

pytestmark = pytest.mark.podgroups

KUBERNETES = "1.37"
GATES = "GenericWorkload=true,DRAWorkloadResourceClaims=true"  # the lab's podgroups preset turns them on
GROUP, VERSION, PLURAL = "scheduling.k8s.io", "v1beta1", "podgroups"
PROTECTION_FINALIZER = "scheduling.k8s.io/podgroup-protection"
GENERATED = re.compile(r"^(?P<base>.+)-[a-z0-9]{5}$")


# --- raw JSON access (the client's models predate spec.schedulingGroup and PodGroups) -------------

def _pods(api: client.ApiClient, namespace: str) -> list[dict[str, Any]]:
    response = client.CoreV1Api(api).list_namespaced_pod(namespace, _preload_content=False)
    return list(json.loads(response.data)["items"])


def _claims(api: client.ApiClient, namespace: str) -> list[dict[str, Any]]:
    return list(client.CustomObjectsApi(api).list_namespaced_custom_object(
        "resource.k8s.io", "v1", namespace, "resourceclaims")["items"])


def _podgroup(api: client.ApiClient, namespace: str, name: str, version: str = VERSION) -> dict[str, Any] | None:
    try:
        found: dict[str, Any] = client.CustomObjectsApi(api).get_namespaced_custom_object(
            GROUP, version, namespace, PLURAL, name)
        return found
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise


def _create_podgroup(api: client.ApiClient, namespace: str, name: str, claims: list[dict[str, str]],
                     version: str = VERSION) -> dict[str, Any]:
    body = {"apiVersion": f"{GROUP}/{version}", "kind": "PodGroup", "metadata": {"name": name},
            "spec": {"schedulingPolicy": {"basic": {}}, "resourceClaims": claims}}
    created: dict[str, Any] = client.CustomObjectsApi(api).create_namespaced_custom_object(
        GROUP, version, namespace, PLURAL, body)
    # Without DRAWorkloadResourceClaims the apiserver drops the field: fail here with the reason.
    assert created["spec"].get("resourceClaims") == claims, \
        f"the apiserver dropped PodGroup.spec.resourceClaims (is {GATES} on?): {created['spec']}"
    return created


def _member(name: str, group: str, claims: list[dict[str, str]]) -> dict[str, Any]:
    body = pod_with_claims(name, claims)
    body["spec"]["schedulingGroup"] = {"podGroupName": group}
    return body


def _setup_namespace(api: client.ApiClient, namespace: str) -> None:
    client.CoreV1Api(api).create_namespace(body={"metadata": {"name": namespace}})
    client.ResourceV1Api(api).create_namespaced_resource_claim_template(namespace, body=template(
        "gpu", labels={"team": "a"}, annotations={"example.com/note": "from the template"}))


def _group_entry(podgroup: dict[str, Any]) -> dict[str, str]:
    return {"apiGroup": GROUP, "resource": PLURAL, "name": podgroup["metadata"]["name"],
            "uid": podgroup["metadata"]["uid"]}


def _api(state: LabState) -> client.ApiClient:
    return config.new_client_from_config(config_file=str(state.kubeconfig))


def _serves_podgroups(api: client.ApiClient, version: str = VERSION) -> None:
    try:
        resources = client.CustomObjectsApi(api).get_api_resources(GROUP, version)
    except ApiException as exc:
        raise AssertionError(f"the lab does not serve {GROUP}/{version} (runtime-config "
                             f"{GROUP}/{version}=true?): {exc.status}") from None
    assert any(r.name == PLURAL for r in resources.resources), f"{GROUP}/{version} serves no {PLURAL}"


# --- 1,000 pods, one claim ----------------------------------------------------------------------

PODS = 1000


@pytest.fixture(scope="module")
def big_lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LabState]:
    # One node with one device: every pod must run where the device is (the node takes 1000 pods),
    # so all of them really share one allocated device.
    with extra_lab(tmp_path_factory, kubernetes=KUBERNETES, nodes=1, gpus_per_node=1, presets="podgroups") as state:
        yield state


def test_1000_pods_of_one_podgroup_share_one_claim_released_when_the_podgroup_and_its_pods_go(
        big_lab: LabState, tmp_path_factory: pytest.TempPathFactory) -> None:
    api = _api(big_lab)
    _serves_podgroups(api)
    namespace = "team"
    _setup_namespace(api, namespace)
    operator = Operator(service_account_kubeconfig(big_lab), tmp_path_factory.mktemp("pg") / "claimwarden.log")
    operator.start()
    try:
        uses = [{"name": "gpu", "resourceClaimTemplateName": "gpu"}]
        podgroup = _create_podgroup(api, namespace, "team", uses)
        started = time.monotonic()
        create_pods(api, namespace, [_member(f"pod-{i:04d}", "team", uses) for i in range(PODS)])
        created = time.monotonic() - started
        running = wait_for(f"{PODS} pods running", lambda: (lambda pods: pods if sum(
            1 for p in pods if (p.get("status") or {}).get("phase") == "Running") == PODS else None)(
            _pods(api, namespace)), 900, interval=5)
        elapsed = time.monotonic() - started
        print(f"{PODS} pods of one PodGroup: created in {created:.0f} s, all running after {elapsed:.0f} s")

        [claim] = _claims(api, namespace)
        name = claim["metadata"]["name"]
        match = GENERATED.match(name)
        assert match and match.group("base") == "team-gpu", name
        assert [(r["kind"], r["name"], r["uid"], r.get("controller")) for r in claim["metadata"]["ownerReferences"]] \
            == [("PodGroup", "team", podgroup["metadata"]["uid"], True)]
        assert claim["status"]["reservedFor"] == [_group_entry(podgroup)]
        assert len(claim["status"]["allocation"]["devices"]["results"]) == 1
        recorded = [{"name": "gpu", "resourceClaimName": name}]
        unrecorded = [p["metadata"]["name"] for p in running
                      if (p.get("status") or {}).get("resourceClaimStatuses") != recorded]
        assert unrecorded == [], f"{len(unrecorded)} pods do not record the group's claim, e.g. {unrecorded[:3]}"
        group = _podgroup(api, namespace, "team")
        assert group is not None
        assert group["status"]["resourceClaimStatuses"] == [{"name": "gpu", "resourceClaimName": name}]
        assert "claimwarden_claim_creations_total{result=\"success\"} 1.0" in operator.metrics()

        # Deleting the PodGroup while its pods run: the podgroup-protection finalizer keeps it, and the
        # claim stays reserved for it (upstream drops the entry only once the PodGroup is really gone).
        assert PROTECTION_FINALIZER in group["metadata"].get("finalizers", [])
        client.CustomObjectsApi(api).delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "team")
        time.sleep(10)
        deleting = _podgroup(api, namespace, "team")
        assert deleting is not None and deleting["metadata"].get("deletionTimestamp")
        [claim] = _claims(api, namespace)
        assert claim["status"]["reservedFor"] == [_group_entry(podgroup)] and claim["status"].get("allocation")

        # Once its pods are done the PodGroup goes, the reservation with it, and the garbage collector
        # deletes the claim the PodGroup owned.
        delete_pods(api, namespace, [p["metadata"]["name"] for p in running], workers=16)
        wait_for("the PodGroup gone once its pods are", lambda: _podgroup(api, namespace, "team") is None, 300)
        wait_for("the PodGroup's claim released and deleted", lambda: not _claims(api, namespace), 120)
        assert "Traceback" not in Path(operator.log_path).read_text()
    finally:
        # With claimwarden still running: it removes the claims' delete-protection finalizers.
        client.CoreV1Api(api).delete_namespace(namespace)
        wait_for("the namespace gone", lambda: namespace not in {
            n.metadata.name for n in client.CoreV1Api(api).list_namespace().items}, 300, interval=2)
        operator.stop()
        api.close()


def _events(api: client.ApiClient, namespace: str, name: str) -> list[tuple[str, str, str]]:
    return [(e.type, e.reason, e.message) for e in client.CoreV1Api(api).list_namespaced_event(
        namespace, field_selector=f"involvedObject.name={name}").items]


@pytest.mark.audit(expect_log=[r"PodGroup \"late\" not found", r"resource claim template \"late-gpu\""],
                   reason="the test provokes both retried problems on purpose")
def test_a_missing_podgroup_or_template_gets_a_clear_event_and_the_claim_comes_once_they_exist(
        big_lab: LabState, tmp_path_factory: pytest.TempPathFactory) -> None:
    api = _api(big_lab)
    namespace = "late"
    client.CoreV1Api(api).create_namespace(body={"metadata": {"name": namespace}})
    operator = Operator(service_account_kubeconfig(big_lab), tmp_path_factory.mktemp("late") / "claimwarden.log")
    operator.start()
    try:
        uses = [{"name": "gpu", "resourceClaimTemplateName": "late-gpu"}]
        create_pods(api, namespace, [_member("pod-0", "late", uses)])
        warning = wait_for("a Warning Event on the pod", lambda: [e for e in _events(api, namespace, "pod-0")
                                                                  if e[1] == "FailedResourceClaimCreation"], 60)
        assert warning[0][0] == "Warning"
        assert warning[0][2] == ('PodResourceClaim gpu: PodGroup "late" not found; '
                                 "its claims are generated once it exists"), warning
        # Like upstream, nothing is generated per pod while the PodGroup is missing.
        assert _claims(api, namespace) == []

        _create_podgroup(api, namespace, "late", uses)
        warning = wait_for("a Warning Event on the PodGroup", lambda: [
            e for e in _events(api, namespace, "late") if e[1] == "FailedResourceClaimCreation"], 60)
        assert warning[0][2] == ('PodGroupResourceClaim gpu: resource claim template "late-gpu": '
                                 'resourceclaimtemplate.resource.k8s.io "late-gpu" not found'), warning
        assert _claims(api, namespace) == []

        client.ResourceV1Api(api).create_namespaced_resource_claim_template(namespace, body=template("late-gpu"))
        [claim] = wait_for("the group's claim", lambda: _claims(api, namespace), 30)
        wait_for("the pod records it", lambda: (_pods(api, namespace)[0].get("status") or {}).get(
            "resourceClaimStatuses") == [{"name": "gpu", "resourceClaimName": claim["metadata"]["name"]}], 30)
        wait_for("the pod running on the group's reservation", lambda: (
            _pods(api, namespace)[0].get("status") or {}).get("phase") == "Running", 60)
        [claim] = _claims(api, namespace)
        assert [r["resource"] for r in claim["status"]["reservedFor"]] == [PLURAL]
    finally:
        # With claimwarden still running: it removes the claims' delete-protection finalizers.
        client.CoreV1Api(api).delete_namespace(namespace)
        wait_for("the namespace gone", lambda: namespace not in {
            n.metadata.name for n in client.CoreV1Api(api).list_namespace().items}, 300, interval=2)
        operator.stop()
        api.close()


# --- a PodGroup version the server stops serving while claimwarden runs ----------------------------

ALPHA_ONLY = "scheduling.k8s.io/v1beta1=false,scheduling.k8s.io/v1alpha3=true"
BETA_ONLY = "scheduling.k8s.io/v1beta1=true,scheduling.k8s.io/v1alpha3=false"


@pytest.mark.audit(expect_log=[r"Request attempt #\d+/\d+ failed",
                               r"Watcher for podgroups\.v1alpha3\.scheduling\.k8s\.io@none has failed",
                               r"Multidimensional multitasker has failed",
                               # Either Kopf ends the process itself (kopf.run raises) or the timer does:
                               r"Kopf had not ended the process 30 s after the clean-up; exiting",
                               r"Kopf stopped on an error \(APINotFoundError"],
                   reason="the apiserver restarts, and Kopf's watch of the dropped version fails on purpose")
def test_a_podgroup_version_dropped_while_claimwarden_runs_stops_it_and_its_restart_keeps_the_reservation(
        tmp_path_factory: pytest.TempPathFactory) -> None:
    """An upgrade that drops the PodGroup version claimwarden watches (here v1alpha3; the apiserver then
    serves v1beta1): Kopf's watch of it fails, its orchestrator stops, and claimwarden exits (it stayed up
    with no controller running before EXIT_AFTER_CLEANUP, runtime/ending.py); the restarted claimwarden (a
    Deployment's pod is restarted) watches v1beta1 and keeps the reservation of a PodGroup made meanwhile. The
    "not served" answers themselves are tested in test_kube_errors.py and tests/unit/test_reservations_release.py:
    here Kopf stops claimwarden before they matter."""
    with extra_lab(tmp_path_factory, kubernetes=KUBERNETES, nodes=1, gpus_per_node=2, presets="podgroups",
                   runtime_config=ALPHA_ONLY) as state:
        api = _api(state)
        _serves_podgroups(api, "v1alpha3")
        namespace = "upgraded"
        client.CoreV1Api(api).create_namespace(body={"metadata": {"name": namespace}})
        client.ResourceV1Api(api).create_namespaced_resource_claim(namespace, body={
            "metadata": {"name": "shared"}, "spec": gpu_claim_spec()})
        log_path = tmp_path_factory.mktemp("upgraded") / "claimwarden.log"
        # No leader election: the restart outlasts a lease, and claimwarden would exit for that instead.
        operator = Operator(service_account_kubeconfig(state), log_path, extra=["--leader-elect=false"])
        operator.start()
        try:
            assert "PodGroups: scheduling.k8s.io/v1alpha3" in log_path.read_text()
            disruptions.restart_apiserver(state, say=lambda line: print(f"lab: {line}"), runtime_config=BETA_ONLY)
            api.close()
            api = _api(state)
            _serves_podgroups(api, VERSION)
            wait_for("claimwarden exited", lambda: not operator.running, 120, interval=1)
            assert operator.proc is not None and operator.proc.returncode == 1, operator.log_tail()
            operator.stop()

            uses = [{"name": "shared", "resourceClaimName": "shared"}]
            podgroup = _create_podgroup(api, namespace, "team", uses)
            create_pods(api, namespace, [_member("pod-0", "team", uses)])
            wait_for("the pod running on the group's reservation", lambda: (
                _pods(api, namespace)[0].get("status") or {}).get("phase") == "Running", 120)
            operator.start()
            assert "PodGroups: scheduling.k8s.io/v1beta1" in log_path.read_text()
            deadline = time.monotonic() + 15
            while time.monotonic() < deadline:
                [claim] = _claims(api, namespace)
                status = claim.get("status") or {}
                assert status.get("reservedFor") == [_group_entry(podgroup)] and status.get("allocation"), status
                time.sleep(1)
        finally:
            # With claimwarden running: it removes the claim's delete-protection finalizer.
            operator.start()
            client.CoreV1Api(api).delete_namespace(namespace)
            wait_for("the namespace gone", lambda: namespace not in {
                n.metadata.name for n in client.CoreV1Api(api).list_namespace().items}, 300, interval=2)
            operator.stop()
            api.close()


# --- side by side with kube-controller-manager's controller --------------------------------------

def _shape(api: client.ApiClient, namespace: str, version: str) -> dict[str, Any]:
    """The claims, pod statuses and PodGroup statuses with generated suffixes and UIDs taken out."""
    claims = _claims(api, namespace)
    uids = {}
    for obj in [*claims, *_pods(api, namespace)]:
        uids[obj["metadata"]["uid"]] = f"{obj.get('kind', 'Pod')}/{obj['metadata']['name']}"
    group = _podgroup(api, namespace, "team", version)
    if group is not None:
        uids[group["metadata"]["uid"]] = "PodGroup/team"

    def base(name: str) -> str:
        match = GENERATED.match(name)
        return f"{match.group('base')}-<5>" if match and name not in ("shared",) else name

    shaped_claims = {}
    for claim in claims:
        meta = claim["metadata"]
        shaped_claims[base(meta["name"])] = {
            # Per-pod claims: kube-controller-manager stopped setting blockOwnerDeletion on the pod owner
            # in 1.35 and claimwarden still sets it as 1.34 does; that is the per-pod claims' matter, not
            # PodGroups', so it is left out here (PodGroup owners are compared whole).
            "owners": [{**{k: v for k, v in r.items() if k != "uid"
                           and not (k == "blockOwnerDeletion" and r.get("kind") == "Pod")},
                        "uid": uids.get(r["uid"], "?")}
                       for r in meta.get("ownerReferences") or []],
            "annotations": meta.get("annotations") or {},
            "labels": meta.get("labels") or {},
            "finalizers": meta.get("finalizers") or [],
            "reservedFor": sorted(f"{r.get('apiGroup', '')}/{r['resource']}/{r['name']}"
                                  for r in (claim.get("status") or {}).get("reservedFor") or []),
            "allocated": bool((claim.get("status") or {}).get("allocation")),
        }
    pods = {p["metadata"]["name"]: sorted((s["name"], base(s.get("resourceClaimName") or ""))
                                          for s in (p.get("status") or {}).get("resourceClaimStatuses") or [])
            for p in _pods(api, namespace)}
    statuses = sorted((s["name"], base(s.get("resourceClaimName") or ""))
                      for s in ((group or {}).get("status") or {}).get("resourceClaimStatuses") or [])
    return {"claims": shaped_claims, "pods": pods, "podgroup": statuses if group is not None else None}


def _scenario(state: LabState, tmp_path_factory: pytest.TempPathFactory, *, with_claimwarden: bool,
              version: str) -> list[dict[str, Any]]:
    """Three pods of PodGroup `team`: one group claim from a template, one group claim by name, one
    per-pod claim; then the pods go, then the PodGroup. The shape after each step."""
    api = _api(state)
    _serves_podgroups(api, version)
    namespace = "side"
    _setup_namespace(api, namespace)
    client.ResourceV1Api(api).create_namespaced_resource_claim(namespace, body={
        "metadata": {"name": "shared"}, "spec": gpu_claim_spec()})
    operator = None
    if with_claimwarden:
        operator = Operator(service_account_kubeconfig(state), tmp_path_factory.mktemp("side") / "claimwarden.log")
        operator.start()
    shapes = []
    try:
        group_claims = [{"name": "gpu", "resourceClaimTemplateName": "gpu"},
                        {"name": "shared", "resourceClaimName": "shared"}]
        _create_podgroup(api, namespace, "team", group_claims, version)
        uses = [*group_claims, {"name": "own", "resourceClaimTemplateName": "gpu"}]
        names = [f"pod-{i}" for i in range(3)]
        create_pods(api, namespace, [_member(n, "team", uses) for n in names])

        def settled() -> dict[str, Any] | None:
            # The shape reads the claims before the pods: a pod seen Running may have a claim read just
            # before the scheduler allocated it, so every claim must be allocated and reserved too.
            shape = _shape(api, namespace, version)
            running = sum(1 for p in _pods(api, namespace) if (p.get("status") or {}).get("phase") == "Running")
            claims = shape["claims"].values()
            complete = len(claims) == 5 and all(c["allocated"] and c["reservedFor"] for c in claims)
            return shape if running == 3 and complete else None

        shapes.append(wait_for("3 pods running with 5 claims", settled, 120, interval=1))
        delete_pods(api, namespace, names)
        wait_for("the pods gone", lambda: not _pods(api, namespace), 120)
        # The per-pod claims go (the garbage collector, slower under load than any fixed sleep); then what
        # stays must stay.
        wait_for("the per-pod claims gone", lambda: not any(
            c["metadata"]["name"].startswith("pod-") for c in _claims(api, namespace)), 120)
        time.sleep(5)
        shapes.append(_shape(api, namespace, version))
        client.CustomObjectsApi(api).delete_namespaced_custom_object(GROUP, version, namespace, PLURAL, "team")
        wait_for("the PodGroup gone", lambda: _podgroup(api, namespace, "team", version) is None, 120)
        wait_for("the shared claim released", lambda: not any(
            c["metadata"]["name"] == "shared" and (c.get("status") or {}).get("reservedFor")
            for c in _claims(api, namespace)) and len(_claims(api, namespace)) == 1, 120)
        time.sleep(5)
        shapes.append(_shape(api, namespace, version))
        client.CoreV1Api(api).delete_namespace(namespace)
        wait_for("the namespace gone", lambda: namespace not in {
            n.metadata.name for n in client.CoreV1Api(api).list_namespace().items}, 120, interval=2)
    finally:
        if operator is not None:
            operator.stop()
        api.close()
    return shapes


# On 1.37.2, kube-controller-manager's own controller gave the three pods no claims within 120 s in
# about half of the fresh labs here (3 of 6 runs; claimwarden's half was never reached; the cause, at
# KCM's --v=1, was not found), so this comparison runs in `make test-matrix` only; 1.36 runs everywhere.
@pytest.mark.parametrize(("kubernetes", "version"), [
    pytest.param(KUBERNETES, VERSION, marks=pytest.mark.matrix_only), ("1.36", "v1alpha2")])
def test_podgroup_claims_have_the_shape_kube_controller_managers_controller_gives_them(
        tmp_path_factory: pytest.TempPathFactory, kubernetes: str, version: str) -> None:
    """The same scenario under kube-controller-manager's controller and under claimwarden, on 1.37
    (PodGroups at v1beta1) and 1.36 (v1alpha2, where the gates are alpha)."""
    options = {"kubernetes": kubernetes, "nodes": 1, "gpus_per_node": 8, "presets": "podgroups"}
    with extra_lab(tmp_path_factory, upstream_claims=True, **options) as state:
        upstream = _scenario(state, tmp_path_factory, with_claimwarden=False, version=version)
    with extra_lab(tmp_path_factory, **options) as state:
        ours = _scenario(state, tmp_path_factory, with_claimwarden=True, version=version)
    running, _, _ = upstream
    # What upstream does, stated once so that a change on either side shows up in this file.
    gpu = running["claims"]["team-gpu-<5>"]
    assert gpu["owners"] == [{"apiVersion": f"{GROUP}/{version}", "kind": "PodGroup", "name": "team",
                              "controller": True, "uid": "PodGroup/team"}]
    assert gpu["annotations"] == {"example.com/note": "from the template",
                                  "resource.kubernetes.io/pod-claim-name": "gpu"}
    assert gpu["reservedFor"] == [f"{GROUP}/{PLURAL}/team"]
    assert running["claims"]["shared"]["reservedFor"] == [f"{GROUP}/{PLURAL}/team"]
    assert running["podgroup"] == [("gpu", "team-gpu-<5>")]
    for step, (theirs, mine) in enumerate(zip(upstream, ours, strict=True)):
        assert mine == theirs, f"step {step}: claimwarden {mine} != kube-controller-manager {theirs}"
