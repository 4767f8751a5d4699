"""Fault scenarios against two claimwarden replicas; every invariant of checker.py must be 0.

1. SIGKILL the leader at random moments during churn.
2. Restart kube-apiserver mid-churn, once after an etcd compaction (watches get 410 Gone).
3. SIGSTOP the leader for longer than its lease while pods and claims are deleted and devices marked.
4. Mark devices whose pods are half covered by PodDisruptionBudgets; kill the leader while evicting.
5. An overloaded apiserver: API Priority and Fairness rejects claimwarden's excess requests (429).
6. A rolling update: a new replica starts, the old leader gets SIGTERM.
7. A partition of the leader: its link to the apiserver drops everything for longer than the lease, then heals.
8. A slow link: 2 s of added latency on the leader's connection during churn.
9. etcd stops and starts again (on its data) mid-churn.
10. Clock-rate skew: the standby's clocks run 10 % fast (libfaketime); the leader freezes right after a
    renewal, the fast standby takes over, then the fast leader is killed.
11. The breaker on, and the leader killed right after it used the breaker's room: the new leader may not
    evict beyond it.
The soak (test_soak.py) runs beside these.
"""

from __future__ import annotations

import contextlib
import os
import random
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from claimwarden_lab import disruptions
from claimwarden_lab.cluster import LabState
from claimwarden_lab.driver import DRIVER
from tests.integration.auditor import LabAudit, Rules
from tests.integration.conftest import extra_lab, service_account_kubeconfig
from tests.integration.helpers import pod_with_claims, template, wait_for
from tests.integration.operator import Operator
from tests.integration.slowlink import SlowLink

from . import checker
from .conftest import RESULTS

FULL = os.environ.get("CHAOS_SCALE", "ci") == "full"
SCALE: dict[str, Any] = {
    "nodes": 40 if FULL else 6, "gpus": 8 if FULL else 4,
    "pods": 1000 if FULL else 60, "alive": 250 if FULL else 14,
    "kills": 20 if FULL else 3, "restarts": 3 if FULL else 1, "freeze": 60 if FULL else 20,
    "marked": 50 if FULL else 4, "overload_pods": 200 if FULL else 30, "rollouts": 3 if FULL else 1,
    "partition": 60 if FULL else 25, "partitions": 3 if FULL else 1, "slow": 120 if FULL else 30,
    "etcd_restarts": 3 if FULL else 1, "etcd_down": 20 if FULL else 5, "breaker_room": 10 if FULL else 3,
}
LEASE, RETRY = 15, 2
RNG = random.Random(1234)
BREAKER_OFF = ("--breaker-max-fraction=1",)
LIBFAKETIME = "/usr/lib/*/faketime/libfaketimeMT.so.1"
"""Debian's libfaketime (package faketime, `make faketime`), preloaded directly: its `faketime` command forks
and waits, so a signal to it would not reach the replica (a SIGKILLed "leader" would lead on)."""


def fast_clock() -> dict[str, str]:
    """The environment that makes a process's clocks (time.time and time.monotonic alike) run 10 % fast."""
    found = sorted(Path("/").glob(LIBFAKETIME.lstrip("/")))
    assert found, f"no {LIBFAKETIME}: install Debian's faketime (make faketime)"
    return {"LD_PRELOAD": str(found[0]), "FAKETIME": "+0 x1.1"}


# --- the bed --------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def chaos_lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LabState]:
    # Several scenarios mark the same devices, so one record may be written by each: the lab-wide bound is
    # the per-test one times the scenarios.
    with extra_lab(tmp_path_factory, rules=Rules(max_writes=20 * 11), nodes=SCALE["nodes"],
                   gpus_per_node=SCALE["gpus"]) as state:
        yield state


@pytest.fixture(scope="module")
def chaos_api(chaos_lab: LabState) -> Iterator[client.ApiClient]:
    api = config.new_client_from_config(config_file=str(chaos_lab.kubeconfig))
    yield api
    api.close()


