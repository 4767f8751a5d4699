"""`make bench`: claimwarden against kube-controller-manager (KCM) side by side, in one run (issue 19).

Every contender runs in its own fresh lab, one after the other, on the same machine. The labs audit every
request (``LabOptions.audit_all``), so API calls are counted from the apiserver's audit log by user agent:
claimwarden's and Kopf's; KCM's resourceclaim-controller (KCM appends the controller's name). CPU seconds
are the contender's process (/proc; KCM's whole process, as only its resourceclaim-controller works then).
The machine is shared and noisy: the table puts ratios measured side by side beside every absolute figure.

Claims labs (claimwarden, then KCM; each at every ``--qps`` budget: KCM ``--kube-api-qps=Q
--kube-api-burst=2Q``, claimwarden the same flags; the lab's own KCM, its garbage collector, at 1,000 in
claimwarden's labs). Their pods ask for a device no node has, so they never schedule and only claim
generation is measured; a few schedulable pods (namespace bench-health) hold real devices for `takeover`.

claims     `paced`: N pods created at a fixed 80/s; per pod the latency from its create call returning to
           its status showing the claim (p50/p99; upstream's DRA scale test calls it
           pod_create_to_claim_create). Then all of them are deleted and the seconds until no claim is left
           are timed (release). `burst`: N pods from 8 threads; seconds from the first create to every claim
           recorded. Both: CPU ms and API calls per generated claim.
memory     RSS once the N burst pods' claims are settled; claimwarden gets 100 UnhealthyDevice records
           (effect None) first.
restart    claimwarden: SIGTERM, start again, seconds until steady state (claims and reservations reconciled
           once per object, every queue empty, nothing in flight) and its writes meanwhile.
takeover   claimwarden: two replicas with leader election; SIGKILL the leader and at once mark a device
           that holds a running pod; seconds until the standby leads, until it is steady, and from the
           mark to that pod's eviction (health must not wait behind the warm-up's claims work).

Labs of their own:
footprint  claimwarden's RSS with 10 x M pods without DRA claims (scheduled, running) beside M with,
           M = min(N, 1,000): 10,000 + 1,000 at full scale.
evictions  bench/eviction_throughput.py, one pod per device: claimwarden, upstream at an equal budget and
           upstream at KCM's default 20 QPS (throttled, for reference).
shared     the same with 8 pods per device through one standalone claim per device (claimwarden and
           upstream at an equal budget).

    .venv/bin/python bench/suite.py [--pods 1000] [--nodes 125] [--qps 1000] [--sections claims,...]
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import eviction_throughput as evictions  # bench/, beside this file
import yaml
from eviction_throughput import Audit, list_objects
from kubernetes import client, config

from claimwarden_lab import cluster, driver
from claimwarden_lab.processes import free_port

ROOT = Path(__file__).resolve().parents[1]
NAMESPACE = "bench"  # the burst's pods
PACED_NAMESPACE = "paced"
HEALTH_NAMESPACE = "bench-health"
PLAIN_NAMESPACE = "plain"  # footprint's pods without claims
SECTIONS = ("claims", "memory", "restart", "takeover", "footprint", "evictions", "shared")
CLAIMWARDEN, KCM = "claimwarden", "kube-controller-manager"
HIGH_KCM_QPS = 1000.0  # the garbage collector's budget in every lab, so that it never bounds the release
RECORDS = 100
RESTART_LIMIT = 300.0  # seconds a restart or takeover may take before the suite stops waiting (and says so)
PACED_RATE = 80.0  # pods/s
HEALTH_PODS = 2
FOOTPRINT_DRA_PODS, FOOTPRINT_FACTOR = 1000, 10
SHARED_PODS_PER_DEVICE = 8
AGENTS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    CLAIMWARDEN: (("claimwarden", "kopf"), ()), KCM: (("kube-controller-manager",), ("/resource-claim-controller",))}
UNSATISFIABLE = {"devices": {"requests": [{"name": "gpu", "exactly": {
    "deviceClassName": driver.DEVICE_CLASS,
    "selectors": [{"cel": {"expression": f"device.attributes['{driver.DRIVER}'].model == 'none'"}}]}}]}}
SERVICE_ACCOUNT = ("claimwarden-system", "claimwarden")
TIMINGS: list[tuple[str, float]] = []
"""(what, wall seconds) of every lab and section, printed at the end to estimate longer runs."""


def say(line: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {line}", flush=True)


@dataclass
class Result:
    contender: str
    qps: float
    figures: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


class timed:
    """Adds the block's wall time to TIMINGS."""

    def __init__(self, what: str) -> None:
        self.what = what

    def __enter__(self) -> None:
        self.started = time.monotonic()

    def __exit__(self, *_: object) -> None:
        TIMINGS.append((self.what, time.monotonic() - self.started))


# --- labs and claimwarden -------------------------------------------------------------------

def _install(state: cluster.LabState) -> Path:
    """claimwarden's CRDs, namespace and RBAC, and a kubeconfig with its ServiceAccount's token."""
    kubectl = [f"{state.bin_dir}/kubectl", f"--kubeconfig={state.kubeconfig}"]
    subprocess.run([*kubectl, "apply", "-k", str(ROOT / "crds")], check=True, capture_output=True)
    subprocess.run([*kubectl, "apply", "-k", str(ROOT / "manifests" / "approval")], check=True, capture_output=True)
    for name in ("namespace.yaml", "serviceaccount.yaml", "rbac.yaml", "leader-election-rbac.yaml"):
        subprocess.run([*kubectl, "apply", "-f", str(ROOT / "manifests" / "base" / name)], check=True,
                       capture_output=True)
    subprocess.run([*kubectl, "wait", "--for=condition=Established", "--timeout=60s",
                    "crd/unhealthydevices.claimwarden.io"], check=True, capture_output=True)
    with config.new_client_from_config(config_file=str(state.kubeconfig)) as api:
        token = client.CoreV1Api(api).create_namespaced_service_account_token(
            SERVICE_ACCOUNT[1], SERVICE_ACCOUNT[0], body={"spec": {"audiences": [], "expirationSeconds": 86400}})
    path = state.dir / "claimwarden.kubeconfig"
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "claimwarden",
        "clusters": [{"name": "lab", "cluster": {"server": state.api_url,
                                                 "certificate-authority": str(state.dir / "pki" / "ca.crt")}}],
        "users": [{"name": "claimwarden", "user": {"token": token.status.token}}],
        "contexts": [{"name": "claimwarden", "context": {"cluster": "lab", "user": "claimwarden"}}]}))
    return path


