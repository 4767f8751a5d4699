"""`make bench`: claimwarden against kube-controller-manager's controllers, side by side, in one run.

Each contender runs in its own fresh lab, one after the other, on the same machine, with the same
client budget (QPS/burst): KCM's ``--kube-api-qps/--kube-api-burst`` (the lab's ``kcm_qps``) and
claimwarden's ``--kube-api-qps/--kube-api-burst``. Every budget given with ``--qps`` gets its own pair of
labs. Sections:

claims     N pods whose template asks for a device no node has (they never schedule, so only claim
           generation is measured): seconds from the first pod create to every pod's claim recorded in
           its status, and per pod the latency from its create call returning to its status showing the
           claim (p50/p99; upstream's DRA scale test calls the same span pod_create_to_claim_create).
memory     peak and current RSS once everything is settled; claimwarden runs with the health controller,
           and 100 UnhealthyDevice records (effect None) are added first.
restart    claimwarden only: SIGTERM, start again, seconds until steady state (claims and reservations
           reconciled once per object, every queue empty, nothing in flight) and the writes it made.
release    all pods deleted (one deletecollection): seconds until no claim is left. The lab's
           kube-controller-manager (its garbage collector) has the same high budget in both labs.
evictions  bench/eviction_throughput.py's `measure` (a lab of its own).

    .venv/bin/python bench/suite.py [--pods 1000] [--nodes 125] [--qps 1000,20] [--sections ...]
"""

from __future__ import annotations

import argparse
import http.client
import importlib.util
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
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client, config

from claimwarden_lab import cluster, driver
from claimwarden_lab.processes import free_port

ROOT = Path(__file__).resolve().parents[1]
NAMESPACE = "bench"
SECTIONS = ("claims", "memory", "restart", "release", "evictions")
HIGH_KCM_QPS = 1000.0  # the garbage collector's budget in every lab, so that it never bounds the release
RECORDS = 100
RESTART_LIMIT = 300.0  # seconds a restart may take before the suite stops waiting (and says so)
UNSATISFIABLE = {"devices": {"requests": [{"name": "gpu", "exactly": {
    "deviceClassName": driver.DEVICE_CLASS,
    "selectors": [{"cel": {"expression": f"device.attributes['{driver.DRIVER}'].model == 'none'"}}]}}]}}
SERVICE_ACCOUNT = ("claimwarden-system", "claimwarden")


def say(line: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {line}", flush=True)


@dataclass
class Result:
    contender: str
    qps: float
    figures: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


# --- labs and claimwarden -------------------------------------------------------------------

def _install(state: cluster.LabState) -> Path:
    """claimwarden's CRDs, namespace and RBAC, and a kubeconfig with its ServiceAccount's token (so the
    lab's audit log, which records that user's writes, counts claimwarden's requests)."""
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
    """claimwarden as a subprocess (all controllers, no leader election, as the lab's KCM), optionally under py-spy."""

    def __init__(self, kubeconfig: Path, log: Path, qps: float, extra: list[str], profile: Path | None,
                 tree: Path | None = None, baseline: bool = False) -> None:
        self.kubeconfig, self.log, self.qps, self.extra, self.profile = kubeconfig, log, qps, extra, profile
        self.tree = tree  # the checkout whose operator/ runs
        self.baseline = baseline  # another checkout's claimwarden, run as it was: no budget flags
        self.metrics_port = 0
        self.process: subprocess.Popen[bytes] | None = None
        self.started = 0.0
        self.starts = 0

    def start(self) -> None:
        self.metrics_port = free_port()
        argv = [sys.executable, "-m", "claimwarden", "run", "--kubeconfig", str(self.kubeconfig),
                "--leader-elect=false", "--metrics-address", "127.0.0.1", "--metrics-port", str(self.metrics_port),
                "--liveness", f"http://127.0.0.1:{free_port()}/healthz", *self.extra]
        if not self.baseline:
            argv += [f"--kube-api-qps={self.qps:g}", f"--kube-api-burst={max(1, round(2 * self.qps))}"]
        env = {**os.environ, "PYTHONPATH": str(self.tree / "operator")} if self.tree else None
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

    def wait_ready(self, timeout: float = 120.0) -> None:
        _until("claimwarden's metrics endpoint", self._answers, timeout, 0.2)

    def _answers(self) -> bool:
        assert self.process is not None
        if self.process.poll() is not None:
            raise SystemExit(f"claimwarden exited with {self.process.returncode}; see {self.log}")
        try:
            return self.metrics().get("claimwarden_leader", 0.0) == 1.0
        except (OSError, http.client.HTTPException):
            return False

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


def _writes(state: cluster.LabState) -> list[dict[str, Any]]:
    if not state.audit_log.exists():
        return []
    events = []
    for line in state.audit_log.read_text().splitlines():
        event = json.loads(line)
        if event.get("user", {}).get("username") == cluster.CLAIMWARDEN_USER:
            events.append(event)
    return events


# --- pods -----------------------------------------------------------------------------------

def _pod(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": {
        "containers": [{"name": "c", "image": "x", "resources": {"claims": [{"name": "gpu"}]}}],
        "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "gpu"}]}}


class RecordedWatch(threading.Thread):
    """Watches the bench namespace's pods (raw JSON, no client models) and notes when each first shows
    a claim in status.resourceClaimStatuses."""

    def __init__(self, api: client.ApiClient) -> None:
        super().__init__(daemon=True)
        self.core = client.CoreV1Api(api)
        self.recorded: dict[str, float] = {}
        self.ready = threading.Event()
        self.stopped = False

    def run(self) -> None:
        while not self.stopped:
            listing = json.loads(self.core.list_namespaced_pod(NAMESPACE, _preload_content=False).data)
            self._note(listing["items"])
            self.ready.set()
            response = self.core.list_namespaced_pod(
                NAMESPACE, watch=True, resource_version=listing["metadata"]["resourceVersion"],
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


def _create_pods(core: client.CoreV1Api, pods: int, threads: int = 8) -> dict[str, float]:
    """Create the pods from `threads` threads; returns pod name -> when its create call returned."""
    created: dict[str, float] = {}

    def create(i: int) -> None:
        name = f"pod-{i:05d}"
        core.create_namespaced_pod(NAMESPACE, body=_pod(name), _preload_content=False)
        created[name] = time.monotonic()

    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(create, range(pods)))
    return created


def _percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(p / 100 * len(ordered)) - 1))]


