"""Benchmark: how fast, and at what API cost, pods on deliberately marked devices are evicted.

The set-up is the one of issue 19: nodes of 8 GPUs each, every device in use, and a set of nodes
"broken" (all their devices marked at once) so that N pods must go (rounded up to whole nodes); about
20 % of the nodes stay healthy and keep their pods (an evictor must leave them alone). 1,000 pods = 125
broken nodes of 150.

- ``claimwarden``: one annotation patch per broken node's slice, naming its devices; the breaker and
  the eviction budget are off (``--breaker-max-fraction=1 --eviction-qps=0``). Also timed until the
  records count every eviction.
- ``upstream-equal-qps``: kube-controller-manager's device-taint-eviction controller, one NoExecute
  DeviceTaintRule per broken pool (``DRADeviceTaints``, ``resource.k8s.io/v1alpha3``), KCM at
  ``--kube-api-qps=1000`` (claimwarden's client is unthrottled).
- ``upstream``: the same at KCM's default client budget (20 QPS, burst 30): throttled, for reference.

Every lab's own kube-controller-manager (its garbage collector, which deletes the evicted pods'
claims) runs at ``--kube-api-qps=1000``: at KCM's default 20 the claims' deletion would stretch
claimwarden's bookkeeping over a minute and compete with the evictions (the confound named in
hot-path-anatomy §3.3).

``pods_per_device=8`` is the shared variant: one standalone ResourceClaim per device, named by 8 pods,
on the broken nodes only (see `Layout`).

The lab audits every request (``LabOptions.audit_all``), so API calls are counted from the
apiserver's audit log, by user agent (claimwarden's and Kopf's; KCM's), watches left out:
- "in the window": from the first mark until every target pod is evicted;
- "total": from the first mark until the contender is quiet (its bookkeeping, releases included).
CPU seconds are the contender's process (/proc) over the total.

    .venv/bin/python bench/eviction_throughput.py                          # claimwarden only
    .venv/bin/python bench/eviction_throughput.py --contenders claimwarden,upstream-equal-qps,upstream
    .venv/bin/python bench/eviction_throughput.py --pods-per-device 8      # the shared variant
    .venv/bin/python bench/eviction_throughput.py --profile /tmp/evict.txt  # py-spy over the eviction phase

``measure()`` is what bench/suite.py calls.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubernetes import client, config

from claimwarden_lab import cluster, driver
from claimwarden_lab.processes import free_port

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_ARGS = "--breaker-max-fraction=1 --eviction-qps=0"
NAMESPACE = "bench"
CONTENDERS = ("claimwarden", "upstream-equal-qps", "upstream")
EQUAL_QPS = 1000.0
GPUS_PER_NODE = 8
SPARE_FRACTION = 0.2  # healthy nodes beside the broken ones, full of pods that must stay
TAINT_GATES = "DRADeviceTaints=true"
TAINT_API = "resource.k8s.io/v1alpha3"
TIMEOUT = 900.0  # plus TIMEOUT_PER_POD for every pod of the lab (throttled upstream creates claims at 20 QPS)
TIMEOUT_PER_POD = 0.3
QUIET_SECONDS = 3.0  # the contender counts as done once it made no API call for this long
QUIET_LIMIT = 180.0  # ... or this long after every pod was evicted, plus QUIET_LIMIT_PER_POD per target pod
QUIET_LIMIT_PER_POD = 0.15  # throttled upstream releases claims at 20 QPS, 2 writes each
# Whose requests count as the contender's (user agents starting with, and naming one of): claimwarden's own
# client and Kopf's; KCM's device-taint-eviction and resourceclaim controllers (KCM appends the controller's
# name). KCM's garbage collector is left out on both sides: in claimwarden's lab it deletes the claims too.
AGENTS = {"claimwarden": (("claimwarden", "kopf"), ()),
          "upstream": (("kube-controller-manager",),
                       ("/device-taint-eviction-controller", "/resource-claim-controller"))}

Say = Callable[[str], None]


class BenchError(RuntimeError):
    """The measurement could not finish (a timeout, claimwarden exiting): the caller reports it and goes on."""


@dataclass(frozen=True)
class Layout:
    """How many nodes the lab has, how many of them break, and the pods on them.

    One pod per device: every device of every node holds a pod; the broken nodes plus ~20 % spare ones.
    Shared (`pods_per_device` > 1): one standalone claim per device of the broken nodes only, no spare node,
    so that every device of every node is held and each broken pool gets one DeviceTaintRule (with spare
    devices the scheduler scatters the claims, and upstream needs a rule per device)."""

    nodes: int
    broken: int
    pods_per_device: int
    gpus_per_node: int = GPUS_PER_NODE

    @classmethod
    def for_pods(cls, pods: int, *, pods_per_device: int = 1, gpus_per_node: int = GPUS_PER_NODE) -> Layout:
        broken = math.ceil(pods / pods_per_device / gpus_per_node)
        spare = 0 if pods_per_device > 1 else max(1, math.ceil(broken * SPARE_FRACTION))
        return cls(nodes=broken + spare, broken=broken, pods_per_device=pods_per_device, gpus_per_node=gpus_per_node)

    @property
    def devices(self) -> int:
        """Devices in use: all of them."""
        return self.nodes * self.gpus_per_node

    @property
    def targets(self) -> int:
        """Pods to evict: all pods of the broken nodes (N rounded up to whole nodes)."""
        return self.broken * self.gpus_per_node * self.pods_per_device


def _upstream(contender: str) -> bool:
    return contender.startswith("upstream")


def _until(what: str, probe: Callable[[], bool], timeout: float = TIMEOUT, interval: float = 0.1) -> None:
    deadline = time.monotonic() + timeout
    while not probe():
        if time.monotonic() > deadline:
            raise BenchError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)


def lab_options(contender: str, *, directory: Path, layout: Layout) -> cluster.LabOptions:
    """The fresh lab each contender runs in: the lab's KCM at 1,000 QPS except for throttled upstream."""
    if contender not in CONTENDERS:
        raise ValueError(f"unknown contender {contender!r}; one of {', '.join(CONTENDERS)}")
    options = cluster.LabOptions(dir=directory, nodes=layout.nodes, gpus_per_node=layout.gpus_per_node,
                                 audit_all=True, kcm_qps=0 if contender == "upstream" else EQUAL_QPS)
    if not _upstream(contender):
        return options
    options.upstream_claims = True
    options.feature_gates, options.runtime_config = TAINT_GATES, f"{TAINT_API}=true"
    return options