class Replicas:
    """Two claimwarden processes, identities replica-a and replica-b, as a Deployment would run them."""

    def __init__(self, lab: LabState, directory: Path, *, extra: Sequence[str] = BREAKER_OFF,
                 kubeconfigs: Sequence[Path | None] = (None, None),
                 envs: Sequence[dict[str, str] | None] = (None, None)) -> None:
        """`kubeconfigs` and `envs`: per replica, a kubeconfig other than the direct one (a link) and more
        environment (libfaketime's)."""
        direct = service_account_kubeconfig(lab)
        # Unique per scenario, as pod names are: two processes with one identity would share the lease.
        # The breaker is off by default (it has its own tests, and scenario 11): scenario 4 marks whole
        # groups of devices on purpose.
        self.all = [Operator(kubeconfig or direct, directory / f"{name}.log", list(extra),
                             identity=f"{directory.name[:40]}-{name}", env=env)
                    for name, kubeconfig, env in zip(("a", "b"), kubeconfigs, envs, strict=True)]
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


@contextlib.contextmanager
def _bed(lab: LabState, api: client.ApiClient, directory: Path, test: str,
         **replica_options: Any) -> Iterator[tuple[Replicas, str, LabAudit]]:
    namespace = f"chaos-{test.split('_', 2)[-1][:30].replace('_', '-').strip('-')}-{RNG.randrange(10**5)}"
    core = client.CoreV1Api(api)
    core.create_namespace(body={"metadata": {"name": namespace}})
    client.ResourceV1Api(api).create_namespaced_resource_claim_template(namespace, body=template("gpu"))
    replicas = Replicas(lab, directory, **replica_options)
    audit = LabAudit(lab)
    try:
        replicas.start()
        yield replicas, namespace, audit
    finally:
        try:
            _free_namespace(api, namespace)
        finally:
            replicas.stop()


@pytest.fixture
def bed(chaos_lab: LabState, chaos_api: client.ApiClient, tmp_path: Path,
        request: pytest.FixtureRequest) -> Iterator[tuple[Replicas, str, LabAudit]]:
    """Two replicas, a fresh namespace with template `gpu`, and the audit log from now on."""
    with _bed(chaos_lab, chaos_api, tmp_path, request.node.name) as found:
        yield found


Bed = Callable[..., contextlib.AbstractContextManager[tuple[Replicas, str, LabAudit]]]


@pytest.fixture
def make_bed(chaos_lab: LabState, chaos_api: client.ApiClient, tmp_path: Path, request: pytest.FixtureRequest) -> Bed:
    """`bed` for replicas with options (Replicas' keywords), made when the scenario is ready for them."""
    return lambda **options: _bed(chaos_lab, chaos_api, tmp_path, request.node.name, **options)


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
             targets: Sequence[tuple[str, str]] = (), timeout: float = 120,
             breaker: checker.Breaker | None = None) -> tuple[float, dict[str, list[str]]]:
    """Poll the checker until every invariant holds (or the timeout); return the time taken and the last result."""
    started = time.monotonic()
    while True:
        events.extend(audit.new_events())
        result = checker.check(read_cluster(api, events), targets, breaker)
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
        if (pod.status.phase != "Running" or not pod.status.resource_claim_statuses
                or pod.metadata.deletion_timestamp):
            continue
        try:
            claim = resource.read_namespaced_resource_claim(
                pod.status.resource_claim_statuses[0].resource_claim_name, namespace)
        except ApiException as exc:
            if exc.status == 404:  # the pod is on its way out (evicted, deleted by churn) with its claim
                continue
            raise
        if not (claim.status and claim.status.allocation):
            continue
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
                disruptions.compact_etcd(chaos_lab)
            disruptions.restart_apiserver(chaos_lab, say=lambda _line: None)
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


def _steady_pods(api: client.ApiClient, namespace: str, count: int, prefix: str = "steady") -> None:
    """`count` pods that no churn deletes (to be marked during a fault), running."""
    core = client.CoreV1Api(api)
    for i in range(count):
        core.create_namespaced_pod(namespace, body=pod_with_claims(
            f"{prefix}-{i}", [{"name": "gpu", "resourceClaimTemplateName": "gpu"}]))
    wait_for(f"the {prefix} pods running", lambda: sum(
        p.status.phase == "Running" and p.metadata.name.startswith(f"{prefix}-")
        for p in core.list_namespaced_pod(namespace).items) == count, 120)


