"""Six fault scenarios against two claimwarden replicas; every invariant of checker.py must be 0.

1. SIGKILL the leader at random moments during churn.
2. Restart kube-apiserver mid-churn, once after an etcd compaction (watches get 410 Gone).
3. SIGSTOP the leader for longer than its lease while pods and claims are deleted and devices marked.
4. Mark devices whose pods are half covered by PodDisruptionBudgets; kill the leader while evicting.
5. An overloaded apiserver: API Priority and Fairness rejects claimwarden's excess requests (429).
6. A rolling update: a new replica starts, the old leader gets SIGTERM.
"""

from __future__ import annotations

import os
import random
import statistics
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from claimwarden_lab import cluster
from claimwarden_lab.cluster import LabState
from tests.integration.auditor import LabAudit, Rules
from tests.integration.conftest import extra_lab, service_account_kubeconfig
from tests.integration.helpers import pod_with_claims, template, wait_for
from tests.integration.operator import Operator

from . import checker
from .conftest import RESULTS

FULL = os.environ.get("CHAOS_SCALE", "ci") == "full"
SCALE: dict[str, Any] = {
    "nodes": 40 if FULL else 6, "gpus": 8 if FULL else 4,
    "pods": 1000 if FULL else 60, "alive": 250 if FULL else 14,
    "kills": 20 if FULL else 3, "restarts": 3 if FULL else 1, "freeze": 60 if FULL else 20,
    "marked": 50 if FULL else 4, "overload_pods": 200 if FULL else 30, "rollouts": 3 if FULL else 1,
}
LEASE, RETRY = 15, 2
RNG = random.Random(1234)


# --- the bed --------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def chaos_lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LabState]:
    # Several scenarios mark the same devices, so one record may be written by each: the lab-wide bound is
    # the per-test one times the scenarios.
    with extra_lab(tmp_path_factory, rules=Rules(max_writes=20 * 6), nodes=SCALE["nodes"],
                   gpus_per_node=SCALE["gpus"]) as state:
        yield state


@pytest.fixture(scope="module")
def chaos_api(chaos_lab: LabState) -> Iterator[client.ApiClient]:
    api = config.new_client_from_config(config_file=str(chaos_lab.kubeconfig))
    yield api
    api.close()


class Replicas:
    """Two claimwarden processes, identities replica-a and replica-b, as a Deployment would run them."""

    def __init__(self, lab: LabState, directory: Path) -> None:
        kubeconfig = service_account_kubeconfig(lab)
        # Unique per scenario, as pod names are: two processes with one identity would share the lease.
        # The breaker is off here (it has its own tests): scenario 4 marks whole groups of devices on purpose.
        self.all = [Operator(kubeconfig, directory / f"{name}.log", ["--breaker-max-fraction=1"],
                             identity=f"{directory.name[:40]}-{name}") for name in ("a", "b")]
        self.restarts = 0
        self.hands_off = threading.Lock()
        """Held while a scenario handles the processes itself, so that the kubelet stays out of the way."""
        self._stopping = threading.Event()
        self._kubelet = threading.Thread(target=self._restart_exited, name="kubelet", daemon=True)

    def start(self) -> None:
        self.all[0].start()
        self.all[1].start(lead=False)
        self._kubelet.start()

    def _restart_exited(self) -> None:
        """What the kubelet does for a Deployment's pod (restartPolicy Always): a replica that exited, a
        leader that lost its lease while the apiserver was away say, is started again as a standby."""
        while not self._stopping.wait(0.5):
            with self.hands_off:
                for replica in list(self.all):
                    if replica.proc is not None and replica.proc.poll() is not None:
                        self.restarts += 1
                        replica.proc = None
                        try:
                            replica.start(lead=False)
                        except AssertionError:  # it exited at once (the apiserver still away): retry
                            replica.proc = None
                    elif replica.proc is None:
                        try:  # the start that failed last round (CrashLoopBackOff, without the back-off)
                            replica.start(lead=False)
                        except AssertionError:
                            replica.proc = None

    def leader(self) -> Operator | None:
        return next((r for r in self.all if r.running and r.leads()), None)

    def wait_leader(self, timeout: float = LEASE + RETRY + 15) -> tuple[Operator, float]:
        started = time.monotonic()
        found = wait_for("a leader", self.leader, timeout, interval=0.2)
        return found, time.monotonic() - started

    def kill_leader(self) -> float:
        """SIGKILL the leader; return the time until the other replica leads; restart the killed one."""
        with self.hands_off:
            old, _ = self.wait_leader()
            old.kill()
            new, took = self.wait_leader()
            assert new is not old
            old.start(lead=False)
        return took

    def stop(self) -> None:
        self._stopping.set()
        if self._kubelet.is_alive():
            self._kubelet.join(10)
        for replica in self.all:
            if replica.running:
                replica.stop()