def measure(contender: str, *, pods: int, say: Say, pods_per_device: int = 1,
            claimwarden_args: str = DEFAULT_ARGS, profile: Path | None = None,
            source: Path | None = None, nodes: int | None = None) -> dict[str, float]:
    """One contender in a fresh lab; see the module docstring. Returns, among others: `evicted_s`
    (marks -> every target pod evicted), `recorded_s` (claimwarden: -> the records count them all),
    `quiet_s`, `writes_per_pod`/`reads_per_pod` (total) and `window_writes_per_pod`/`window_reads_per_pod`,
    `cpu_s`, `targets`.

    `source`: a checkout whose operator/ claimwarden runs from (another branch, say), instead of this one.
    `nodes` is ignored (the layout follows from `pods`); it is accepted for older callers."""
    del nodes
    layout = Layout.for_pods(pods, pods_per_device=pods_per_device)
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp) / "lab"
        options = lab_options(contender, directory=directory, layout=layout)
        say(f"{contender}: a lab of {layout.nodes} nodes x {layout.gpus_per_node} devices, {layout.broken} to break, "
            f"{layout.pods_per_device} pod(s) per device")
        state = cluster.up(options, say=lambda _: None)
        operator: subprocess.Popen[bytes] | None = None
        try:
            kubectl = [f"{state.bin_dir}/kubectl", f"--kubeconfig={state.kubeconfig}"]
            if contender == "claimwarden":
                operator = _start_claimwarden(kubectl, state, Path(tmp), shlex.split(claimwarden_args), source)
            with config.new_client_from_config(config_file=str(state.kubeconfig)) as api:
                return _run(api, contender, state, layout, say, operator=operator, profile=profile)
        finally:
            try:
                if operator is not None:
                    _stop(operator, say)
            finally:
                cluster.down(directory, say=lambda _: None)