def _mark_steady(api: client.ApiClient, namespace: str, count: int, reason: str, prefix: str = "steady",
                 done: Sequence[tuple[str, str, str, str]] = ()) -> list[tuple[str, str, str, str]]:
    """Mark the devices of `count` steady pods not among `done`; return them as `_marked_targets` does."""
    marked = [m for m in _marked_targets(api, namespace, 10**6) if m[0].startswith(f"{prefix}-")
              and m[0] not in {d[0] for d in done}][:count]
    assert len(marked) == count, f"only {len(marked)} {prefix} pods to mark"
    for _, _, device, slice_name in marked:
        _mark(api, slice_name, device, reason)
    return marked


def _clear(api: client.ApiClient, marked: Sequence[tuple[str, str, str, str]]) -> None:
    for _, _, device, slice_name in marked:
        _mark(api, slice_name, device, None)


def _wait_quarantined(audit: LabAudit, events: list[dict[str, Any]],
                      marked: Sequence[tuple[str, str, str, str]]) -> None:
    """Wait until the audit log shows a quarantine claim allocated on each marked device: the quarantine
    invariant (I12) sees what it checks."""
    wanted = {(DRIVER, pool, device) for _, pool, device, _ in marked}

    def seen() -> bool:
        events.extend(audit.new_events())
        return wanted <= checker.quarantined_devices(events)

    wait_for("the marked devices' quarantine claims in the audit log", seen, 60)


def _renew_time(api: client.ApiClient) -> object:
    return client.CoordinationV1Api(api).read_namespaced_lease("claimwarden", "claimwarden-system").spec.renew_time


def _wait_for_a_renewal(api: client.ApiClient) -> None:
    renewed = _renew_time(api)
    wait_for("the leader to renew", lambda: _renew_time(api) != renewed, LEASE, interval=0.05)


def clock_rate(env: dict[str, str], seconds: float = 3.0) -> tuple[float, float]:
    """How fast time.monotonic and time.time run in a Python child with `env`, against our monotonic.

    Each reading of the child's clocks is dated at the middle of its round trip, so a loaded machine's
    scheduling delays err by half a round trip at each end, not a whole one."""
    script = "import sys, time\nfor _ in sys.stdin:\n    print(time.monotonic(), time.time(), flush=True)\n"
    child = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             text=True, env={**os.environ, **env})

    def read() -> tuple[float, float, float]:
        assert child.stdin is not None and child.stdout is not None
        asked = time.monotonic()
        child.stdin.write("now\n")
        child.stdin.flush()
        monotonic, wall = map(float, child.stdout.readline().split())
        return (asked + time.monotonic()) / 2, monotonic, wall

    try:
        read()  # the first answer waits for the interpreter to start
        ours, monotonic, wall = read()
        time.sleep(seconds)
        ours_after, monotonic_after, wall_after = read()
    finally:
        assert child.stdin is not None
        child.stdin.close()
        child.wait(10)
    return (monotonic_after - monotonic) / (ours_after - ours), (wall_after - wall) / (ours_after - ours)


def test_the_fast_clock_runs_pythons_monotonic_and_wall_clocks_10_percent_fast() -> None:
    """libfaketime fakes CLOCK_MONOTONIC too (unless told not to): the skew reaches the lease's timers."""
    monotonic, wall = clock_rate(fast_clock())
    assert monotonic == pytest.approx(1.1, abs=0.03) and wall == pytest.approx(1.1, abs=0.03), (monotonic, wall)
    plain_monotonic, _ = clock_rate({})
    assert plain_monotonic == pytest.approx(1.0, abs=0.03)