class Churn:
    """Pods (and Jobs, whose pods finish) created and deleted in the background."""

    def __init__(self, api: client.ApiClient, namespace: str, *, total: int, alive: int) -> None:
        self.core, self.batch = client.CoreV1Api(api), client.BatchV1Api(api)
        self.namespace, self.total, self.alive = namespace, total, alive
        self.created: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="churn", daemon=True)

    def __enter__(self) -> Churn:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(60)

    def _run(self) -> None:
        pods: list[str] = []
        for i in range(self.total):
            if self._stop.is_set():
                return
            name = f"churn-{i}"
            body = pod_with_claims(name, [{"name": "gpu", "resourceClaimTemplateName": "gpu"}])
            try:
                if i % 5 == 4:  # a Job's pod finishes (kwok completes pods owned by Jobs)
                    spec = {**body["spec"], "restartPolicy": "Never"}
                    self.batch.create_namespaced_job(self.namespace, body={
                        "metadata": {"name": name}, "spec": {"backoffLimit": 0, "template": {"spec": spec}}})
                else:
                    self.core.create_namespaced_pod(self.namespace, body=body)
                    pods.append(name)
                self.created.append(name)
                while len(pods) > self.alive:
                    self.core.delete_namespaced_pod(pods.pop(RNG.randrange(len(pods))), self.namespace,
                                                    grace_period_seconds=0)
            except ApiException:
                time.sleep(0.5)  # an apiserver restart in progress: carry on
            except Exception:
                time.sleep(0.5)
            time.sleep(0.05)

    def wait(self, timeout: float) -> None:
        self._thread.join(timeout)


@pytest.fixture
def bed(chaos_lab: LabState, chaos_api: client.ApiClient, tmp_path: Path,
        request: pytest.FixtureRequest) -> Iterator[tuple[Replicas, str, LabAudit]]:
    """Two replicas, a fresh namespace with template `gpu`, and the audit log from now on."""
    namespace = f"chaos-{request.node.name.split('_', 2)[-1][:30].replace('_', '-')}-{RNG.randrange(10**5)}"
    core = client.CoreV1Api(chaos_api)
    core.create_namespace(body={"metadata": {"name": namespace}})
    client.ResourceV1Api(chaos_api).create_namespaced_resource_claim_template(namespace, body=template("gpu"))
    replicas = Replicas(chaos_lab, tmp_path)
    audit = LabAudit(chaos_lab)
    try:
        replicas.start()
        yield replicas, namespace, audit
    finally:
        try:
            _free_namespace(chaos_api, namespace)
        finally:
            replicas.stop()


def _free_namespace(chaos_api: client.ApiClient, namespace: str) -> None:
    """Free the devices for the next scenario, then delete the namespace without waiting for it (after an
    apiserver restart kube-controller-manager's namespace controller may back off for minutes)."""
    core, resource = client.CoreV1Api(chaos_api), client.ResourceV1Api(chaos_api)
    client.BatchV1Api(chaos_api).delete_collection_namespaced_job(namespace, propagation_policy="Background")
    core.delete_collection_namespaced_pod(namespace, grace_period_seconds=0)
    wait_for(f"the pods of {namespace} gone and their devices free", lambda: not core.list_namespaced_pod(
        namespace).items and not any(c.status and c.status.allocation for c in
                                     resource.list_namespaced_resource_claim(namespace).items), 120)
    core.delete_namespace(namespace)


def read_cluster(api: client.ApiClient, events: list[dict[str, Any]]) -> checker.Cluster:
    core, resource = client.CoreV1Api(api), client.ResourceV1Api(api)
    plain = api.sanitize_for_serialization
    records = client.CustomObjectsApi(api).list_cluster_custom_object("claimwarden.io", "v1alpha1",
                                                                      "unhealthydevices")["items"]
    return checker.Cluster(pods=[plain(p) for p in core.list_pod_for_all_namespaces().items],
                           claims=[plain(c) for c in resource.list_resource_claim_for_all_namespaces().items],
                           records=list(records), events=events)