def _stop(operator: subprocess.Popen[bytes], say: Say) -> None:
    """SIGTERM, and SIGKILL after 30 s (reported: a pod would have been killed too), so the lab always goes."""
    operator.terminate()
    try:
        operator.wait(30)
    except subprocess.TimeoutExpired:
        say("claimwarden did not stop within 30 s of SIGTERM (a pod's grace period): killed")
        operator.kill()
        operator.wait()


def _start_claimwarden(kubectl: list[str], state: cluster.LabState, tmp: Path, extra: list[str],
                       source: Path | None) -> subprocess.Popen[bytes]:
    for kustomization in ("crds", "manifests/approval"):
        subprocess.run([*kubectl, "apply", "-k", str(ROOT / kustomization)], check=True, capture_output=True)
    subprocess.run([*kubectl, "wait", "--for=condition=Established", "--timeout=60s",
                    "crd/unhealthydevices.claimwarden.io"], check=True, capture_output=True)
    log = (tmp / "claimwarden.log").open("wb")
    operator = subprocess.Popen(
        [sys.executable, "-m", "claimwarden", "run", "--kubeconfig", str(state.kubeconfig), "--leader-elect=false",
         "--metrics-port", str(free_port()), "--liveness", f"http://127.0.0.1:{free_port()}/healthz", *extra],
        stdout=log, stderr=subprocess.STDOUT,
        env={**os.environ, "PYTHONPATH": str(source / "operator")} if source is not None else None)
    time.sleep(5)
    if operator.poll() is not None:
        raise BenchError(f"claimwarden exited with {operator.returncode}: {(tmp / 'claimwarden.log').read_text()}")
    return operator


def _pod(name: str, claim: dict[str, str]) -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": {
        "containers": [{"name": "c", "image": "x", "resources": {"claims": [{"name": "gpu"}]}}],
        "resourceClaims": [{"name": "gpu", **claim}]}}


GPU_REQUEST = {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": driver.DEVICE_CLASS}}]}}


def _create_workload(core: client.CoreV1Api, resource: client.ResourceV1Api, layout: Layout) -> int:
    """One pod per device (a claim template), or `pods_per_device` pods per standalone claim; returns
    how many pods were created."""
    core.create_namespace(body={"metadata": {"name": NAMESPACE}})
    if layout.pods_per_device == 1:
        resource.create_namespaced_resource_claim_template(NAMESPACE, body={
            "metadata": {"name": "gpu"}, "spec": {"spec": GPU_REQUEST}})
        pods = [_pod(f"pod-{i:05d}", {"resourceClaimTemplateName": "gpu"}) for i in range(layout.devices)]
    else:
        for c in range(layout.devices):
            resource.create_namespaced_resource_claim(NAMESPACE, body={
                "metadata": {"name": f"gpu-{c:04d}"}, "spec": GPU_REQUEST})
        pods = [_pod(f"pod-{c:04d}-{p}", {"resourceClaimName": f"gpu-{c:04d}"})
                for c in range(layout.devices) for p in range(layout.pods_per_device)]
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda body: core.create_namespaced_pod(NAMESPACE, body=body, _preload_content=False), pods))
    return len(pods)