def test_a_partitioned_leader_writes_nothing_after_the_new_leaders_first_write(
        chaos_lab: LabState, chaos_api: client.ApiClient, make_bed: Bed, tmp_path: Path) -> None:
    """Replica a reaches the apiserver through the lab's forwarder; the link drops everything for longer
    than the lease while a keeps running, then heals. Replica b takes over and evicts the pods of devices
    marked meanwhile; nothing a sent before the cut lands after b's first write."""
    events: list[dict[str, Any]] = []
    times: list[float] = []
    marked: list[tuple[str, str, str, str]] = []
    with SlowLink(chaos_lab, tmp_path) as link, make_bed(
            kubeconfigs=(link.kubeconfig(service_account_kubeconfig(chaos_lab)), None)) as (replicas, namespace, audit):
        cut_off, other = replicas.all
        _steady_pods(chaos_api, namespace, 2 * SCALE["partitions"])
        try:
            with Churn(chaos_api, namespace, total=SCALE["pods"] // 2, alive=SCALE["alive"]) as churn:
                for _ in range(SCALE["partitions"]):
                    if replicas.leader() is not cut_off:
                        replicas.kill_leader()  # the replica behind the link leads again
                    time.sleep(RNG.uniform(2, 5))
                    link.cut()
                    cut = time.monotonic()
                    try:
                        wait_for("the other replica to lead", lambda: other.running and other.leads(), 60,
                                 interval=0.2)
                        times.append(time.monotonic() - cut)
                        marked += _mark_steady(chaos_api, namespace, 2, "marked during a partition", done=marked)
                        time.sleep(max(0.0, SCALE["partition"] - (time.monotonic() - cut)))
                    finally:
                        link.heal()
                churn.wait(600)
            took, result = converge(chaos_api, audit, events, [(namespace, m[0]) for m in marked])
            _wait_quarantined(audit, events, marked)
        finally:
            _clear(chaos_api, marked)
        restarts = replicas.restarts
    record("7 partition of the leader", f"{len(churn.created)} pods created, {len(marked)} devices marked meanwhile",
           f"{SCALE['partitions']} x {SCALE['partition']} s cut (dropped both ways); replicas restarted by the "
           f"kubelet: {restarts}", times, took, result)


def test_a_slow_link_to_the_leader_loses_nothing(chaos_lab: LabState, chaos_api: client.ApiClient,
                                                 make_bed: Bed, tmp_path: Path) -> None:
    """2 s of added latency on everything the leader sends, during churn and while devices are marked."""
    events: list[dict[str, Any]] = []
    marked: list[tuple[str, str, str, str]] = []
    with SlowLink(chaos_lab, tmp_path) as link, make_bed(
            kubeconfigs=(link.kubeconfig(service_account_kubeconfig(chaos_lab)), None)) as (replicas, namespace, audit):
        _steady_pods(chaos_api, namespace, 2)
        leaders: set[str] = set()
        try:
            with Churn(chaos_api, namespace, total=SCALE["pods"] // 2, alive=SCALE["alive"]) as churn:
                time.sleep(3)
                link.delay(2)
                slowed = time.monotonic()
                time.sleep(5)
                marked = _mark_steady(chaos_api, namespace, 2, "marked over a slow link")
                while time.monotonic() - slowed < SCALE["slow"]:
                    leader = replicas.leader()
                    if leader is not None:
                        leaders.add(leader.identity)
                    time.sleep(1)
                link.delay(0)
                churn.wait(600)
            took, result = converge(chaos_api, audit, events, [(namespace, m[0]) for m in marked], timeout=180)
        finally:
            _clear(chaos_api, marked)
        restarts = replicas.restarts
    record("8 slow link to the leader", f"{len(churn.created)} pods created, 2 devices marked meanwhile",
           f"2 s latency for {SCALE['slow']} s; leaders seen: {len(leaders)}, replicas restarted: {restarts}",
           [], took, result)


def test_etcd_restarts_mid_churn(chaos_lab: LabState, chaos_api: client.ApiClient,
                                 bed: tuple[Replicas, str, LabAudit]) -> None:
    replicas, namespace, audit = bed
    events: list[dict[str, Any]] = []
    marked: list[tuple[str, str, str, str]] = []
    _steady_pods(chaos_api, namespace, 2 * SCALE["etcd_restarts"])
    try:
        with Churn(chaos_api, namespace, total=SCALE["pods"] // 2, alive=SCALE["alive"]) as churn:
            for _ in range(SCALE["etcd_restarts"]):
                time.sleep(RNG.uniform(2, 5))
                # Marked right before etcd goes: the leader is at work on them when it does.
                marked += _mark_steady(chaos_api, namespace, 2, "marked before etcd stopped", done=marked)
                disruptions.restart_etcd(chaos_lab, say=lambda _line: None, down=SCALE["etcd_down"])
            churn.wait(600)
        took, result = converge(chaos_api, audit, events, [(namespace, m[0]) for m in marked], timeout=360)
    finally:
        _clear(chaos_api, marked)
    record("9 etcd restarts mid-churn", f"{len(churn.created)} pods created, {len(marked)} devices marked",
           f"{SCALE['etcd_restarts']} etcd stops of {SCALE['etcd_down']} s (data kept); replicas restarted by "
           f"the kubelet: {replicas.restarts}", [], took, result)


def test_a_standby_whose_clock_runs_fast_takes_over_without_overlap(chaos_api: client.ApiClient,
                                                                    make_bed: Bed) -> None:
    """Replica b's clocks run 10 % fast (so it finds the lease expired 10 % early). The leader freezes right
    after a renewal, while devices are marked; b takes over; the leader thaws and must not write. Then b,
    leading with its fast clock, is killed and a takes over again."""
    monotonic, wall = clock_rate(fast_clock())
    assert monotonic == pytest.approx(1.1, abs=0.03) and wall == pytest.approx(1.1, abs=0.03), (monotonic, wall)
    events: list[dict[str, Any]] = []
    marked: list[tuple[str, str, str, str]] = []
    with make_bed(envs=(None, fast_clock())) as (replicas, namespace, audit):
        slow, fast = replicas.all
        _steady_pods(chaos_api, namespace, 4)
        try:
            with Churn(chaos_api, namespace, total=SCALE["pods"] // 2, alive=SCALE["alive"]) as churn:
                time.sleep(3)
                with replicas.hands_off:
                    _wait_for_a_renewal(chaos_api)
                    slow.freeze()
                    frozen = time.monotonic()
                    try:
                        marked = _mark_steady(chaos_api, namespace, 2, "marked while the leader was frozen")
                        wait_for("the fast standby to lead", fast.leads, LEASE + RETRY + 15, interval=0.1)
                        took_over = time.monotonic() - frozen
                        time.sleep(3)  # the new leader writes
                    finally:
                        slow.thaw()
                    assert slow.proc is not None and slow.proc.wait(timeout=30) != 0
                    slow.start(lead=False)
                marked += _mark_steady(chaos_api, namespace, 2, "marked while the fast replica led", done=marked)
                times = [took_over, replicas.kill_leader()]
                churn.wait(600)
            took, result = converge(chaos_api, audit, events, [(namespace, m[0]) for m in marked])
            _wait_quarantined(audit, events, marked)
        finally:
            _clear(chaos_api, marked)
    record("10 clock-rate skew (standby 10 % fast)", f"{len(churn.created)} pods created, 4 devices marked",
           f"leader frozen after a renewal, fast standby took over in {took_over:.1f} s; then the fast leader "
           "SIGKILLed", times, took, result)


def test_the_breaker_room_holds_across_a_failover(chaos_api: client.ApiClient, make_bed: Bed) -> None:
    """The breaker on (--breaker-max-pods): twice its room in devices marked at once, and the leader killed
    the moment it used the room. The new leader inherits the window and may not evict beyond it."""
    room = SCALE["breaker_room"]
    events: list[dict[str, Any]] = []
    with make_bed(extra=("--breaker-max-fraction=1", f"--breaker-max-pods={room}")) as (replicas, namespace, audit):
        _steady_pods(chaos_api, namespace, 2 * room, prefix="held")
        marked = _mark_steady(chaos_api, namespace, 2 * room, "mass failure", prefix="held")
        try:
            def room_used() -> bool:
                events.extend(audit.new_events())
                return sum(checker.eviction_counts(events).values()) >= room

            wait_for("the breaker's room used", room_used, 120, interval=0.05)
            times = [replicas.kill_leader()]
            time.sleep(LEASE)  # the new leader's chance to evict beyond the room
            breaker = checker.Breaker(limit=room, window=600, drivers={(namespace, m[0]): DRIVER for m in marked})
            took, result = converge(chaos_api, audit, events, breaker=breaker, timeout=60)
        finally:
            _clear(chaos_api, marked)
        evicted = sum(checker.eviction_counts(events).values())
    record("11 breaker on, leader killed once its room is used", f"{2 * room} pods on marked devices, room {room}",
           "1 SIGKILL right after the last eviction the room allows", times, took, result)
    assert evicted == room, f"{evicted} pods evicted; the breaker's room is {room}"


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