class Claimwarden:
    """claimwarden as a subprocess, optionally under py-spy. Without `identity` it runs without leader
    election (as the lab's KCM does); with one, it is a replica electing a leader under that identity."""

    def __init__(self, kubeconfig: Path, log: Path, qps: float, extra: list[str], profile: Path | None,
                 tree: Path | None = None, baseline: bool = False, identity: str | None = None,
                 lease: float = 15.0) -> None:
        self.kubeconfig, self.log, self.qps, self.extra, self.profile = kubeconfig, log, qps, extra, profile
        self.tree = tree  # the checkout whose operator/ runs
        self.baseline = baseline  # another checkout's claimwarden, run as it was: no budget flags
        self.identity, self.lease = identity, lease
        self.metrics_port = 0
        self.process: subprocess.Popen[bytes] | None = None
        self.started = 0.0
        self.starts = 0

    def start(self) -> None:
        self.metrics_port = free_port()
        election = ["--leader-elect=false"] if self.identity is None else [
            "--leader-elect=true", f"--leader-elect-lease-duration={self.lease:g}",
            f"--leader-elect-renew-deadline={self.lease * 2 / 3:g}", "--leader-elect-retry-period=2"]
        argv = [sys.executable, "-m", "claimwarden", "run", "--kubeconfig", str(self.kubeconfig), *election,
                "--metrics-address", "127.0.0.1", "--metrics-port", str(self.metrics_port),
                "--liveness", f"http://127.0.0.1:{free_port()}/healthz", *self.extra]
        if not self.baseline:
            argv += [f"--kube-api-qps={self.qps:g}", f"--kube-api-burst={max(1, round(2 * self.qps))}"]
        env = {**os.environ, **({"PYTHONPATH": str(self.tree / "operator")} if self.tree else {}),
               **({"POD_NAME": self.identity} if self.identity else {})}
        self.starts += 1
        if self.profile is not None:
            output = self.profile.with_name(f"{self.profile.stem}-{self.starts}{self.profile.suffix}")
            argv = [str(Path(sys.executable).parent / "py-spy"), "record", "--rate", "50", "--nonblocking",
                    "--format", "raw", "-o", str(output), "--", *argv]
        self.started = time.monotonic()
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env)

    @property
    def pid(self) -> int:
        """claimwarden's own PID (under py-spy, its child)."""
        assert self.process is not None
        if self.profile is None:
            return self.process.pid
        for _ in range(100):
            children = Path(f"/proc/{self.process.pid}/task/{self.process.pid}/children")
            if children.exists() and children.read_text().split():
                return int(children.read_text().split()[0])
            time.sleep(0.1)
        raise SystemExit("py-spy started no claimwarden")

    def metrics(self) -> dict[str, float]:
        """The scrape as {'name{labels}': value}."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5) as response:
            text = response.read().decode()
        samples = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                name, _, value = line.rpartition(" ")
                samples[name] = float(value)
        return samples

    def wait_ready(self, timeout: float = 120.0, lead: bool = True) -> None:
        """Until its metrics answer, and with `lead` until they say it leads."""
        _until("claimwarden's metrics endpoint", lambda: self._answers(lead), timeout, 0.2)

    def leads(self) -> bool:
        try:
            return self.metrics().get("claimwarden_leader", 0.0) == 1.0
        except (OSError, http.client.HTTPException):
            return False

    def _answers(self, lead: bool) -> bool:
        assert self.process is not None
        if self.process.poll() is not None:
            raise SystemExit(f"claimwarden exited with {self.process.returncode}; see {self.log}")
        try:
            return self.metrics().get("claimwarden_leader", 0.0) == 1.0 or not lead
        except (OSError, http.client.HTTPException):
            return False

    def kill(self) -> None:
        """SIGKILL, as when the node under the leader dies."""
        assert self.process is not None
        self.process.kill()
        self.process.wait(10)
        self.process = None

    def stop(self) -> None:
        if self.process is None:
            return
        if self.profile is not None:
            os.kill(self.pid, signal.SIGTERM)  # py-spy writes its profile once its child exits
        else:
            self.process.terminate()
        try:
            self.process.wait(60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)
        self.process = None


class Timeout(Exception):
    pass


def _until(what: str, probe: Callable[[], bool], timeout: float, interval: float = 0.2) -> None:
    deadline = time.monotonic() + timeout
    while not probe():
        if time.monotonic() > deadline:
            raise Timeout(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)


def _rss_mib(pid: int) -> tuple[float, float]:
    """(current, peak) resident set of a process, MiB."""
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    return int(fields["VmRSS"].split()[0]) / 1024, int(fields["VmHWM"].split()[0]) / 1024


def _cpu_seconds(pid: int) -> float:
    """User + system CPU time a process has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _idle(pid: int, seconds: float = 2.0, below: float = 0.1) -> Callable[[], bool]:
    """A probe: the process used less than `below` CPU seconds over the last `seconds` (it is warm)."""
    def probe() -> bool:
        before = _cpu_seconds(pid)
        time.sleep(seconds)
        return _cpu_seconds(pid) - before < below
    return probe


def _audit(state: cluster.LabState, contender: str) -> Audit:
    agents, within = AGENTS[contender]
    return Audit(state.audit_log, agents, within)


def _per_object(audit: Audit, objects: int, prefix: str, figures: dict[str, float]) -> None:
    """`prefix` writes/reads per object, from the contender's requests in the audit log so far."""
    calls = audit.calls()
    reads = sum(n for (verb, _), n in calls.items() if verb in ("get", "list"))
    figures[f"{prefix} writes/claim"] = (sum(calls.values()) - reads) / max(1, objects)
    figures[f"{prefix} reads/claim"] = reads / max(1, objects)


# --- pods -----------------------------------------------------------------------------------

def _pod(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": {
        "containers": [{"name": "c", "image": "x", "resources": {"claims": [{"name": "gpu"}]}}],
        "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "gpu"}]}}


def _plain_pod(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"containers": [{"name": "c", "image": "x"}]}}