def _holders(api: client.ApiClient) -> dict[tuple[str, str], list[str]]:
    """(pool, device) -> the names of the pods its claim is reserved for."""
    held: dict[tuple[str, str], list[str]] = {}
    for claim in list_objects(api, f"/apis/resource.k8s.io/v1/namespaces/{NAMESPACE}/resourceclaims",
                              metadata=False):
        status = claim.get("status") or {}
        for result in ((status.get("allocation") or {}).get("devices") or {}).get("results") or []:
            held.setdefault((result["pool"], result["device"]), []).extend(
                r["name"] for r in status.get("reservedFor") or [])
    return held


def _mark(api: client.ApiClient, contender: str, marked: dict[str, list[str]]) -> None:
    """claimwarden: one annotation patch per slice naming its marked devices. Upstream: one NoExecute
    DeviceTaintRule per pool whose every device is marked, else one per device."""
    resource, objects = client.ResourceV1Api(api), client.CustomObjectsApi(api)
    slices = {s.spec.pool.name: s for s in resource.list_resource_slice().items}
    for pool, devices in marked.items():
        if not _upstream(contender):
            resource.patch_resource_slice(slices[pool].metadata.name, {"metadata": {"annotations": {
                f"unhealthy.claimwarden.io/{device}": "benchmark: deliberately marked" for device in devices}}})
            continue
        everything = {d.name for d in slices[pool].spec.devices} <= set(devices)
        selectors = [{"driver": driver.DRIVER, "pool": pool}] if everything else \
            [{"driver": driver.DRIVER, "pool": pool, "device": device} for device in sorted(devices)]
        for i, selector in enumerate(selectors):
            objects.create_cluster_custom_object("resource.k8s.io", TAINT_API.split("/")[1], "devicetaintrules", {
                "apiVersion": TAINT_API, "kind": "DeviceTaintRule", "metadata": {"name": f"bench-{pool}-{i}"},
                "spec": {"deviceSelector": selector,
                         "taint": {"key": "bench.example.com/broken", "value": "yes", "effect": "NoExecute"}}})