# --- sections -------------------------------------------------------------------------------

def claims_section(api: client.ApiClient, pods: int, pid: int, result: Result) -> None:
    core, resource = client.CoreV1Api(api), client.ResourceV1Api(api)
    core.create_namespace(body={"metadata": {"name": NAMESPACE}})
    resource.create_namespaced_resource_claim_template(NAMESPACE, body={
        "metadata": {"name": "gpu"}, "spec": {"spec": UNSATISFIABLE}})
    watch = RecordedWatch(api)
    watch.start()
    watch.ready.wait(30)
    say(f"  claims: creating {pods} pods from 8 threads")
    cpu = _cpu_seconds(pid)
    started = time.monotonic()
    created = _create_pods(core, pods)
    creation = time.monotonic() - started
    say(f"  claims: {pods} pods created in {creation:.1f} s; {len(watch.recorded)} recorded so far")
    last = -1

    def all_recorded() -> bool:
        nonlocal last
        done = len(watch.recorded)
        if done // 500 != last // 500:
            say(f"  claims: {done} of {pods} claims recorded after {time.monotonic() - started:.1f} s")
        last = done
        return done >= pods

    _until(f"{pods} pods' claims recorded", all_recorded, 1800, 0.2)
    cpu = _cpu_seconds(pid) - cpu
    watch.stopped = True
    latencies = [max(0.0, watch.recorded[name] - created[name]) for name in created]
    result.figures.update({
        "pod creation s": creation,
        "claims recorded s": max(watch.recorded.values()) - started,
        "create->recorded p50 s": _percentile(latencies, 50),
        "create->recorded p99 s": _percentile(latencies, 99),
        "create->recorded mean s": statistics.fmean(latencies),
        "CPU s (claims)": cpu,
    })


def _settled(operator: Claimwarden, pods: int, claims: int) -> Callable[[], bool]:
    """Steady state: every pod and claim reconciled once by this process, no key queued or in flight."""
    def probe() -> bool:
        samples = operator.metrics()
        depth = sum(v for k, v in samples.items() if k.startswith("claimwarden_workqueue_depth{"))
        busy = sum(v for k, v in samples.items() if k.startswith("claimwarden_workqueue_in_flight{"))
        done = {c: sum(v for k, v in samples.items() if k.startswith("claimwarden_reconcile_total{")
                       and f'controller="{c}"' in k) for c in ("claims", "reservations")}
        return depth == 0 and busy == 0 and done["claims"] >= pods and done["reservations"] >= claims
    return probe