def _namespace_with_template(api: client.ApiClient, namespace: str, spec: dict[str, Any]) -> None:
    client.CoreV1Api(api).create_namespace(body={"metadata": {"name": namespace}})
    client.ResourceV1Api(api).create_namespaced_resource_claim_template(namespace, body={
        "metadata": {"name": "gpu"}, "spec": {"spec": spec}})


class RecordedWatch(threading.Thread):
    """Watches a namespace's pods (raw JSON, no client models) and notes when each first shows a claim in
    status.resourceClaimStatuses."""

    def __init__(self, api: client.ApiClient, namespace: str) -> None:
        super().__init__(daemon=True)
        self.core, self.namespace = client.CoreV1Api(api), namespace
        self.recorded: dict[str, float] = {}
        self.ready = threading.Event()
        self.stopped = False

    def run(self) -> None:
        while not self.stopped:
            listing = json.loads(self.core.list_namespaced_pod(self.namespace, _preload_content=False).data)
            self._note(listing["items"])
            self.ready.set()
            response = self.core.list_namespaced_pod(
                self.namespace, watch=True, resource_version=listing["metadata"]["resourceVersion"],
                allow_watch_bookmarks=False, timeout_seconds=600, _preload_content=False)
            buffer = b""
            for chunk in response.stream(65536):
                buffer += chunk
                *lines, buffer = buffer.split(b"\n")
                for line in lines:
                    if line.strip():
                        event = json.loads(line)
                        if event.get("type") in ("ADDED", "MODIFIED"):
                            self._note([event["object"]])
                if self.stopped:
                    return

    def _note(self, pods: list[dict[str, Any]]) -> None:
        now = time.monotonic()
        for pod in pods:
            if (pod.get("status") or {}).get("resourceClaimStatuses"):
                self.recorded.setdefault(pod["metadata"]["name"], now)


def _create_pods(core: client.CoreV1Api, namespace: str, pods: int, *, rate: float | None = None,
                 body: Callable[[str], dict[str, Any]] = _pod, threads: int = 8) -> dict[str, float]:
    """Create the pods from `threads` threads, or at `rate` pods/s (paced: each create waits for its slot);
    returns pod name -> when its create call returned."""
    created: dict[str, float] = {}
    started = time.monotonic()

    def create(i: int) -> None:
        if rate:
            time.sleep(max(0.0, started + i / rate - time.monotonic()))
        name = f"pod-{i:05d}"
        core.create_namespaced_pod(namespace, body=body(name), _preload_content=False)
        created[name] = time.monotonic()

    with ThreadPoolExecutor(32 if rate else threads) as pool:  # paced: enough threads for slow creates
        list(pool.map(create, range(pods)))
    return created


def _percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(p / 100 * len(ordered)) - 1))]


def _settled(operator: Claimwarden, pods: int, claims: int) -> Callable[[], bool]:
    """Steady state: every pod and claim reconciled once by this process, no key queued or in flight."""
    def probe() -> bool:
        samples = operator.metrics()
        depth = sum(v for k, v in samples.items() if k.startswith("claimwarden_workqueue_depth{"))
        busy = sum(v for k, v in samples.items() if k.startswith("claimwarden_workqueue_in_flight{"))
        done = {c: sum(v for k, v in samples.items() if k.startswith("claimwarden_reconcile_total{")
                       and f'controller="{c}"' in k) for c in ("claims", "reservations")}
        return depth == 0 and busy == 0 and done["claims"] >= pods and done["reservations"] >= claims
    return _safe(probe)


def _safe(probe: Callable[[], bool]) -> Callable[[], bool]:
    def safe() -> bool:
        try:
            return probe()
        except (OSError, http.client.HTTPException):
            return False
    return safe