def _run(api: client.ApiClient, contender: str, state: cluster.LabState, layout: Layout, say: Say, *,
         operator: subprocess.Popen[bytes] | None, profile: Path | None) -> dict[str, float]:
    core, resource = client.CoreV1Api(api), client.ResourceV1Api(api)
    started = time.monotonic()
    created = _create_workload(core, resource, layout)

    def running() -> bool:
        pods = list_objects(api, f"/api/v1/namespaces/{NAMESPACE}/pods", metadata=False)
        return sum((p.get("status") or {}).get("phase") == "Running" for p in pods) == created
    limit = TIMEOUT + TIMEOUT_PER_POD * created
    _until(f"{created} pods running", running, limit, interval=1)
    setup = time.monotonic() - started
    say(f"{contender}: set-up: {created} pods running after {setup:.0f} s")

    held = _holders(api)
    broken = sorted({pool for pool, _ in held})[:layout.broken]  # every device is in use: the first nodes break
    marked = {pool: sorted(device for p, device in held if p == pool) for pool in broken}
    targets = {pod for (pool, _), pods in held.items() if pool in broken for pod in pods}
    if not targets:
        raise BenchError(f"{contender}: no allocated claim reserved for a pod; nothing to evict")
    audit = Audit(state.audit_log, *AGENTS["upstream" if _upstream(contender) else "claimwarden"])
    # CPU seconds (utime + stime from /proc): the contender's process, and the apiserver's.
    contender_pid = operator.pid if operator is not None else next(
        p.pid for p in state.processes if p.name == "kube-controller-manager")
    apiserver_pid = next(p.pid for p in state.processes if p.name == "kube-apiserver")
    cpu_before = _cpu_seconds(contender_pid), _cpu_seconds(apiserver_pid)
    profiler = _start_profiler(operator, profile) if profile is not None and operator is not None else None

    marked_at = time.monotonic()
    _mark(api, contender, marked)
    marking = time.monotonic() - marked_at
    _wait_evicted(api, contender, targets, marked_at, say, limit)
    evicted = time.monotonic() - marked_at
    window = audit.offset()
    figures = {"evicted_s": evicted, "marking_s": marking, "setup_s": setup, "targets": float(len(targets))}
    say(f"{contender}: every one of {len(targets)} pods evicted {evicted:.2f} s after the first mark "
        f"({len(marked)} pools, marking took {marking:.2f} s)")
    if operator is not None:
        objects = client.CustomObjectsApi(api)

        def counted() -> bool:
            items = objects.list_cluster_custom_object("claimwarden.io", "v1alpha1", "unhealthydevices")["items"]
            return sum(int((r.get("status") or {}).get("podsEvicted") or 0) for r in items) >= len(targets)
        _until("the records counting every eviction", counted, limit, interval=0.25)
        figures["recorded_s"] = time.monotonic() - marked_at
        say(f"{contender}: every eviction counted in the records after {figures['recorded_s']:.2f} s")
    quiet = audit.wait_quiet(QUIET_SECONDS, QUIET_LIMIT + QUIET_LIMIT_PER_POD * len(targets))
    figures["quiet_s"] = time.monotonic() - marked_at
    if not quiet:
        figures["quiet_limit_hit"] = 1.0  # the totals stop there: the contender was still busy
        say(f"{contender}: still making API calls {figures['quiet_s']:.0f} s after the mark; the totals stop here")
    figures["cpu_s"] = _cpu_seconds(contender_pid) - cpu_before[0]
    figures["apiserver_cpu_s"] = _cpu_seconds(apiserver_pid) - cpu_before[1]
    if profiler is not None and profile is not None:
        _stop_profiler(profiler)
        say(f"{contender}: profile of the eviction phase in {profile}")
    calls = audit.calls()
    for prefix, counted_calls in (("window_", audit.calls(until=window)), ("", calls)):
        reads = sum(n for (verb, _), n in counted_calls.items() if verb in ("get", "list"))
        figures[f"{prefix}reads_per_pod"] = reads / len(targets)
        figures[f"{prefix}writes_per_pod"] = (sum(counted_calls.values()) - reads) / len(targets)
    say(f"{contender}: quiet {figures['quiet_s']:.1f} s after the mark; {figures['cpu_s']:.1f} CPU s, kube-apiserver "
        f"{figures['apiserver_cpu_s']:.1f}; per pod {figures['writes_per_pod']:.2f} writes + "
        f"{figures['reads_per_pod']:.2f} reads ({figures['window_writes_per_pod']:.2f} + "
        f"{figures['window_reads_per_pod']:.2f} in the window): "
        + ", ".join(f"{n} {verb} {what}" for (verb, what), n in calls.most_common(8)))
    return figures


def _wait_evicted(api: client.ApiClient, contender: str, targets: set[str], since: float, say: Say,
                  limit: float) -> None:
    """Until every target pod is terminating or gone (metadata-only lists: polling must not cost the
    machine what it measures)."""
    last_said = [time.monotonic()]

    def all_evicted() -> bool:
        alive = {item["metadata"]["name"] for item in list_objects(api, f"/api/v1/namespaces/{NAMESPACE}/pods")
                 if not item["metadata"].get("deletionTimestamp")}
        remaining = len(targets & alive)
        if time.monotonic() - last_said[0] >= 10:
            say(f"{contender}: {len(targets) - remaining} of {len(targets)} pods evicted after "
                f"{time.monotonic() - since:.0f} s")
            last_said[0] = time.monotonic()
        return remaining == 0

    _until("every target pod evicted", all_evicted, limit, interval=0.25)