def memory_section(api: client.ApiClient, pid: int, pods: int, operator: Claimwarden | None,
                   result: Result) -> None:
    if operator is not None:
        resource, objects = client.ResourceV1Api(api), client.CustomObjectsApi(api)
        slices = json.loads(resource.list_resource_slice(_preload_content=False).data)["items"]
        devices = [(s["spec"]["pool"]["name"], d["name"]) for s in slices for d in s["spec"].get("devices") or []]
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
    operator.stop()
    before = len(_writes(state))
    say("  restart: claimwarden stopped (SIGTERM); starting it again")
    operator.start()
    try:
        _until("claimwarden steady after its restart", _safe(_settled(operator, pods, pods)), RESTART_LIMIT, 1.0)
    except Timeout:
        result.notes.append(f"not steady {RESTART_LIMIT:.0f} s after the restart; stopped waiting")
        return
    steady = time.monotonic() - operator.started
    cpu = _cpu_seconds(operator.pid)
    time.sleep(5)
    writes = _writes(state)[before:]
    result.figures.update({"restart -> steady s": steady, "CPU s (restart)": cpu,
                           "writes after restart": float(len(writes))})
    if writes:
        result.notes.append("writes after restart: " + ", ".join(
            sorted({f"{w['verb']} {w['objectRef'].get('resource')}" for w in writes})))


def _safe(probe: Callable[[], bool]) -> Callable[[], bool]:
    def safe() -> bool:
        try:
            return probe()
        except (OSError, http.client.HTTPException):
            return False
    return safe


def release_section(api: client.ApiClient, state: cluster.LabState, result: Result) -> None:
    core, resource = client.CoreV1Api(api), client.ResourceV1Api(api)
    writes_before = len(_writes(state))
    started = time.monotonic()
    core.delete_collection_namespaced_pod(NAMESPACE, grace_period_seconds=0, _preload_content=False)

    def count(kind: Callable[..., Any]) -> int:
        return len(json.loads(kind(NAMESPACE, _preload_content=False).data)["items"])

    pods_gone = 0.0
    last = -1

    def released() -> bool:
        nonlocal pods_gone, last
        if not pods_gone and count(core.list_namespaced_pod) == 0:
            pods_gone = time.monotonic() - started
        left = count(resource.list_namespaced_resource_claim)
        if left // 500 != last // 500:
            say(f"  release: {left} claims left after {time.monotonic() - started:.1f} s")
        last = left
        return left == 0

    _until("every claim deleted", released, 1800, 0.5)
    result.figures.update({"pods deleted s": pods_gone, "no claim left s": time.monotonic() - started})
    writes = _writes(state)[writes_before:]
    if writes:  # claimwarden's (the audit log has no other user's)
        result.figures["claimwarden writes during release"] = float(len(writes))
        result.notes.append("writes during release: " + ", ".join(
            f"{n} {kind}" for kind, n in sorted(Counter(f"{w['verb']} {w['objectRef'].get('resource')}"
                                                        for w in writes).items())))