def _held_devices(api: client.ApiClient, namespace: str) -> list[tuple[str, str, list[str]]]:
    """(pool, device, pods it is reserved for) of every allocated claim in the namespace."""
    found = []
    for claim in list_objects(api, f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims", metadata=False):
        status = claim.get("status") or {}
        for result in ((status.get("allocation") or {}).get("devices") or {}).get("results") or []:
            found.append((result["pool"], result["device"], [r["name"] for r in status.get("reservedFor") or []]))
    return found


def _terminating_or_gone(api: client.ApiClient, namespace: str, name: str) -> bool:
    pods = list_objects(api, f"/api/v1/namespaces/{namespace}/pods", query={"fieldSelector": f"metadata.name={name}"})
    return not pods or bool(pods[0]["metadata"].get("deletionTimestamp"))


# --- sections -------------------------------------------------------------------------------

def health_pods(api: client.ApiClient) -> None:
    """A few schedulable pods, each on a real device, for `takeover` to mark one of (both contenders get
    them, so that their labs hold the same objects)."""
    _namespace_with_template(api, HEALTH_NAMESPACE, {"devices": {"requests": [{"name": "gpu", "exactly": {
        "deviceClassName": driver.DEVICE_CLASS}}]}})
    _create_pods(client.CoreV1Api(api), HEALTH_NAMESPACE, HEALTH_PODS)

    def running() -> bool:
        pods = list_objects(api, f"/api/v1/namespaces/{HEALTH_NAMESPACE}/pods", metadata=False)
        return sum((p.get("status") or {}).get("phase") == "Running" for p in pods) == HEALTH_PODS
    _until(f"{HEALTH_PODS} schedulable pods running", running, 300, 1.0)


def claims_section(api: client.ApiClient, state: cluster.LabState, pods: int, pid: int, contender: str,
                   result: Result, *, paced: bool) -> None:
    """`paced`: N pods at PACED_RATE/s in their own namespace; else a burst from 8 threads. Seconds to every
    claim recorded, create->recorded latency, and CPU and API calls per generated claim."""
    namespace, label = (PACED_NAMESPACE, f"paced {PACED_RATE:g}/s") if paced else (NAMESPACE, "burst")
    core = client.CoreV1Api(api)
    _namespace_with_template(api, namespace, UNSATISFIABLE)
    watch = RecordedWatch(api, namespace)
    watch.start()
    watch.ready.wait(30)
    say(f"  claims ({label}): creating {pods} pods")
    audit = _audit(state, contender)
    cpu = _cpu_seconds(pid)
    started = time.monotonic()
    created = _create_pods(core, namespace, pods, rate=PACED_RATE if paced else None)
    creation = time.monotonic() - started
    say(f"  claims ({label}): {pods} pods created in {creation:.1f} s; {len(watch.recorded)} recorded so far")
    last = -1

    def all_recorded() -> bool:
        nonlocal last
        done = len(watch.recorded)
        if done // 500 != last // 500:
            say(f"  claims ({label}): {done} of {pods} claims recorded after {time.monotonic() - started:.1f} s")
        last = done
        return done >= pods

    _until(f"{pods} pods' claims recorded", all_recorded, 1800, 0.2)
    cpu = _cpu_seconds(pid) - cpu
    watch.stopped = True
    latencies = [max(0.0, watch.recorded[name] - created[name]) for name in created]
    result.figures.update({
        f"{label}: pod creation s": creation,
        f"{label}: pods created /s": pods / creation,
        f"{label}: claims recorded s": max(watch.recorded.values()) - started,
        f"{label}: create->recorded p50 s": _percentile(latencies, 50),
        f"{label}: create->recorded p99 s": _percentile(latencies, 99),
        f"{label}: create->recorded mean s": statistics.fmean(latencies),
        f"{label}: CPU s": cpu,
        f"{label}: CPU ms/claim": 1000 * cpu / pods,
    })
    time.sleep(2)  # the last status writes reach the audit log
    _per_object(audit, pods, label, result.figures)


def release_section(api: client.ApiClient, state: cluster.LabState, contender: str, result: Result) -> None:
    """The paced pods deleted at once (one deletecollection): seconds until no claim of theirs is left. The
    lab's garbage collector has the same high budget in both labs."""
    core = client.CoreV1Api(api)
    claims = len(list_objects(api, f"/apis/resource.k8s.io/v1/namespaces/{PACED_NAMESPACE}/resourceclaims"))
    audit = _audit(state, contender)
    started = time.monotonic()
    core.delete_collection_namespaced_pod(PACED_NAMESPACE, grace_period_seconds=0, _preload_content=False)
    pods_gone = 0.0

    def released() -> bool:
        nonlocal pods_gone
        if not pods_gone and not list_objects(api, f"/api/v1/namespaces/{PACED_NAMESPACE}/pods"):
            pods_gone = time.monotonic() - started
        return not list_objects(api, f"/apis/resource.k8s.io/v1/namespaces/{PACED_NAMESPACE}/resourceclaims")

    _until("every paced claim deleted", released, 1800, 0.5)
    result.figures.update({"release: pods deleted s": pods_gone,
                           "release: no claim left s": time.monotonic() - started})
    time.sleep(2)
    _per_object(audit, claims, "release", result.figures)


def memory_section(api: client.ApiClient, pid: int, pods: int, operator: Claimwarden | None,
                   result: Result) -> None:
    """RSS at N DRA pods, settled; claimwarden also holds RECORDS UnhealthyDevice records (effect None),
    on devices that no schedulable pod holds (takeover marks one of those)."""
    if operator is not None:
        resource, objects = client.ResourceV1Api(api), client.CustomObjectsApi(api)
        slices = resource.list_resource_slice().items
        busy = {(pool, device) for pool, device, _ in _held_devices(api, HEALTH_NAMESPACE)}
        devices = [(s.spec.pool.name, d.name) for s in slices for d in s.spec.devices or []
                   if (s.spec.pool.name, d.name) not in busy]
        say(f"  memory: {RECORDS} UnhealthyDevice records (effect None) over {len(slices)} slices")
        for i, (pool, device) in enumerate(devices[:: max(1, len(devices) // RECORDS)][:RECORDS]):
            objects.create_cluster_custom_object("claimwarden.io", "v1alpha1", "unhealthydevices", body={
                "apiVersion": "claimwarden.io/v1alpha1", "kind": "UnhealthyDevice",
                "metadata": {"name": f"bench-{i:03d}"},
                "spec": {"driver": driver.DRIVER, "pool": pool, "device": device, "effect": "None",
                         "reason": "benchmark"}})
        _until("claimwarden settled", _settled(operator, pods, pods), 600, 0.5)
        time.sleep(3)
    current, peak = _rss_mib(pid)
    result.figures.update({"RSS MiB": current, "peak RSS MiB": peak})


def restart_section(state: cluster.LabState, operator: Claimwarden, pods: int, result: Result) -> None:
    """SIGTERM, start again: seconds until steady, CPU seconds and writes meanwhile."""
    operator.stop()
    audit = _audit(state, CLAIMWARDEN)
    say("  restart: claimwarden stopped (SIGTERM); starting it again")
    operator.start()
    try:
        _until("claimwarden steady after its restart", _settled(operator, pods, pods), RESTART_LIMIT, 0.5)
    except Timeout:
        result.notes.append(f"not steady {RESTART_LIMIT:.0f} s after the restart; stopped waiting")
        return
    steady = time.monotonic() - operator.started
    cpu = _cpu_seconds(operator.pid)
    time.sleep(5)
    calls = audit.calls()
    writes = {k: n for k, n in calls.items() if k[0] not in ("get", "list")}
    result.figures.update({"restart -> steady s": steady, "CPU s (restart)": cpu,
                           "writes after restart": float(sum(writes.values())),
                           "reads after restart": float(sum(calls.values()) - sum(writes.values()))})
    if writes:
        result.notes.append("writes after restart: " + ", ".join(f"{n} {verb} {what}"
                                                                 for (verb, what), n in sorted(writes.items())))


def takeover_section(api: client.ApiClient, operator: Claimwarden, pods: int, args: argparse.Namespace,
                     result: Result) -> None:
    """Two replicas with leader election; SIGKILL the leader and at once mark a device holding a running
    pod. Seconds from the kill until the standby leads and until it is steady, and from the mark until that
    pod is evicted (health work must not queue behind the warm-up's claims work)."""
    operator.stop()
    replicas = [Claimwarden(operator.kubeconfig, operator.log.with_name(f"replica-{name}.log"), operator.qps,
                            operator.extra, None, operator.tree, operator.baseline, identity=f"bench-{name}",
                            lease=args.lease) for name in ("a", "b")]
    leader, standby = replicas
    try:
        leader.start()
        leader.wait_ready()
        standby.start()
        standby.wait_ready(lead=False)
        _until("the leader steady", _settled(leader, pods, pods), RESTART_LIMIT, 0.5)
        _until("the standby's indices warm (its CPU idle)", _idle(standby.pid), RESTART_LIMIT, 0)
        pool, device, holders = next((p, d, h) for p, d, h in _held_devices(api, HEALTH_NAMESPACE) if h)
        slice_name = next(s.metadata.name for s in client.ResourceV1Api(api).list_resource_slice().items
                          if s.spec.pool.name == pool)
        cpu = _cpu_seconds(standby.pid)
        say(f"  takeover: SIGKILL the leader; marking {pool}/{device} (pod {holders[0]})")
        killed = time.monotonic()
        leader.kill()
        client.ResourceV1Api(api).patch_resource_slice(slice_name, {"metadata": {"annotations": {
            f"unhealthy.claimwarden.io/{device}": "benchmark: marked during the takeover"}}})
        marked = time.monotonic()
        leads = evicted = steady = 0.0
        settled = _settled(standby, pods, pods)
        while not (leads and evicted and steady) and time.monotonic() - killed < RESTART_LIMIT + args.lease:
            now = time.monotonic()
            if not leads and standby.leads():
                leads = now
            if not evicted and _terminating_or_gone(api, HEALTH_NAMESPACE, holders[0]):
                evicted = now
            if leads and not steady and settled():
                steady = now
            time.sleep(0.1)
        if not (leads and evicted and steady):
            result.notes.append(f"takeover: not done {RESTART_LIMIT + args.lease:.0f} s after the kill "
                                f"(leads {bool(leads)}, evicted {bool(evicted)}, steady {bool(steady)})")
        result.figures.update({
            "takeover: kill -> standby leads s": leads - killed if leads else float("nan"),
            "takeover: leads -> steady s": steady - leads if steady and leads else float("nan"),
            "takeover: kill -> steady s": steady - killed if steady else float("nan"),
            "takeover: mark -> pod evicted s": evicted - marked if evicted else float("nan"),
            "takeover: leads -> pod evicted s": evicted - leads if evicted and leads else float("nan"),
            "takeover: standby CPU s": _cpu_seconds(standby.pid) - cpu,
            "takeover: lease s": args.lease})
    finally:
        for replica in replicas:
            if replica.process is not None:
                replica.stop()


def footprint_section(args: argparse.Namespace, tmp: Path) -> Result:
    """claimwarden's RSS in a lab of its own: FOOTPRINT_FACTOR x M running pods without DRA claims beside
    M DRA pods (unschedulable, claims generated), M = min(N, FOOTPRINT_DRA_PODS)."""
    result = Result(CLAIMWARDEN, max(args.qps))
    dra = min(args.pods, FOOTPRINT_DRA_PODS)
    plain = FOOTPRINT_FACTOR * dra
    directory = tmp / "footprint"
    say(f"footprint: a lab of {args.nodes} nodes; {plain} pods without claims beside {dra} with")
    state = cluster.up(cluster.LabOptions(dir=directory, nodes=args.nodes, kcm_qps=HIGH_KCM_QPS), say=lambda _: None)
    operator: Claimwarden | None = None
    try:
        operator = Claimwarden(_install(state), tmp / "footprint.log", max(args.qps), args.claimwarden_args, None,
                               args.snapshot)
        operator.start()
        operator.wait_ready()
        with config.new_client_from_config(config_file=str(state.kubeconfig)) as api:
            core = client.CoreV1Api(api)
            _namespace_with_template(api, NAMESPACE, UNSATISFIABLE)
            _create_pods(core, NAMESPACE, dra)
            core.create_namespace(body={"metadata": {"name": PLAIN_NAMESPACE}})
            started = time.monotonic()
            _create_pods(core, PLAIN_NAMESPACE, plain, body=_plain_pod, threads=16)

            def running() -> bool:
                return not list_objects(api, f"/api/v1/namespaces/{PLAIN_NAMESPACE}/pods",
                                 query={"fieldSelector": "status.phase!=Running"})
            _until(f"{plain} pods without claims running", running, 1800, 2.0)
            say(f"  footprint: {plain} pods running after {time.monotonic() - started:.0f} s")
            _until("claimwarden settled", _settled(operator, dra, dra), 600, 0.5)
            try:
                _until("claimwarden idle", _idle(operator.pid), 120, 0)
            except Timeout as exc:  # measured anyway: the RSS is what it is while busy
                result.notes.append(f"footprint: {exc}; RSS measured while busy")
            current, peak = _rss_mib(operator.pid)
            result.figures.update({"footprint: DRA pods": float(dra), "footprint: pods without claims": float(plain),
                                   "footprint: RSS MiB": current, "footprint: peak RSS MiB": peak})
    finally:
        if operator is not None:
            operator.stop()
        cluster.down(directory, say=lambda _: None)
    return result


def evictions_section(pods: int, *, pods_per_device: int, contenders: tuple[str, ...],
                      claimwarden_args: str) -> dict[str, dict[str, float]]:
    """bench/eviction_throughput.py's `measure`, each contender in a lab of its own."""
    figures = {}
    for contender in contenders:
        say(f"evictions ({pods_per_device} pod(s) per device): {contender}, {pods} pods")
        with timed(f"evictions x{pods_per_device}: {contender} (lab included)"):
            try:
                figures[contender] = evictions.measure(contender, pods=pods, pods_per_device=pods_per_device,
                                                       say=lambda line: say(f"  {line}"),
                                                       claimwarden_args=claimwarden_args)
            except evictions.BenchError as exc:  # reported; the other contenders still run
                say(f"  {contender}: {exc}")
    return figures


# --- one contender at one budget --------------------------------------------------------------

def run_contender(name: str, qps: float, args: argparse.Namespace, tmp: Path) -> Result:
    """The claims lab of one contender: claims (paced, release, burst), memory, restart, takeover."""
    upstream = name == KCM
    tree = args.baseline if name == "baseline" else args.snapshot
    result = Result(name, qps)
    directory = tmp / f"{name}-{qps:g}"
    say(f"{name} at QPS {qps:g}: starting a lab with {args.nodes} nodes")
    started = time.monotonic()
    state = cluster.up(cluster.LabOptions(dir=directory, nodes=args.nodes, upstream_claims=upstream, audit_all=True,
                                          kcm_qps=qps if upstream else HIGH_KCM_QPS), say=lambda _: None)
    operator: Claimwarden | None = None
    sections = set(args.sections)
    try:
        kubeconfig = _install(state)
        result.figures["lab start-up s"] = time.monotonic() - started
        say(f"  lab ready in {result.figures['lab start-up s']:.0f} s")
        if not upstream:
            profile = args.profile / f"{name}-{qps:g}.txt" if args.profile else None
            log = (args.profile or tmp) / f"{name}-{qps:g}.log"
            operator = Claimwarden(kubeconfig, log, qps, args.claimwarden_args, profile, tree, name == "baseline")
            operator.start()
            operator.wait_ready()
            say("  claimwarden leads")
        with config.new_client_from_config(config_file=str(state.kubeconfig)) as api:
            kcm = next(p.pid for p in state.processes if "controller-manager" in p.name)
            pid = operator.pid if operator else kcm
            contender = KCM if upstream else CLAIMWARDEN
            health_pods(api)
            if "claims" not in sections:
                return result
            steps: list[tuple[str, Callable[[], None]]] = [
                ("claims paced", lambda: claims_section(api, state, args.pods, pid, contender, result, paced=True)),
                ("release", lambda: release_section(api, state, contender, result)),
                ("claims burst", lambda: claims_section(api, state, args.pods, pid, contender, result, paced=False))]
            if "memory" in sections:
                steps.append(("memory", lambda: memory_section(api, pid, args.pods, operator, result)))
            if "restart" in sections and operator is not None:
                steps.append(("restart", lambda: restart_section(state, operator, args.pods, result)))
            if "takeover" in sections and operator is not None and qps == max(args.qps):
                steps.append(("takeover", lambda: takeover_section(api, operator, args.pods, args, result)))
            for what, step in steps:
                with timed(f"{what}: {name}"):
                    try:
                        step()
                    except Timeout as exc:  # noted; the sections that depend on it are skipped
                        say(f"  {what}: {exc}")
                        result.notes.append(f"{what}: {exc}")
                        if what not in ("restart", "takeover"):
                            break
    finally:
        if operator is not None:
            operator.stop()
        cluster.down(directory, say=lambda _: None)
        TIMINGS.append((f"claims lab: {name} at QPS {qps:g} (all of it)", time.monotonic() - started))
    for key, value in result.figures.items():
        say(f"  {key}: {value:.2f}")
    return result


# --- the tables -----------------------------------------------------------------------------------

@dataclass
class Target:
    """One of issue 19's targets: the measured value, the side-by-side one, the goal, and the costs."""

    what: str
    ours: float | None
    theirs: float | None
    goal: str
    met: bool | None
    our_cost: str = ""
    their_cost: str = ""


def _at_most(value: float | None, limit: float | None) -> bool | None:
    if value is None or limit is None or value != value or limit != limit:  # missing or NaN
        return None
    return value <= limit


def _eviction_cost(f: dict[str, float] | None) -> str:
    if not f:
        return ""
    return (f"{f['writes_per_pod']:.2f} W + {f['reads_per_pod']:.2f} R/pod (window {f['window_writes_per_pod']:.2f} + "
            f"{f['window_reads_per_pod']:.2f}), {f['cpu_s']:.1f} CPU s")


def _claims_cost(f: dict[str, float], label: str) -> str:
    if f"{label}: CPU s" not in f:
        return ""
    return (f"{f.get(f'{label} writes/claim', float('nan')):.2f} W + {f.get(f'{label} reads/claim', float('nan')):.2f} "
            f"R/claim, {f[f'{label}: CPU s']:.1f} CPU s")


def targets(results: list[Result], args: argparse.Namespace, footprint: Result | None,
            one: dict[str, dict[str, float]], shared: dict[str, dict[str, float]]) -> list[Target]:
    """Every target of issue 19 this run measured, at the highest budget."""
    qps = max(args.qps)
    ours = next((r.figures for r in results if r.contender == CLAIMWARDEN and r.qps == qps), {})
    theirs = next((r.figures for r in results if r.contender == KCM and r.qps == qps), {})
    rows: list[Target] = []
    cw, up, slow = one.get(CLAIMWARDEN), one.get("upstream-equal-qps"), one.get("upstream")
    if cw or up:
        t = f"{args.pods} pods, 1 per device"
        rows += [
            Target(f"eviction: marks -> every pod evicted s ({t}) vs upstream at equal QPS",
                   cw and cw["evicted_s"], up and up["evicted_s"],
                   "<= upstream", _at_most(cw and cw["evicted_s"], up and up["evicted_s"]),
                   _eviction_cost(cw), _eviction_cost(up)),
            Target("eviction: moonshot", cw and cw["evicted_s"], None, "<= 5 s", _at_most(cw and cw["evicted_s"], 5)),
            Target("eviction: upstream THROTTLED at KCM's default 20 QPS (reference, no target)",
                   cw and cw["evicted_s"], slow and slow["evicted_s"], "-", None, "", _eviction_cost(slow)),
            Target("eviction: writes per evicted pod (mark -> quiet)", cw and cw["writes_per_pod"],
                   up and up["writes_per_pod"], "<= 5", _at_most(cw and cw["writes_per_pod"], 5)),
            Target("eviction: reads per evicted pod (mark -> quiet)", cw and cw["reads_per_pod"],
                   up and up["reads_per_pod"], "<= 1", _at_most(cw and cw["reads_per_pod"], 1)),
            Target("eviction: writes per evicted pod in the window (mark -> all evicted)",
                   cw and cw["window_writes_per_pod"], up and up["window_writes_per_pod"], "-", None),
            Target("eviction: reads per evicted pod in the window", cw and cw["window_reads_per_pod"],
                   up and up["window_reads_per_pod"], "-", None),
        ]
    cw, up = shared.get(CLAIMWARDEN), shared.get("upstream-equal-qps")
    if cw or up:
        rows += [Target(f"eviction, {SHARED_PODS_PER_DEVICE} pods per device: writes per evicted pod",
                        cw and cw["writes_per_pod"], up and up["writes_per_pod"], "<= 3",
                        _at_most(cw and cw["writes_per_pod"], 3), _eviction_cost(cw), _eviction_cost(up)),
                 Target(f"eviction, {SHARED_PODS_PER_DEVICE} pods per device: marks -> every pod evicted s",
                        cw and cw["evicted_s"], up and up["evicted_s"], "-", None)]
    paced, burst = f"paced {PACED_RATE:g}/s", "burst"

    def pair(key: str) -> tuple[float | None, float | None]:
        return ours.get(key), theirs.get(key)

    if f"{burst}: claims recorded s" in ours or f"{burst}: claims recorded s" in theirs:
        recorded, p99, cpu = (pair(f"{burst}: claims recorded s"), pair(f"{paced}: create->recorded p99 s"),
                              pair(f"{burst}: CPU ms/claim"))
        rows += [
            Target(f"claims: {args.pods} pods (burst) -> every claim recorded s", *recorded, "<= KCM",
                   _at_most(*recorded), _claims_cost(ours, burst), _claims_cost(theirs, burst)),
            Target(f"claims: create -> recorded p99 s at {PACED_RATE:g} pods/s (achieved: "
                   f"{ours.get(f'{paced}: pods created /s', 0):.0f}/s; KCM's lab "
                   f"{theirs.get(f'{paced}: pods created /s', 0):.0f}/s)", *p99, "<= 2 s",
                   _at_most(p99[0], 2), _claims_cost(ours, paced), _claims_cost(theirs, paced)),
            Target(f"claims: create -> recorded p50 s at {PACED_RATE:g} pods/s",
                   *pair(f"{paced}: create->recorded p50 s"), "-", None),
            Target("claims: CPU ms per generated claim (burst; KCM: its whole process)", *cpu, "<= 2x KCM",
                   _at_most(cpu[0], 2 * cpu[1] if cpu[1] is not None else None)),
            Target(f"claims: CPU ms per generated claim ({paced})", *pair(f"{paced}: CPU ms/claim"), "-", None),
        ]
    if "restart -> steady s" in ours:
        rows.append(Target(f"restart at {args.pods} claims: SIGTERM + start -> steady s", ours["restart -> steady s"],
                           None, "<= 10 s", _at_most(ours["restart -> steady s"], 10),
                           f"{ours['CPU s (restart)']:.1f} CPU s, {ours['writes after restart']:.0f} W + "
                           f"{ours['reads after restart']:.0f} R"))
    if "takeover: kill -> steady s" in ours:
        lease = ours["takeover: lease s"]
        rows += [
            Target(f"takeover at {args.pods} claims: standby leads -> steady s", ours["takeover: leads -> steady s"],
                   None, "<= 10 s", _at_most(ours["takeover: leads -> steady s"], 10),
                   f"{ours['takeover: standby CPU s']:.1f} CPU s (standby, from the kill)"),
            Target(f"takeover: SIGKILL -> standby steady s (includes the {lease:g} s lease expiring)",
                   ours["takeover: kill -> steady s"], None, "<= 10 s",
                   _at_most(ours["takeover: kill -> steady s"], 10)),
            Target("takeover: eviction during the warm-up, standby leads -> pod evicted s",
                   ours["takeover: leads -> pod evicted s"], None, "<= 5 s",
                   _at_most(ours["takeover: leads -> pod evicted s"], 5)),
            Target("takeover: mark (right after the kill) -> pod evicted s", ours["takeover: mark -> pod evicted s"],
                   None, "-", None),
        ]
    if footprint is not None and "footprint: RSS MiB" in footprint.figures:
        f = footprint.figures
        rows.append(Target(f"RSS MiB, {f['footprint: pods without claims']:.0f} pods without claims + "
                           f"{f['footprint: DRA pods']:.0f} with", f["footprint: RSS MiB"], None, "<= 150 MiB",
                           _at_most(f["footprint: RSS MiB"], 150), f"peak {f['footprint: peak RSS MiB']:.0f} MiB"))
    if "RSS MiB" in ours:
        rows.append(Target(f"RSS MiB at {args.pods} DRA pods (goal stated for 5,000; KCM: its whole process)",
                           ours["RSS MiB"], theirs.get("RSS MiB"), "<= 200 MiB", _at_most(ours["RSS MiB"], 200),
                           f"peak {ours['peak RSS MiB']:.0f} MiB"))
    return rows


def targets_table(rows: list[Target]) -> str:
    lines = ["| target | claimwarden | KCM / upstream | ratio | goal | verdict | claimwarden cost "
             "| KCM / upstream cost |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for row in rows:
        ratio = f"{row.ours / row.theirs:.2f}" if row.ours is not None and row.theirs else ""
        verdict = {True: "met", False: "gap", None: ""}[row.met]
        lines.append(f"| {row.what} | {_fmt(row.ours)} | {_fmt(row.theirs)} | {ratio} | {row.goal} | {verdict} | "
                     f"{row.our_cost} | {row.their_cost} |")
    return "\n".join(lines)


def figures_table(results: list[Result], args: argparse.Namespace) -> str:
    lines = [f"conditions: {args.pods} pods, {args.nodes} kwok nodes x 8 GPUs in the claims labs, "
             f"Kubernetes {cluster.K8S_VERSION}, {os.cpu_count()} CPUs ({platform.processor() or platform.machine()}), "
             f"load average {os.getloadavg()[0]:.1f} at the end; every contender in a fresh lab, one after the other",
             "QPS = the same client budget for both: KCM --kube-api-qps=Q --kube-api-burst=2Q, claimwarden "
             "--kube-api-qps=Q --kube-api-burst=2Q; the lab's own KCM (garbage collector) at "
             f"{HIGH_KCM_QPS:g} in claimwarden's labs",
             "", "| QPS | measure | claimwarden | kube-controller-manager | claimwarden / KCM |"
             + (f" baseline ({args.baseline}, no client budget) |" if args.baseline else ""),
             "| --- | --- | --- | --- | --- |" + (" --- |" if args.baseline else "")]
    for qps in args.qps:
        ours, theirs, before = (next((r for r in results if r.contender == name and r.qps == qps), None)
                                for name in (CLAIMWARDEN, KCM, "baseline"))
        keys = list(dict.fromkeys(k for r in (ours, theirs, before) if r for k in r.figures))
        for key in keys:
            a = ours.figures.get(key) if ours else None
            b = theirs.figures.get(key) if theirs else None
            ratio = f"{a / b:.2f}" if a is not None and b else ""
            line = f"| {qps:g} | {key} | {_fmt(a)} | {_fmt(b)} | {ratio} |"
            if args.baseline:
                line += f" {_fmt(before.figures.get(key) if before else None)} |"
            lines.append(line)
    for r in results:
        for note in r.notes:
            lines.append(f"note ({r.contender}, QPS {r.qps:g}): {note}")
    return "\n".join(lines)


def evictions_table(title: str, figures: dict[str, dict[str, float]]) -> str:
    if not figures:
        return ""
    keys = list(dict.fromkeys(k for f in figures.values() for k in f))
    lines = [f"| {title} | " + " | ".join(figures) + " |", "| --- |" + " --- |" * len(figures)]
    lines += [f"| {key} | " + " | ".join(_fmt(f.get(key)) for f in figures.values()) + " |" for key in keys]
    return "\n".join(lines)


def _interrupt(signum: int, _frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def _describe(tree: Path) -> str:
    """The commit of a checkout, and whether it has uncommitted changes."""
    head = subprocess.run(["git", "-C", str(tree), "log", "-1", "--format=%h %s"], capture_output=True, text=True)
    dirty = subprocess.run(["git", "-C", str(tree), "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True).stdout.strip()
    return head.stdout.strip()[:60] + (" (with uncommitted changes)" if dirty else "")


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pods", type=int, default=1000)
    parser.add_argument("--nodes", type=int, default=125, help="nodes of the claims and footprint labs (the "
                        "eviction labs' follow from --pods: 8 GPUs per node, the broken ones plus 20 %%)")
    parser.add_argument("--qps", type=lambda t: [float(x) for x in t.split(",")], default=[1000.0],
                        help="client budgets to compare the claims labs at, comma-separated (default: 1000; "
                             "1000,20 adds a pair of labs at KCM's default)")
    parser.add_argument("--sections", type=lambda t: tuple(t.split(",")), default=SECTIONS)
    parser.add_argument("--contenders", type=lambda t: tuple(t.split(",")), default=(CLAIMWARDEN, KCM))
    parser.add_argument("--eviction-contenders", type=lambda t: tuple(t.split(",")), default=evictions.CONTENDERS,
                        help="the evictions section's contenders (default: all; at 5,000 pods upstream at KCM's "
                             "default 20 QPS alone takes over 12 minutes)")
    parser.add_argument("--claimwarden-args", type=lambda t: t.split(), default=[],
                        help="more flags for claimwarden run")
    parser.add_argument("--lease", type=float, default=15.0,
                        help="takeover: the replicas' lease duration, s (default: claimwarden's, 15)")
    parser.add_argument("--baseline", type=Path, default=None,
                        help="also run the claimwarden of this checkout (e.g. /work/main), unthrottled as it was, "
                             "at the highest budget only: before/after in one run")
    parser.add_argument("--profile", type=Path, default=None,
                        help="run claimwarden under py-spy; its raw profiles and its logs go to this directory")
    args = parser.parse_args()
    # Stopped with SIGTERM (or SIGINT, which a background job ignores): the labs are still taken down.
    signal.signal(signal.SIGTERM, _interrupt)
    wrong = set(args.sections) - set(SECTIONS)
    if wrong:
        parser.error(f"unknown sections {','.join(sorted(wrong))}; choose from {','.join(SECTIONS)}")
    if args.profile:
        args.profile.mkdir(parents=True, exist_ok=True)
    results: list[Result] = []
    footprint: Result | None = None
    one: dict[str, dict[str, float]] = {}
    shared: dict[str, dict[str, float]] = {}
    eviction_args = " ".join([evictions.DEFAULT_ARGS, *args.claimwarden_args])
    with tempfile.TemporaryDirectory() as tmp:
        # claimwarden runs from a copy taken now, so that editing the tree during a run changes nothing.
        args.snapshot = Path(tmp) / "snapshot"
        shutil.copytree(ROOT / "operator", args.snapshot / "operator", ignore=shutil.ignore_patterns("__pycache__"))
        say(f"claimwarden from {ROOT} at {_describe(ROOT)}" + (f"; baseline {args.baseline} at "
                                                               f"{_describe(args.baseline)}" if args.baseline else ""))
        if {"claims", "memory", "restart", "takeover"} & set(args.sections):
            for qps in args.qps:
                names = [*args.contenders, *(["baseline"] if args.baseline and qps == max(args.qps)
                                             and "baseline" not in args.contenders else [])]
                for name in names:
                    try:
                        results.append(run_contender(name, qps, args, Path(tmp)))
                    except Timeout as exc:  # one contender's failure is reported; the others still run
                        say(f"{name} at QPS {qps:g}: {exc}")
                        results.append(Result(name, qps, notes=[str(exc)]))
        if "footprint" in args.sections:
            with timed("footprint (lab included)"):
                try:
                    footprint = footprint_section(args, Path(tmp))
                except Timeout as exc:
                    say(f"footprint: {exc}")
        if "evictions" in args.sections:
            one = evictions_section(args.pods, pods_per_device=1, contenders=args.eviction_contenders,
                                    claimwarden_args=eviction_args)
        if "shared" in args.sections:
            shared = evictions_section(args.pods, pods_per_device=SHARED_PODS_PER_DEVICE,
                                       contenders=(CLAIMWARDEN, "upstream-equal-qps"), claimwarden_args=eviction_args)
    print()
    print(f"Issue 19's targets at {args.pods} pods (claims labs at QPS {max(args.qps):g}; evictions: "
          f"{evictions.Layout.for_pods(args.pods).broken} broken nodes of "
          f"{evictions.Layout.for_pods(args.pods).nodes} x 8 GPUs; costs: W/R = API writes/reads per object from "
          "the audit log, CPU s = the contender's process):")
    print(targets_table(targets(results, args, footprint, one, shared)))
    print()
    print(figures_table(results, args))
    for note in footprint.notes if footprint is not None else []:
        print(f"note (footprint): {note}")
    for title, figures in (("evictions, 1 pod per device", one),
                           (f"evictions, {SHARED_PODS_PER_DEVICE} pods per device", shared)):
        if figures:
            print()
            print(evictions_table(title, figures))
    print()
    print("wall time per section (lab start-up included where said):")
    for what, seconds in TIMINGS:
        print(f"  {what}: {seconds:.0f} s")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