def converge(api: client.ApiClient, audit: LabAudit, events: list[dict[str, Any]],
             targets: list[tuple[str, str]] = (), timeout: float = 120) -> tuple[float, dict[str, list[str]]]:
    """Poll the checker until every invariant holds (or the timeout); return the time taken and the last result."""
    started = time.monotonic()
    while True:
        events.extend(audit.new_events())
        result = checker.check(read_cluster(api, events), targets)
        if not any(result.values()) or time.monotonic() - started > timeout:
            return time.monotonic() - started, result
        time.sleep(1)


def record(scenario: str, load: str, faults: str, leader_times: list[float], took: float,
           result: dict[str, list[str]]) -> None:
    leader = (f"{statistics.median(leader_times):.1f} s / {max(leader_times):.1f} s" if leader_times else "—")
    violations = " / ".join(str(len(found)) for found in result.values())  # in checker.INVARIANTS' order
    RESULTS.append({"scenario": scenario, "load": load, "faults": faults, "leader": leader,
                    "converged": f"{took:.0f} s", "violations": violations})
    assert not any(result.values()), {name: found[:5] for name, found in result.items() if found}


def _marked_targets(api: client.ApiClient, namespace: str, count: int) -> list[tuple[str, str, str, str]]:
    """(pod, pool, device, slice) for `count` running pods of the namespace, one device each."""
    core, resource = client.CoreV1Api(api), client.ResourceV1Api(api)
    slices = {s.spec.node_name: s.metadata.name for s in resource.list_resource_slice().items}
    found = []
    for pod in core.list_namespaced_pod(namespace).items:
        if pod.status.phase != "Running" or not pod.status.resource_claim_statuses:
            continue
        claim = resource.read_namespaced_resource_claim(pod.status.resource_claim_statuses[0].resource_claim_name,
                                                        namespace)
        result = claim.status.allocation.devices.results[0]
        found.append((pod.metadata.name, result.pool, result.device, slices[result.pool]))
        if len(found) == count:
            break
    return found


def _mark(api: client.ApiClient, slice_name: str, device: str, reason: str | None) -> None:
    client.ResourceV1Api(api).patch_resource_slice(slice_name, {"metadata": {"annotations": {
        f"unhealthy.claimwarden.io/{device}": reason}}})


# --- the scenarios --------------------------------------------------------------------------

def test_sigkill_the_leader_during_churn(chaos_api: client.ApiClient, bed: tuple[Replicas, str, LabAudit]) -> None:
    replicas, namespace, audit = bed
    events: list[dict[str, Any]] = []
    times = []
    with Churn(chaos_api, namespace, total=SCALE["pods"], alive=SCALE["alive"]) as churn:
        for _ in range(SCALE["kills"]):
            time.sleep(RNG.uniform(1, 6))
            times.append(replicas.kill_leader())
        churn.wait(600)
    took, result = converge(chaos_api, audit, events)
    record("1 SIGKILL the leader during churn", f"{len(churn.created)} pods created, {SCALE['alive']} alive",
           f"{SCALE['kills']} SIGKILLs", times, took, result)
    # The times are figures for the table (targets: README); what must hold is a takeover by expiry, not later.
    assert max(times) <= LEASE + RETRY + 5