def evictions_section(pods: int, nodes: int) -> dict[str, float] | None:
    """bench/eviction_throughput.py owns this measurement; it runs its own lab."""
    spec = importlib.util.spec_from_file_location("eviction_throughput", ROOT / "bench" / "eviction_throughput.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    measure = getattr(module, "measure", None)
    if measure is None:
        say("  evictions: bench/eviction_throughput.py has no measure(contender, *, pods, nodes, say) yet; skipped")
        return None
    figures: dict[str, float] = {}
    # The eviction bench names its contenders (claimwarden, upstream's controller at KCM defaults and at equal QPS).
    for contender in getattr(module, "CONTENDERS", ("claimwarden",)):
        say(f"evictions: {contender}, {pods} pods")
        for key, value in measure(contender, pods=pods, nodes=nodes, say=say).items():
            figures[f"{contender}: {key}"] = value
    return figures


# --- one contender at one budget --------------------------------------------------------------

def run_contender(name: str, qps: float, args: argparse.Namespace, tmp: Path) -> Result:
    upstream = name == "kube-controller-manager"
    tree = args.baseline if name == "baseline" else args.snapshot
    result = Result(name, qps)
    directory = tmp / f"{name}-{qps:g}"
    say(f"{name} at QPS {qps:g}: starting a lab with {args.nodes} nodes")
    started = time.monotonic()
    state = cluster.up(cluster.LabOptions(dir=directory, nodes=args.nodes, upstream_claims=upstream,
                                          kcm_qps=qps if upstream else HIGH_KCM_QPS), say=lambda _: None)
    operator: Claimwarden | None = None
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
            writes_before = len(_writes(state))
            kcm = next(p.pid for p in state.processes if "controller-manager" in p.name)
            if "claims" in args.sections:
                claims_section(api, args.pods, operator.pid if operator else kcm, result)
                if operator is not None:
                    writes = _writes(state)[writes_before:]
                    result.figures["claimwarden writes/pod"] = len(writes) / args.pods
            if "memory" in args.sections and "claims" in args.sections:
                memory_section(api, operator.pid if operator else kcm, args.pods, operator, result)
            if "restart" in args.sections and operator is not None and "claims" in args.sections:
                restart_section(state, operator, args.pods, result)
            if "release" in args.sections and "claims" in args.sections and qps == max(args.qps):
                release_section(api, state, result)
    finally:
        if operator is not None:
            operator.stop()
        cluster.down(directory, say=lambda _: None)
    for key, value in result.figures.items():
        say(f"  {key}: {value:.2f}")
    return result


# --- the table ----------------------------------------------------------------------------------

def table(results: list[Result], args: argparse.Namespace, evictions: dict[str, float] | None) -> str:
    lines = [f"conditions: {args.pods} pods (8 creating threads), {args.nodes} kwok nodes x 8 GPUs, "
             f"Kubernetes {cluster.K8S_VERSION}, {os.cpu_count()} CPUs ({platform.processor() or platform.machine()}), "
             f"every contender in a fresh lab, one after the other",
             "QPS = the same client budget for both: KCM --kube-api-qps=Q --kube-api-burst=2Q, claimwarden "
             "--kube-api-qps=Q --kube-api-burst=2Q; the lab's own KCM (garbage collector) at "
             f"{HIGH_KCM_QPS:g} in claimwarden's labs",
             "", "| QPS | measure | claimwarden | kube-controller-manager | claimwarden / KCM |"
             + (f" baseline ({args.baseline}, no client budget) |" if args.baseline else ""),
             "| --- | --- | --- | --- | --- |" + (" --- |" if args.baseline else "")]
    for qps in args.qps:
        ours, theirs, before = (next((r for r in results if r.contender == name and r.qps == qps), None)
                                for name in ("claimwarden", "kube-controller-manager", "baseline"))
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
    if evictions is not None:
        lines += ["", "| evictions | value |", "| --- | --- |"]
        lines += [f"| {k} | {_fmt(v)} |" for k, v in evictions.items()]
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
    parser.add_argument("--nodes", type=int, default=125)
    parser.add_argument("--qps", type=lambda t: [float(x) for x in t.split(",")], default=[1000.0, 20.0],
                        help="client budgets to compare at, comma-separated (default: 1000,20)")
    parser.add_argument("--sections", type=lambda t: tuple(t.split(",")), default=SECTIONS)
    parser.add_argument("--contenders", type=lambda t: tuple(t.split(",")),
                        default=("claimwarden", "kube-controller-manager"))
    parser.add_argument("--claimwarden-args", type=lambda t: t.split(), default=[],
                        help="more flags for claimwarden run")
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
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        # claimwarden runs from a copy taken now, so that editing the tree during a run changes nothing.
        args.snapshot = Path(tmp) / "snapshot"
        shutil.copytree(ROOT / "operator", args.snapshot / "operator", ignore=shutil.ignore_patterns("__pycache__"))
        say(f"claimwarden from {ROOT} at {_describe(ROOT)}" + (f"; baseline {args.baseline} at "
                                                               f"{_describe(args.baseline)}" if args.baseline else ""))
        for qps in args.qps:
            names = [*args.contenders, *(["baseline"] if args.baseline and qps == max(args.qps)
                                         and "baseline" not in args.contenders else [])]
            for name in names:
                try:
                    results.append(run_contender(name, qps, args, Path(tmp)))
                except Timeout as exc:  # one contender's failure is reported; the others still run
                    say(f"{name} at QPS {qps:g}: {exc}")
                    results.append(Result(name, qps, notes=[str(exc)]))
    evictions = evictions_section(args.pods, args.nodes) if "evictions" in args.sections else None
    print()
    print(table(results, args, evictions), flush=True)


if __name__ == "__main__":
    main()
