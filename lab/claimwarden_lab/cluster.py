"""`claimwarden lab`: a real control plane on loopback, with kwok nodes and a fake DRA driver."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from kubernetes import client, config

from . import driver, pki, presets, realnode
from .audit_policy import AUDIT_POLICY, AUDIT_POLICY_ALL
from .binaries import K8S_VERSION, STAGES_FILE, bin_dir, require_binaries, resolve_version
from .guests import guests, stop_guests
from .processes import (
    LabError,
    Process,
    free_port,
    http_ok,
    is_running,
    port_is_free,
    start,
    stop,
    wait_until,
)
from .slice_taints import raw_json

STATE_FILE = "state.json"
START_TIMEOUT = 120.0
Say = Callable[[str], None]

def default_dir() -> Path:
    return Path.home() / ".cache" / "claimwarden" / "lab"


@dataclass
class LabOptions:
    dir: Path = field(default_factory=default_dir)
    nodes: int = 2
    gpus_per_node: int = 8
    models: str | None = None
    upstream_claims: bool = False
    feature_gates: str = ""
    runtime_config: str = ""
    api_port: int = 0
    priority_and_fairness: bool = False
    """API Priority and Fairness on, as in real clusters (off by default: the lab is one client's)."""
    max_requests_inflight: int = 0
    """With priority and fairness: the apiserver's total seats (read-only; mutating get half), 0 = its default."""
    real_node: bool = False  # one real kubelet node beside the kwok nodes (realnode.py)
    kubernetes: str = K8S_VERSION
    """The control plane's version: 1.34 to 1.37 (binaries per version, see binaries.py)."""
    presets: str = ""
    """Comma-separated names from presets.py (device-taints, extended-resources, podgroups, resource-health): the
    gates and runtime-config that turn the feature on for this version, merged before feature_gates/runtime_config."""
    kcm_qps: float = 0
    """kube-controller-manager's client budget (--kube-api-qps, burst twice that); 0 = its default, 20.
    Raise it so that the lab's own garbage collector and eviction controller are not what a benchmark measures."""
    audit_all: bool = False
    """Audit every request (reads and every client's writes too), for benchmarks that count API calls."""
    profile: str = driver.PROFILE_PLAIN
    """The fake driver's devices (driver.PROFILES): ``partitionable`` adds each GPU's halves and counter sets,
    and the partitionable-devices preset with them."""

    def all_presets(self) -> str:
        """``presets``, plus what the device profile needs."""
        wanted = [n for n in self.presets.split(",") if n.strip()]
        if self.profile == driver.PROFILE_PARTITIONABLE and "partitionable-devices" not in wanted:
            wanted.append("partitionable-devices")
        return ",".join(wanted)

    def validate(self) -> list[driver.GpuModel]:
        if not 1 <= self.nodes <= 1000:
            raise LabError(f"--nodes {self.nodes} is out of range; give 1 to 1000")
        if not 1 <= self.gpus_per_node <= 128:
            raise LabError(f"--gpus-per-node {self.gpus_per_node} is out of range; give 1 to 128 "
                           "(a ResourceSlice lists at most 128 devices)")
        if self.kcm_qps < 0:
            raise LabError(f"--kcm-qps {self.kcm_qps} is negative; give 0 for kube-controller-manager's default")
        if self.profile not in driver.PROFILES:
            raise LabError(f"unknown device profile {self.profile!r}; choose from {', '.join(driver.PROFILES)}")
        presets.resolve(resolve_version(self.kubernetes), self.all_presets())
        if self.api_port and not 1024 <= self.api_port <= 65535:
            raise LabError(f"--api-port {self.api_port} is out of range; give 1024 to 65535, or 0 for any")
        try:
            return driver.parse_models(self.models)
        except driver.LabConfigError as exc:
            raise LabError(str(exc)) from None


@dataclass
class LabState:
    """What `up` started, persisted in DIR/state.json as each piece starts."""

    dir: Path
    bin_dir: str = ""
    api_url: str = ""
    ports: dict[str, int] = field(default_factory=dict)
    processes: list[Process] = field(default_factory=list)
    options: dict[str, Any] = field(default_factory=dict)
    ready: bool = False

    @property
    def kubeconfig(self) -> Path:
        return self.dir / "kubeconfig"

    @property
    def audit_log(self) -> Path:
        """The apiserver's audit log: JSON lines, one per write by claimwarden and per eviction."""
        return self.dir / "logs" / "audit.log"

    def save(self) -> None:
        data = {"bin_dir": self.bin_dir, "api_url": self.api_url, "ports": self.ports,
                "processes": [p.to_json() for p in self.processes], "options": self.options,
                "ready": self.ready}
        tmp = self.dir / (STATE_FILE + ".tmp")
        tmp.write_text(json.dumps(data, indent=2))
        tmp.replace(self.dir / STATE_FILE)

    @classmethod
    def load(cls, directory: Path) -> LabState | None:
        path = directory / STATE_FILE
        if not path.is_file():
            return None
        try:
            data = json.loads(path.read_text())
            return cls(dir=directory, bin_dir=data["bin_dir"], api_url=data["api_url"],
                       ports=data["ports"], processes=[Process.from_json(p) for p in data["processes"]],
                       options=data.get("options", {}), ready=bool(data.get("ready")))
        except (ValueError, KeyError, TypeError) as exc:
            raise LabError(f"{path} is unreadable ({exc}); remove {directory} and run 'lab up' again") from None

    def running(self) -> list[Process]:
        return [p for p in self.processes if is_running(p)]


def _prepare_dir(directory: Path, say: Say) -> LabState | None:
    """Return the running lab in ``directory``, or clear the directory for a new one."""
    state = LabState.load(directory)
    if state is not None:
        alive = state.running()
        if alive and len(alive) == len(state.processes) and state.ready:
            return state
        if alive:
            dead = sorted({p.name for p in state.processes} - {p.name for p in alive})
            raise LabError(f"the lab in {directory} is half running ({', '.join(dead) or 'start-up'} "
                           f"not up); run 'claimwarden lab down --dir {directory}' and then 'lab up'")
        say(f"removing a stale lab in {directory} left by a killed run (none of its processes is alive)")
    if directory.exists() and any(directory.iterdir()) and state is None:
        raise LabError(f"{directory} is not empty and holds no claimwarden lab; give an empty or new --dir")
    if directory.exists():
        shutil.rmtree(directory)
    return None


def up(options: LabOptions, say: Say = print) -> LabState:
    """Start the lab and return once the apiserver is ready, nodes are Ready and slices published."""
    models = options.validate()
    version = resolve_version(options.kubernetes)
    gates, runtime_config = presets.resolve(version, options.all_presets(), options.feature_gates,
                                            options.runtime_config)
    options = dataclasses.replace(options, feature_gates=gates, runtime_config=runtime_config)
    bins = require_binaries(version=version)
    directory = options.dir.expanduser().resolve()
    running = _prepare_dir(directory, say)
    if running is not None:
        say(f"the lab in {directory} is already running ({running.api_url}); nothing changed")
        return running
    if options.api_port and not port_is_free(options.api_port):
        raise LabError(f"port {options.api_port} on 127.0.0.1 is already in use; pass another "
                       "--api-port (or 0 for any free port) or stop what listens there")

    started = time.monotonic()
    directory.mkdir(parents=True)
    (directory / "logs").mkdir()
    state = LabState(dir=directory, bin_dir=str(bins), options={
        "nodes": options.nodes, "gpus_per_node": options.gpus_per_node, "models": [m.name for m in models],
        "upstream_claims": options.upstream_claims, "feature_gates": options.feature_gates,
        "runtime_config": options.runtime_config, "real_node": options.real_node, "kubernetes": version,
        "presets": options.all_presets(), "kcm_qps": options.kcm_qps, "profile": options.profile})
    state.ports = {"etcd": free_port(), "etcd-peer": free_port(), "apiserver": options.api_port or free_port(),
                   "scheduler": free_port(), "controller-manager": free_port(), "kwok": free_port()}
    state.api_url = f"https://127.0.0.1:{state.ports['apiserver']}"
    state.save()
    try:
        _start_control_plane(state, options, bins, say)
        if options.real_node:
            # The kubelet is built for 1.34 only; kubelets may be three minor versions older than the
            # apiserver, so it serves the 1.35-1.37 control planes too.
            realnode.start(directory=directory, bins=bin_dir(K8S_VERSION), kubeconfig=state.kubeconfig,
                           api_port=state.ports["apiserver"], launch=lambda name, argv: _launch(state, name, argv),
                           say=say)
        _publish_cluster(state, options, models, say)
        state.ready = True
        state.save()
    except BaseException:
        _stop_all(state)
        if options.real_node:
            realnode.cleanup_host()
            realnode.unmount(directory)
        (directory / STATE_FILE).unlink(missing_ok=True)
        raise
    say(f"lab ready in {time.monotonic() - started:.1f}s: Kubernetes v{version}, {state.api_url}, "
        f"{options.nodes} node(s), kubeconfig {state.kubeconfig}")
    return state


def _launch(state: LabState, name: str, argv: list[str]) -> Process:
    proc = start(name, argv, state.dir / "logs")
    state.processes.append(proc)
    state.save()
    return proc


def _start_control_plane(state: LabState, options: LabOptions, bins: Path, say: Say) -> None:
    directory, ports = state.dir, state.ports
    pki_dir = directory / "pki"
    pki.write_pki(pki_dir)
    pki.write_kubeconfig(state.kubeconfig, pki_dir, state.api_url)
    gates = [f"--feature-gates={options.feature_gates}"] if options.feature_gates else []
    policy = directory / "audit" / "policy.yaml"
    policy.parent.mkdir()
    policy.write_text(AUDIT_POLICY_ALL if options.audit_all else AUDIT_POLICY)

    def launch(name: str, argv: list[str]) -> Process:
        return _launch(state, name, argv)

    say("starting etcd")
    etcd = launch("etcd", [
        str(bins / "etcd"), "--name=lab", f"--data-dir={directory / 'etcd'}",
        f"--listen-client-urls=http://127.0.0.1:{ports['etcd']}",
        f"--advertise-client-urls=http://127.0.0.1:{ports['etcd']}",
        f"--listen-peer-urls=http://127.0.0.1:{ports['etcd-peer']}",
        f"--initial-advertise-peer-urls=http://127.0.0.1:{ports['etcd-peer']}",
        f"--initial-cluster=lab=http://127.0.0.1:{ports['etcd-peer']}",
        "--unsafe-no-fsync=true", "--log-level=warn"])
    wait_until("etcd /health", lambda: http_ok(f"http://127.0.0.1:{ports['etcd']}/health"),
               START_TIMEOUT, [etcd])

    say("starting kube-apiserver")
    runtime = [f"--runtime-config={options.runtime_config}"] if options.runtime_config else []
    apiserver = launch("kube-apiserver", [
        str(bins / "kube-apiserver"), f"--etcd-servers=http://127.0.0.1:{ports['etcd']}",
        "--bind-address=127.0.0.1", f"--secure-port={ports['apiserver']}", "--advertise-address=127.0.0.1",
        "--endpoint-reconciler-type=none", f"--cert-dir={pki_dir}",
        f"--tls-cert-file={pki_dir / 'apiserver.crt'}", f"--tls-private-key-file={pki_dir / 'apiserver.key'}",
        f"--client-ca-file={pki_dir / 'ca.crt'}", "--authorization-mode=RBAC",
        f"--service-account-issuer={state.api_url}", f"--service-account-key-file={pki_dir / 'sa.pub'}",
        f"--service-account-signing-key-file={pki_dir / 'sa.key'}",
        "--service-cluster-ip-range=10.0.0.0/24", "--allow-privileged=true",
        # kwok's pods need no token; a real node's pods do (realnode.py).
        "--disable-admission-plugins=" + ("TaintNodesByCondition" if options.real_node
                                          else "ServiceAccount,TaintNodesByCondition"),
        f"--enable-priority-and-fairness={str(options.priority_and_fairness).lower()}",
        *([f"--max-requests-inflight={options.max_requests_inflight}",
           f"--max-mutating-requests-inflight={max(1, options.max_requests_inflight // 2)}"]
          if options.max_requests_inflight else []), "--profiling=false", "--v=1",
        # Blocking mode writes each entry before the response goes out, so a test sees its writes at
        # once; 500 MB before rotation is far more than any test session writes.
        f"--audit-policy-file={policy}", f"--audit-log-path={state.audit_log}", "--audit-log-format=json",
        "--audit-log-mode=blocking", "--audit-log-maxsize=500", "--audit-log-maxbackup=1",
        *gates, *runtime])
    ca = str(pki_dir / "ca.crt")
    wait_until("kube-apiserver /readyz", lambda: http_ok(f"{state.api_url}/readyz", ca),
               START_TIMEOUT, [etcd, apiserver])

    say("starting kube-scheduler, kube-controller-manager and kwok")
    kubeconfig = str(state.kubeconfig)
    common = [f"--kubeconfig={kubeconfig}", "--leader-elect=false", "--bind-address=127.0.0.1",
              "--authorization-always-allow-paths=/healthz,/readyz,/livez,/metrics", "--v=1", *gates]
    scheduler = launch("kube-scheduler", [str(bins / "kube-scheduler"), *common,
                                          f"--secure-port={ports['scheduler']}"])
    controllers = "*" if options.upstream_claims else "*,-resourceclaim-controller"
    budget = ([f"--kube-api-qps={options.kcm_qps:g}", f"--kube-api-burst={max(1, round(2 * options.kcm_qps))}"]
              if options.kcm_qps else [])
    kcm = launch("kube-controller-manager", [
        str(bins / "kube-controller-manager"), *common, f"--secure-port={ports['controller-manager']}",
        f"--controllers={controllers}", f"--root-ca-file={ca}",
        f"--service-account-private-key-file={pki_dir / 'sa.key'}", *budget])
    kwok = launch("kwok", [
        str(bins / "kwok"), f"--kubeconfig={kubeconfig}", f"--config={bins / STAGES_FILE}",
        f"--manage-nodes-with-annotation-selector={driver.NODE_ANNOTATION}=fake",
        "--node-lease-duration-seconds=40", "--cidr=10.0.0.0/16", "--node-ip=127.0.0.1",
        f"--server-address=127.0.0.1:{ports['kwok']}"])
    everything = [etcd, apiserver, scheduler, kcm, kwok]
    wait_until("kube-scheduler /healthz",
               lambda: http_ok(f"https://127.0.0.1:{ports['scheduler']}/healthz"), START_TIMEOUT, everything)
    wait_until("kube-controller-manager /healthz",
               lambda: http_ok(f"https://127.0.0.1:{ports['controller-manager']}/healthz"),
               START_TIMEOUT, everything)


def _publish_cluster(state: LabState, options: LabOptions, models: list[driver.GpuModel], say: Say) -> None:
    api = config.new_client_from_config(config_file=str(state.kubeconfig))
    try:
        core, resource = client.CoreV1Api(api), client.ResourceV1Api(api)
        say(f"creating {options.nodes} kwok node(s) and publishing DeviceClass {driver.DEVICE_CLASS}")
        resource.create_device_class(body=client.V1DeviceClass.model_validate(driver.device_class()))
        for i in range(options.nodes):
            name = driver.node_name(i)
            created = core.create_node(body=client.V1Node.model_validate(driver.node(name)))
            uid = created.metadata.uid if created.metadata else None
            if not uid:
                raise LabError(f"the apiserver returned node {name} without a UID")
            model = driver.model_for_node(models, i)
            if options.profile == driver.PROFILE_PLAIN:
                resource.create_resource_slice(body=client.V1ResourceSlice.model_validate(driver.resource_slice(
                    name, uid, options.gpus_per_node, model)))
            else:
                for body in driver.resource_slices(name, uid, options.gpus_per_node, model, options.profile):
                    _create_partitionable_slice(resource, body)

        def nodes_ready() -> bool:
            nodes = core.list_node().items
            ready = [n for n in nodes if n.status and any(c.type == "Ready" and c.status == "True"
                                                          for c in n.status.conditions or [])]
            return len(ready) >= options.nodes + options.real_node

        what = f"{options.nodes} node(s) Ready (kwok)" + (" and the real node" if options.real_node else "")
        wait_until(what, nodes_ready, START_TIMEOUT, state.processes)
        slices = resource.list_resource_slice().items
        if len({s.spec.node_name for s in slices}) < options.nodes:
            raise LabError(f"only {len(slices)} of {options.nodes} ResourceSlices were published")
    finally:
        api.close()


def _create_partitionable_slice(resource: client.ResourceV1Api, body: dict[str, Any]) -> None:
    """Create a slice as a plain dict and read back what the apiserver kept (every field, even those the
    client's models lack): with DRAPartitionableDevices off it drops counter sets and consumption silently."""
    written = raw_json(resource.create_resource_slice(body=cast(Any, body), _preload_content=False))
    spec = written.get("spec") or {}
    kept = spec.get("sharedCounters") if "sharedCounters" in body["spec"] else [
        d for d in spec.get("devices") or [] if d.get("consumesCounters")]
    if not kept:
        raise LabError("the apiserver dropped the counter sets of the partitionable profile: the gate "
                       "DRAPartitionableDevices is off (do not turn it off with --feature-gates)")


def _stop_all(state: LabState) -> None:
    for proc in reversed(state.processes):
        stop(proc)


def _stop_real_node_pods(state: LabState, say: Say) -> None:
    """Delete the real node's pods while its kubelet runs, so that it tears their sandboxes down."""
    try:
        api = config.new_client_from_config(config_file=str(state.kubeconfig))
    except Exception as exc:
        say(f"real node: cannot reach the apiserver to delete its pods ({exc}); killing their containers")
        realnode.stop_pods(state.dir, lambda: [], lambda namespace, name: None)
        return
    core = client.CoreV1Api(api)

    def pods() -> list[tuple[str, str]]:
        try:
            selector = f"spec.nodeName={realnode.NODE_NAME}"
            items = core.list_pod_for_all_namespaces(field_selector=selector).items
        except Exception:
            return []
        return [(str(p.metadata.namespace), str(p.metadata.name)) for p in items if p.metadata]

    def delete(namespace: str, name: str) -> None:
        with contextlib.suppress(Exception):
            core.delete_namespaced_pod(name, namespace, grace_period_seconds=5)

    try:
        realnode.stop_pods(state.dir, pods, delete)
    finally:
        api.close()


def down(directory: Path, say: Say = print) -> None:
    """Stop exactly what `up` started in ``directory`` (by PID) and remove its state."""
    directory = directory.expanduser().resolve()
    state = LabState.load(directory)
    if state is None:
        if directory.exists() and not any(directory.iterdir()):
            directory.rmdir()
        say(f"no lab in {directory}; nothing to stop")
        return
    alive = state.running() + stop_guests(directory)
    if state.options.get("real_node"):
        _stop_real_node_pods(state, say)
    _stop_all(state)
    if state.options.get("real_node"):
        realnode.cleanup_host()
        realnode.unmount(directory)
    shutil.rmtree(directory)
    say(f"stopped {len(alive)} process(es) and removed {directory}")


def status(directory: Path) -> list[str]:
    """Lines describing the lab in ``directory``: one per component, then the API endpoint."""
    directory = directory.expanduser().resolve()
    state = LabState.load(directory)
    if state is None:
        return [f"no lab in {directory}"]
    lines = [f"{p.name:<24} {'running' if is_running(p) else 'STOPPED':<8} pid {p.pid}"
             for p in state.processes]
    lines += [f"{p.name:<24} {'running' if is_running(p) else 'STOPPED':<8} pid {p.pid} (guest)"
              for p in guests(directory)]
    lines.append(f"apiserver  {state.api_url}{'' if state.ready else ' (start-up did not finish)'}")
    lines.append(f"kubeconfig {state.kubeconfig}")
    return lines


def env_lines(directory: Path) -> list[str]:
    directory = directory.expanduser().resolve()
    state = LabState.load(directory)
    if state is None:
        raise LabError(f"no lab in {directory}: run 'claimwarden lab up' first")
    return [f"export KUBECONFIG={state.kubeconfig}", f'export PATH="{state.bin_dir}:$PATH"']