def test_apiserver_restarts_mid_churn(chaos_lab: LabState, chaos_api: client.ApiClient,
                                      bed: tuple[Replicas, str, LabAudit]) -> None:
    replicas, namespace, audit = bed
    events: list[dict[str, Any]] = []
    with Churn(chaos_api, namespace, total=SCALE["pods"] // 2, alive=SCALE["alive"]) as churn:
        for i in range(SCALE["restarts"]):
            time.sleep(RNG.uniform(2, 5))
            if i == 0:
                cluster.compact_etcd(chaos_lab)
            cluster.restart_apiserver(chaos_lab, say=lambda _line: None)
        churn.wait(600)
    took, result = converge(chaos_api, audit, events, timeout=360)
    record("2 kube-apiserver restarts mid-churn", f"{len(churn.created)} pods created",
           f"{SCALE['restarts']} restarts, 1 with etcd compaction (410 Gone); replicas restarted by the kubelet "
           f"after losing the lease: {replicas.restarts}", [], took, result)


def test_a_frozen_leader_does_not_write_after_the_takeover(chaos_api: client.ApiClient,
                                                           bed: tuple[Replicas, str, LabAudit]) -> None:
    replicas, namespace, audit = bed
    events: list[dict[str, Any]] = []
    core = client.CoreV1Api(chaos_api)
    with Churn(chaos_api, namespace, total=SCALE["alive"], alive=SCALE["alive"]) as churn:
        churn.wait(300)
    wait_for("the churned pods running", lambda: sum(p.status.phase == "Running" for p in core.list_namespaced_pod(
        namespace).items) >= SCALE["alive"] * 0.6, 120)
    leader, _ = replicas.wait_leader()
    marked = _marked_targets(chaos_api, namespace, 2)
    replicas.hands_off.acquire()
    leader.freeze()
    try:
        for pod in core.list_namespaced_pod(namespace).items[: SCALE["alive"] // 3]:
            if pod.metadata.name not in {m[0] for m in marked}:
                core.delete_namespaced_pod(pod.metadata.name, namespace, grace_period_seconds=0)
        for _, _, device, slice_name in marked:
            _mark(chaos_api, slice_name, device, "marked while the leader was frozen")
        _, took_over = replicas.wait_leader(LEASE + RETRY + 15)
        time.sleep(max(0.0, SCALE["freeze"] - took_over))
    finally:
        leader.thaw()
    try:
        assert leader.proc is not None and leader.proc.wait(timeout=30) != 0
        leader.start(lead=False)
    finally:
        replicas.hands_off.release()
    try:
        took, result = converge(chaos_api, audit, events, [(namespace, m[0]) for m in marked])
    finally:
        for _, _, device, slice_name in marked:
            _mark(chaos_api, slice_name, device, None)
    record("3 SIGSTOP the leader beyond its lease", f"{SCALE['alive']} pods, 2 devices marked meanwhile",
           f"leader frozen {SCALE['freeze']} s", [took_over], took, result)


def test_kill_the_leader_while_evicting_pods_under_budgets(chaos_api: client.ApiClient,
                                                           bed: tuple[Replicas, str, LabAudit]) -> None:
    replicas, namespace, audit = bed
    events: list[dict[str, Any]] = []
    core, policy = client.CoreV1Api(chaos_api), client.PolicyV1Api(chaos_api)
    count = SCALE["marked"]
    for i in range(count):
        body = pod_with_claims(f"guarded-{i}", [{"name": "gpu", "resourceClaimTemplateName": "gpu"}])
        body["metadata"]["labels"] = {"guard": "yes" if i % 2 == 0 else "no", "index": str(i)}
        core.create_namespaced_pod(namespace, body=body)
    wait_for("the pods running", lambda: sum(p.status.phase == "Running" for p in core.list_namespaced_pod(
        namespace).items) == count, 120)
    for i in range(0, count, 2):  # half the pods: a budget that allows no disruption, relaxed later
        policy.create_namespaced_pod_disruption_budget(namespace, body={
            "metadata": {"name": f"keep-{i}"},
            "spec": {"minAvailable": 1, "selector": {"matchLabels": {"guard": "yes", "index": str(i)}}}})
    marked = _marked_targets(chaos_api, namespace, count)
    for _, _, device, slice_name in marked:
        _mark(chaos_api, slice_name, device, "mass failure")
    time.sleep(1)
    times = [replicas.kill_leader()]
    for i in range(0, count, 2):
        policy.patch_namespaced_pod_disruption_budget(f"keep-{i}", namespace, {"spec": {"minAvailable": 0}})
    try:
        took, result = converge(chaos_api, audit, events, [(namespace, m[0]) for m in marked], timeout=180)
    finally:
        for _, _, device, slice_name in marked:
            _mark(chaos_api, slice_name, device, None)
    record("4 kill the leader while evicting under budgets", f"{count} pods on marked devices, {count // 2} "
           "behind budgets", "1 SIGKILL mid-eviction", times, took, result)


def test_rolling_update_hands_over_without_missing_work(chaos_api: client.ApiClient, chaos_lab: LabState,
                                                        bed: tuple[Replicas, str, LabAudit], tmp_path: Path) -> None:
    replicas, namespace, audit = bed
    events: list[dict[str, Any]] = []
    times = []
    with Churn(chaos_api, namespace, total=SCALE["pods"] // 2, alive=SCALE["alive"]) as churn:
        for i in range(SCALE["rollouts"]):
            old, _ = replicas.wait_leader()
            new = Operator(service_account_kubeconfig(chaos_lab), tmp_path / f"new-{i}.log",
                           ["--breaker-max-fraction=1"], identity=f"new-{i}")
            new.start(lead=False)
            replicas.all[replicas.all.index(old)] = new
            stopped = time.monotonic()
            assert old.stop() == 0
            wait_for("a standby to lead", replicas.leader, 30, interval=0.1)  # the new one or the other
            times.append(time.monotonic() - stopped)
        churn.wait(600)
    took, result = converge(chaos_api, audit, events)
    record("6 rolling update", f"{len(churn.created)} pods created", f"{SCALE['rollouts']} hand-overs on SIGTERM",
           times, took, result)
    # The times are figures for the table (target 5 s: README); what must hold is a hand-over by release,
    # sooner than waiting for the lease to expire.
    assert max(times) < LEASE


@pytest.fixture(scope="module")
def overloaded_lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LabState]:
    # 30 seats in all: the one-share priority level claimwarden is squeezed into gets a single seat.
    with extra_lab(tmp_path_factory, nodes=SCALE["nodes"], gpus_per_node=SCALE["gpus"],
                   priority_and_fairness=True, max_requests_inflight=30) as state:
        yield state


def test_an_overloaded_apiserver_slows_claimwarden_but_loses_nothing(
        overloaded_lab: LabState, tmp_path: Path) -> None:
    api = config.new_client_from_config(config_file=str(overloaded_lab.kubeconfig))
    try:
        _squeeze(api)
        namespace = "overloaded"
        core = client.CoreV1Api(api)
        core.create_namespace(body={"metadata": {"name": namespace}})
        client.ResourceV1Api(api).create_namespaced_resource_claim_template(namespace, body=template("gpu"))
        replicas = Replicas(overloaded_lab, tmp_path)
        audit = LabAudit(overloaded_lab)
        replicas.start()
        events: list[dict[str, Any]] = []
        try:
            with Churn(api, namespace, total=SCALE["overload_pods"], alive=SCALE["alive"]) as churn:
                churn.wait(600)
            took, result = converge(api, audit, events, timeout=300)
            rejected = sum(1 for e in events if (e.get("responseStatus") or {}).get("code") == 429
                           and (e.get("objectRef") or {}).get("subresource") != "eviction")
        finally:
            replicas.stop()
        record("5 overloaded apiserver (APF rejects claimwarden's excess)", f"{len(churn.created)} pods created",
               f"{rejected} writes answered 429", [], took, result)
    finally:
        api.close()


def _squeeze(api: client.ApiClient) -> None:
    """Put claimwarden's ServiceAccount in a priority level of one seat that rejects, not queues, the rest."""
    custom = client.CustomObjectsApi(api)
    group, version = "flowcontrol.apiserver.k8s.io", "v1"
    custom.create_cluster_custom_object(group, version, "prioritylevelconfigurations", {
        "apiVersion": f"{group}/{version}", "kind": "PriorityLevelConfiguration",
        "metadata": {"name": "claimwarden-squeezed"},
        "spec": {"type": "Limited", "limited": {"nominalConcurrencyShares": 1, "lendablePercent": 0,
                                                 "borrowingLimitPercent": 0, "limitResponse": {"type": "Reject"}}}})
    custom.create_cluster_custom_object(group, version, "flowschemas", {
        "apiVersion": f"{group}/{version}", "kind": "FlowSchema", "metadata": {"name": "claimwarden-squeezed"},
        "spec": {"priorityLevelConfiguration": {"name": "claimwarden-squeezed"}, "matchingPrecedence": 100,
                 "rules": [{"subjects": [{"kind": "ServiceAccount", "serviceAccount": {
                     "name": "claimwarden", "namespace": "claimwarden-system"}}],
                     # Not the Lease: upstream serves leader election from a priority level of its own.
                     "resourceRules": [{"verbs": ["*"], "apiGroups": ["", "resource.k8s.io", "claimwarden.io"],
                                        "resources": ["*"], "namespaces": ["*"], "clusterScope": True}]}]}})
