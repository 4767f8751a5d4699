"""The blast-radius breaker in a 20-node lab, and the admission policy that makes approvals honest.

docs/concepts/safety.md. claimwarden runs with its defaults here
(`--breaker-max-fraction=0.3`, `--eviction-qps=10 --eviction-burst=20`).
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from claimwarden_lab.cluster import LabState

from .conftest import extra_lab, service_account_kubeconfig
from .health_helpers import GROUP, PLURAL, PREFIX, VERSION, annotate, create_record, delete_record, records
from .helpers import create_pods, pod_with_claims, template, wait_for
from .operator import Operator

DRIVER = "gpu.example.com"
APPROVAL, APPROVED_GENERATION = "claimwarden.io/approved-by", "claimwarden.io/approved-generation"
NAMESPACE = "breaker"


@pytest.fixture(scope="module")
def big_lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LabState]:
    with extra_lab(tmp_path_factory, nodes=20, gpus_per_node=2) as state:
        yield state


def _plugin(lab: LabState, *args: str) -> str:
    """`kubectl claimwarden ARGS` as the lab's admin; its standard output."""
    result = subprocess.run([sys.executable, "-m", "claimwarden", *args, "--kubeconfig", str(lab.kubeconfig)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def whoami(api: client.ApiClient) -> str:
    review = client.AuthenticationV1Api(api).create_self_subject_review(body={})
    return str(review.status.user_info.username)


def _pod_devices(api: client.ApiClient) -> dict[str, tuple[str, str]]:
    """pod name -> (pool, device) of its claim, for the pods of NAMESPACE holding a device."""
    found = {}
    for claim in client.ResourceV1Api(api).list_namespaced_resource_claim(NAMESPACE).items:
        allocation = claim.status.allocation if claim.status else None
        if allocation and claim.status.reserved_for:
            result = allocation.devices.results[0]
            found[claim.status.reserved_for[0].name] = (result.pool, result.device)
    return found


def _running(api: client.ApiClient) -> set[str]:
    pods = client.CoreV1Api(api).list_namespaced_pod(NAMESPACE).items
    return {p.metadata.name for p in pods if p.status.phase == "Running" and not p.metadata.deletion_timestamp}


def _slices(api: client.ApiClient) -> dict[str, str]:
    return {s.spec.pool.name: s.metadata.name for s in client.ResourceV1Api(api).list_resource_slice().items}


def _mark_all(api: client.ApiClient, devices: list[tuple[str, str]], reason: str | None) -> None:
    """One annotation patch per slice, as a script would do."""
    slices = _slices(api)
    by_pool: dict[str, dict[str, str | None]] = {}
    for pool, device in devices:
        by_pool.setdefault(pool, {})[PREFIX + device] = reason
    for pool, wanted in by_pool.items():
        annotate(api, slices[pool], wanted)


def _evicted_total(api: client.ApiClient) -> int:
    return sum(int((r.get("status") or {}).get("podsEvicted") or 0) for r in records(api))


def _paused(api: client.ApiClient) -> list[dict[str, Any]]:
    return [r for r in records(api) if any(c["type"] == "EvictionPaused" and c["status"] == "True"
                                           for c in (r.get("status") or {}).get("conditions") or [])]


def _breaker_gauge(operator: Operator) -> float | None:
    series = f'claimwarden_eviction_breaker_open{{driver="{DRIVER}"}} '
    line = next((line for line in operator.metrics().splitlines() if line.startswith(series)), None)
    return float(line.split()[-1]) if line else None


def _record_of(api: client.ApiClient, pool: str, device: str) -> dict[str, Any]:
    return next(r for r in records(api) if (r["spec"]["pool"], r["spec"]["device"]) == (pool, device))


@pytest.mark.audit(max_writes=30, reason="the 40-pod namespace and the restart add reconciles of every record")
def test_marking_forty_percent_trips_the_breaker_at_thirty_and_approval_and_clearing_resume_and_close(
        big_lab: LabState, tmp_path_factory: pytest.TempPathFactory) -> None:
    api = config.new_client_from_config(config_file=str(big_lab.kubeconfig))
    core, resource = client.CoreV1Api(api), client.ResourceV1Api(api)
    core.create_namespace(body={"metadata": {"name": NAMESPACE}})
    resource.create_namespaced_resource_claim_template(NAMESPACE, body=template("single-gpu"))
    operator = Operator(service_account_kubeconfig(big_lab), tmp_path_factory.mktemp("breaker") / "cw.log")
    operator.start()
    marked: list[tuple[str, str]] = []
    try:
        names = [f"job-{i:02d}" for i in range(40)]
        create_pods(api, NAMESPACE, [pod_with_claims(n, [{"name": "gpu", "resourceClaimTemplateName": "single-gpu"}])
                                     for n in names])
        wait_for("40 pods running", lambda: len(_running(api)) == 40, 180)
        devices = wait_for("40 devices held", lambda: d if len(d := _pod_devices(api)) == 40 else None, 60)

        # 40 % of the devices, 16 pods: the limit is 0.3 x 40 = 12.
        victims = sorted(devices)[:16]
        # The preview first: which pods a mark would evict, with nothing written.
        pool, device = devices[victims[0]]
        dry = _plugin(big_lab, "mark", f"{pool}/{device}", "--reason", "checking", "--dry-run")
        assert f"would evict 1 pod(s): {NAMESPACE}/{victims[0]}" in dry and "nothing written" in dry, dry
        assert not records(api)
        marked.extend(devices[p] for p in victims)
        _mark_all(api, marked, "driver upgrade misfire")
        wait_for("12 pods evicted", lambda: _evicted_total(api) >= 12, 90)
        paused = wait_for("4 records paused", lambda: p if len(p := _paused(api)) == 4 else None, 60)
        time.sleep(5)
        assert _evicted_total(api) == 12
        still = _running(api) & set(victims)
        assert len(still) == 4, still
        assert {(r["spec"]["pool"], r["spec"]["device"]) for r in paused} == {devices[p] for p in still}

        def messages() -> list[str]:
            return [c["message"] for r in _paused(api) for c in r["status"]["conditions"]
                    if c["type"] == "EvictionPaused"]

        # Every paused record ends up with the whole count, whichever record opened the breaker.
        wait_for("the paused records' messages up to date", lambda: len(m := messages()) == 4 and all(
            "16 pod(s) would be or were evicted within 10m (4 pending, 12 evicted), more than the limit of 12" in text
            for text in m), 30)
        assert _breaker_gauge(operator) == 1
        opened = _breaker_events(api)
        assert len(opened) == 1 and opened[0].type == "Warning"

        # New pods do not land on the marked devices (the unmarked 24 are all in use).
        create_pods(api, NAMESPACE, [pod_with_claims(n, [{"name": "gpu", "resourceClaimTemplateName": "single-gpu"}])
                                     for n in ("newcomer-0", "newcomer-1")])
        time.sleep(5)
        assert not ({"newcomer-0", "newcomer-1"} & _running(api))
        assert not ({"newcomer-0", "newcomer-1"} & set(_pod_devices(api)))
        for name in ("newcomer-0", "newcomer-1"):
            core.delete_namespaced_pod(name, NAMESPACE, grace_period_seconds=0)

        # A restart keeps the breaker: its state is in the records, not in memory.
        operator.stop()
        operator.start()
        time.sleep(8)
        assert _evicted_total(api) == 12 and _running(api) & set(victims) == still
        assert len(_paused(api)) == 4 and _breaker_gauge(operator) == 1
        assert len(_breaker_events(api)) == 1

        # A forged approval is refused by the API server; an honest one resumes two records.
        first, second, third, fourth = sorted(still)
        record_name = _record_of(api, *devices[first])["metadata"]["name"]
        objects = client.CustomObjectsApi(api)
        with pytest.raises(ApiException) as refused:
            objects.patch_cluster_custom_object(GROUP, VERSION, PLURAL, record_name,
                                                {"metadata": {"annotations": {APPROVAL: "someone-else"}}})
        assert refused.value.status in (403, 422) and "approved-by" in str(refused.value.body)
        me = whoami(api)  # the lab's admin is in claimwarden:approvers
        generation = str(_record_of(api, *devices[first])["metadata"]["generation"])
        objects.patch_cluster_custom_object(GROUP, VERSION, PLURAL, record_name, {"metadata": {"annotations": {
            APPROVAL: me, APPROVED_GENERATION: generation}}})
        approved = _plugin(big_lab, "approve", "/".join(devices[second]))  # the plugin writes the same annotation
        assert f"evictions approved by {me}" in approved, approved
        wait_for("the approved pods evicted", lambda: not ({first, second} & _running(api)), 60)
        approval = wait_for("status.approval", lambda: (_record_of(api, *devices[first]).get("status") or {}).get(
            "approval"))
        assert approval["by"] == me and approval["at"] and approval["generation"] == int(generation)
        time.sleep(3)
        assert {third, fourth} <= _running(api) and _breaker_gauge(operator) == 1  # 14 > 12: still open

        # Clearing the two unapproved marks closes it by itself.
        _mark_all(api, [devices[third], devices[fourth]], None)
        wait_for("the breaker closed", lambda: _breaker_gauge(operator) == 0, 30)
        wait_for("no record paused", lambda: not _paused(api), 30)
        assert {third, fourth} <= _running(api) and _evicted_total(api) == 14
    finally:
        _mark_all(api, marked, None)
        wait_for("the records gone", lambda: not records(api), 60)
        operator.stop()
        core.delete_namespace(NAMESPACE)
        api.close()


def _breaker_events(api: client.ApiClient) -> list[Any]:
    items = client.CoreV1Api(api).list_namespaced_event("default").items
    return [e for e in items if e.reason == "EvictionBreakerOpen"]


def test_the_api_server_refuses_an_approval_in_someone_elses_name(api: client.ApiClient) -> None:
    """Without claimwarden: the ValidatingAdmissionPolicy alone (manifests/approval)."""
    name = "approval-check"
    create_record(api, name, "kwok-node-0", "gpu-7", "None", "checking the approval policy")
    objects = client.CustomObjectsApi(api)
    try:
        def annotate_as(value: str) -> None:
            objects.patch_cluster_custom_object(GROUP, VERSION, PLURAL, name, {"metadata": {"annotations": {
                APPROVAL: value, APPROVED_GENERATION: "1"}}})

        # The policy is loaded asynchronously after it is created: wait until it refuses.
        def refused() -> ApiException | None:
            try:
                annotate_as("system:admin-impostor")
            except ApiException as exc:
                return exc
            annotate_as_none(objects, name)
            return None

        error = wait_for("the policy in force", refused, 30)
        assert error.status in (403, 422) and "claimwarden.io/approved-by must be the name" in str(error.body)
        me = whoami(api)
        annotate_as(me)
        # An unchanged approval lets other updates through.
        objects.patch_cluster_custom_object(GROUP, VERSION, PLURAL, name, {"spec": {"reason": "still checking"}})
        assert objects.get_cluster_custom_object(GROUP, VERSION, PLURAL, name)["metadata"]["annotations"][
            APPROVAL] == me
    finally:
        delete_record(api, name)


def annotate_as_none(objects: client.CustomObjectsApi, name: str) -> None:
    objects.patch_cluster_custom_object(GROUP, VERSION, PLURAL, name, {"metadata": {"annotations": {
        APPROVAL: None, APPROVED_GENERATION: None}}})