class Audit:
    """The contender's requests in the apiserver's audit log from now on (by user agent, watches left out)."""

    def __init__(self, path: Path, agents: tuple[str, ...], within: tuple[str, ...] = ()) -> None:
        self.path, self.agents, self.within = path, agents, within
        self.start = self.offset()

    def offset(self) -> int:
        return self.path.stat().st_size

    def calls(self, until: int | None = None) -> Counter[tuple[str, str]]:
        return count_calls(_audit_lines(self.path, self.start, until), self.agents, self.within)

    def wait_quiet(self, quiet: float, limit: float) -> bool:
        """Until the contender made no call for `quiet` seconds (True), or `limit` seconds passed (False)."""
        deadline = time.monotonic() + limit
        offset, last_call = self.offset(), time.monotonic()
        while time.monotonic() - last_call < quiet and time.monotonic() < deadline:
            time.sleep(0.5)
            end = self.offset()
            if count_calls(_audit_lines(self.path, offset, end), self.agents, self.within):
                last_call = time.monotonic()
            offset = end
        return time.monotonic() - last_call >= quiet


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def list_objects(api: client.ApiClient, path: str, *, metadata: bool = True,
          query: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """A list as plain dicts, metadata-only by default: polling must not cost the machine what it measures."""
    accept = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1" if metadata else "application/json"
    params = api.param_serialize("GET", path, query_params=list((query or {}).items()),
                                 header_params={"Accept": accept}, auth_settings=["BearerToken"])
    response = api.call_api(*params)
    response.read()
    return list(json.loads(response.data).get("items") or [])


def _audit_lines(path: Path, offset: int, until: int | None = None) -> list[str]:
    with path.open("rb") as handle:
        handle.seek(offset)
        data = handle.read() if until is None else handle.read(max(0, until - offset))
    return data.decode(errors="replace").splitlines()


def count_calls(lines: Iterable[str], agents: tuple[str, ...],
                within: tuple[str, ...] = ()) -> Counter[tuple[str, str]]:
    """(verb, resource[/subresource]) -> completed requests by clients whose user agent starts with one of
    `agents` (and, if given, contains one of `within`); watches are left out (one long request each, not a
    call per pod)."""
    counts: Counter[tuple[str, str]] = Counter()
    needles = tuple(f'"userAgent":"{agent}' for agent in agents)
    for line in lines:
        if not any(needle in line for needle in needles):  # most lines are other clients': skip the decoding
            continue
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if event.get("stage") != "ResponseComplete" or event.get("verb") == "watch":
            continue
        agent = str(event.get("userAgent") or "")
        if not agent.startswith(agents) or (within and not any(part in agent for part in within)):
            continue
        ref = event.get("objectRef") or {}
        what = (ref.get("resource") or event.get("requestURI", "?")) + (
            f"/{ref['subresource']}" if ref.get("subresource") else "")
        counts[(str(event.get("verb")), what)] += 1
    return counts


def _start_profiler(operator: subprocess.Popen[bytes], path: Path) -> subprocess.Popen[bytes]:
    spy = Path(sys.executable).with_name("py-spy")
    if not spy.exists():
        raise SystemExit(f"--profile needs py-spy ({spy} is missing): pip install -e '.[dev]'")
    # --gil: only samples that hold the GIL, i.e. Python at work, not threads waiting for it.
    profiler = subprocess.Popen([str(spy), "record", "--pid", str(operator.pid), "--rate", "100", "--gil",
                                 "--format", "raw", "--output", str(path)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    time.sleep(1)
    if profiler.poll() is not None:
        raise SystemExit(f"py-spy exited: {profiler.stderr.read().decode() if profiler.stderr else ''}")
    return profiler


def _stop_profiler(profiler: subprocess.Popen[bytes]) -> None:
    os.kill(profiler.pid, signal.SIGINT)
    profiler.wait(60)


def top_frames(raw: Path, count: int = 12) -> tuple[list[tuple[str, float]], list[tuple[str, float]]]:
    """From py-spy's raw (collapsed) output, by function: those with the most samples of their own, and
    claimwarden's own functions on the stack the most, each with its share of all samples."""
    own: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, samples = line.rpartition(" ")
        if not stack or not samples.isdigit():
            continue
        frames = [_function(frame) for frame in stack.split(";")]
        n = int(samples)
        total += n
        own[frames[-1]] += n
        for frame in set(frames):
            if "claimwarden/" in frame and "cli.py" not in frame and "__main__" not in frame:
                inclusive[frame] += n
    share = max(total, 1)
    return ([(f, n / share) for f, n in own.most_common(count)],
            [(f, n / share) for f, n in inclusive.most_common(count)])


def _function(frame: str) -> str:
    """"name (path/file.py:123)" without the line number."""
    name, _, where = frame.partition(" (")
    return f"{name} ({where.rsplit(':', 1)[0]})" if where else name


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pods", type=int, default=1000, help="pods to evict (the broken nodes follow from it)")
    parser.add_argument("--pods-per-device", type=int, default=1)
    parser.add_argument("--contenders", default="claimwarden",
                        help=f"comma-separated, each in a fresh lab: {', '.join(CONTENDERS)}")
    parser.add_argument("--claimwarden-args", default=DEFAULT_ARGS)
    parser.add_argument("--profile", type=Path, default=None,
                        help="record claimwarden with py-spy over the eviction phase (raw collapsed stacks)")
    parser.add_argument("--baseline", type=Path, default=None, metavar="CHECKOUT",
                        help="also run claimwarden from another checkout's operator/ (e.g. /work/main), first")
    args = parser.parse_args()

    def say(line: str) -> None:
        print(line, flush=True)

    results: dict[str, dict[str, float]] = {}
    common = {"pods": args.pods, "say": say, "pods_per_device": args.pods_per_device,
              "claimwarden_args": args.claimwarden_args}
    if args.baseline is not None:
        results[f"claimwarden@{args.baseline.name}"] = measure(
            "claimwarden", **common, source=args.baseline,
            profile=args.profile.with_suffix(".baseline.txt") if args.profile else None)
    for contender in args.contenders.split(","):
        results[contender] = measure(contender, **common,
                                     profile=args.profile if contender == "claimwarden" else None)
    layout = Layout.for_pods(args.pods, pods_per_device=args.pods_per_device)
    say(f"\n{layout.targets} pods to evict on {layout.broken} of {layout.nodes} nodes x {layout.gpus_per_node}, "
        f"{layout.pods_per_device} per device; seconds from the marks; calls per evicted pod (in the window)")
    say(f"{'contender':<24} {'all evicted':>12} {'recorded':>9} {'writes/pod':>14} {'reads/pod':>14} {'CPU s':>7} "
        f"{'apiserver CPU s':>16}")
    for contender, f in results.items():
        recorded = f"{f['recorded_s']:.2f}" if "recorded_s" in f else "-"
        writes = f"{f['writes_per_pod']:.2f} ({f['window_writes_per_pod']:.2f})"
        reads = f"{f['reads_per_pod']:.2f} ({f['window_reads_per_pod']:.2f})"
        say(f"{contender:<24} {f['evicted_s']:>12.2f} {recorded:>9} {writes:>14} {reads:>14} {f['cpu_s']:>7.1f} "
            f"{f['apiserver_cpu_s']:>16.1f}")
    for path in (args.profile.with_suffix(".baseline.txt"), args.profile) if args.profile else ():
        if not path.exists():
            continue
        own, inclusive = top_frames(path)
        say(f"\n{path}: top frames (own samples, GIL held):")
        for frame, part in own:
            say(f"  {part:6.1%}  {frame}")
        say("claimwarden's functions on the stack the most:")
        for frame, part in inclusive:
            say(f"  {part:6.1%}  {frame}")


if __name__ == "__main__":
    main()
