"""`claimwarden lab`: a real control plane on loopback, with kwok nodes and a fake DRA driver."""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import json
import shutil
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from kubernetes import client, config

from . import driver, pki, presets, realnode
from .binaries import K8S_VERSION, STAGES_FILE, bin_dir, require_binaries, resolve_version
from .processes import (
    LabError,
    Process,
    free_port,
    http_ok,
    is_running,
    port_is_free,
    restart,
    start,
    stop,
    wait_until,
)

STATE_FILE = "state.json"
GUESTS_DIR = "guests"
"""Processes that run against the lab without being part of it (the demo's claimwarden) record
themselves in DIR/guests/NAME.json, so that `down` stops them too if whoever started them could not."""
START_TIMEOUT = 120.0
Say = Callable[[str], None]

CLAIMWARDEN_USER = "system:serviceaccount:claimwarden-system:claimwarden"
AUDIT_POLICY = f"""\
# The lab's apiserver audit policy: every write claimwarden makes, and every eviction by anyone,
# at Metadata level (who, verb, object, response code, user agent; no bodies), except the leader
# Lease, whose request bodies show who held it when, and the quarantine claims in claimwarden's
# namespace, whose bodies show which device each one holds (the chaos checker follows them).
# Nothing else, so the log stays small and the test suite's auditor reads only what it needs.
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
rules:
  - level: Request
    users: ["{CLAIMWARDEN_USER}"]
    verbs: ["create", "update", "patch", "delete"]
    resources:
      - group: "coordination.k8s.io"
        resources: ["leases"]
  - level: Request
    users: ["{CLAIMWARDEN_USER}"]
    verbs: ["create", "update", "patch", "delete"]
    namespaces: ["claimwarden-system"]
    resources:
      - group: "resource.k8s.io"
        resources: ["resourceclaims", "resourceclaims/status"]
  - level: Metadata
    users: ["{CLAIMWARDEN_USER}"]
    verbs: ["create", "update", "patch", "delete", "deletecollection"]
  - level: Metadata
    verbs: ["create"]
    resources:
      - group: ""
        resources: ["pods/eviction"]
  - level: None
"""
# For benchmarks that count API calls (LabOptions.audit_all): every request by anyone, reads too, at
# Metadata level; the auditor's rules still read only what they need from it.
AUDIT_POLICY_ALL = AUDIT_POLICY.replace('  - level: None\n', '  - level: Metadata\n')


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
    written = _raw(resource.create_resource_slice(body=cast(Any, body), _preload_content=False))
    spec = written.get("spec") or {}
    kept = spec.get("sharedCounters") if "sharedCounters" in body["spec"] else [
        d for d in spec.get("devices") or [] if d.get("consumesCounters")]
    if not kept:
        raise LabError("the apiserver dropped the counter sets of the partitionable profile: the gate "
                       "DRAPartitionableDevices is off (do not turn it off with --feature-gates)")


TAINT_RETRIES = 5


def _status_message(exc: client.ApiException) -> str:
    """The message of the Status an apiserver answered with, else the raw body."""
    try:
        return str(json.loads(exc.body or "")["message"])
    except (TypeError, ValueError, KeyError):
        return str(exc.body or exc.reason)


def _raw(response: object) -> Any:
    """The JSON of a response read with _preload_content=False: every field, even those the client's models lack."""
    return json.loads(cast(Any, response).data)


def taint_device(api: client.ApiClient, node: str, device: str, key: str, value: str = "",
                 effect: str = "NoSchedule", *, remove: bool = False) -> list[dict[str, Any]]:
    """Publish (or with ``remove``, withdraw) a taint on a device of the fake driver's slice on ``node``,
    as NVIDIA's driver does (driver.set_device_taint); returns the device's taints as the apiserver keeps them.

    The slice is rewritten whole with its resourceVersion (devices are an atomic list), retried on conflict.
    An apiserver without slice taints (gate ``DRADeviceTaints`` off: before 1.36 unless the lab runs with
    ``--preset device-taints``) silently drops them; that is an error here, with the fix.
    """
    resource = client.ResourceV1Api(api)
    for _ in range(TAINT_RETRIES):
        listed = _raw(resource.list_resource_slice(
            field_selector=f"spec.nodeName={node},spec.driver={driver.DRIVER}", _preload_content=False))
        slices = [s for s in listed.get("items", [])
                  if any(d.get("name") == device for d in s["spec"].get("devices") or [])]
        if not slices:
            raise LabError(f"no {driver.DRIVER} ResourceSlice on node {node!r} lists device {device!r}")
        body = slices[0]
        devices = body["spec"]["devices"]
        try:
            body["spec"]["devices"] = (driver.remove_device_taint(devices, device, key) if remove
                                       else driver.set_device_taint(devices, device, key, value, effect))
        except driver.LabConfigError as exc:
            raise LabError(str(exc)) from None
        try:
            written = _raw(resource.replace_resource_slice(body["metadata"]["name"], body=body, _preload_content=False))
        except client.ApiException as exc:
            if exc.status == 409:
                continue
            raise LabError(f"the apiserver refused the taint ({exc.status}): {_status_message(exc)}") from None
        taints: list[dict[str, Any]] = next(
            d.get("taints") or [] for d in written["spec"]["devices"] if d.get("name") == device)
        if not remove and not any(t.get("key") == key for t in taints):
            raise LabError("the apiserver dropped the taint: slice taints need the DRADeviceTaints gate, off "
                           "before Kubernetes 1.36; start the lab with '--preset device-taints'")
        return taints
    raise LabError(f"ResourceSlice of node {node!r} kept changing under {TAINT_RETRIES} writes; try again")


def add_guest(directory: Path, proc: Process) -> None:
    """Record ``proc`` as running against the lab in ``directory`` (see GUESTS_DIR)."""
    guests = directory / GUESTS_DIR
    guests.mkdir(exist_ok=True)
    (guests / f"{proc.name}.json").write_text(json.dumps(proc.to_json(), indent=2))


def remove_guest(directory: Path, proc: Process) -> None:
    (directory / GUESTS_DIR / f"{proc.name}.json").unlink(missing_ok=True)


def guests(directory: Path) -> list[Process]:
    found = []
    for path in sorted((directory / GUESTS_DIR).glob("*.json")):
        try:
            found.append(Process.from_json(json.loads(path.read_text())))
        except (OSError, ValueError, KeyError, TypeError):
            path.unlink(missing_ok=True)  # half written by a killed run; its process is unknown
    return found


def stop_guests(directory: Path) -> list[Process]:
    """Stop (by PID) every guest of the lab in ``directory`` that still runs; return those."""
    stopped = []
    for proc in guests(directory):
        if is_running(proc):
            stop(proc)
            stopped.append(proc)
        remove_guest(directory, proc)
    return stopped


def _stop_all(state: LabState) -> None:
    for proc in reversed(state.processes):
        stop(proc)


def _process(state: LabState, name: str) -> tuple[int, Process]:
    for index, proc in enumerate(state.processes):
        if proc.name == name:
            return index, proc
    raise LabError(f"the lab in {state.dir} has no {name} process; run 'claimwarden lab up' first")


def restart_apiserver(state: LabState, say: Say = print, *, runtime_config: str | None = None) -> Process:
    """Stop kube-apiserver by PID, start it again with the same arguments, wait for /readyz.

    Clients see what they see when a control-plane node restarts: broken watches, then re-lists.
    `runtime_config`, when given, replaces its --runtime-config, so that it serves other API versions
    afterwards (as an upgrade that drops an alpha version does).
    """
    index, old = _process(state, "kube-apiserver")
    _, etcd = _process(state, "etcd")
    if runtime_config is not None:
        argv = [arg for arg in old.argv if not arg.startswith("--runtime-config=")]
        old = dataclasses.replace(old, argv=[*argv, f"--runtime-config={runtime_config}"] if runtime_config else argv)
    say(f"restarting kube-apiserver (pid {old.pid})")
    new = restart(old)
    state.processes[index] = new
    state.save()
    ca = str(state.dir / "pki" / "ca.crt")
    wait_until("kube-apiserver /readyz", lambda: http_ok(f"{state.api_url}/readyz", ca), START_TIMEOUT, [etcd, new])
    say(f"kube-apiserver ready again (pid {new.pid})")
    return new


def restart_etcd(state: LabState, say: Say = print, *, down: float = 0.0) -> Process:
    """Stop etcd by PID, leave it down for ``down`` seconds, start it again on its data, wait until the
    apiserver is ready again.

    Its data directory is kept, so nothing is lost: clients see what an etcd member's restart shows them,
    requests failing (the apiserver answers 5xx or times out) and then going through; watches whose
    resourceVersion etcd still has resume.
    """
    index, old = _process(state, "etcd")
    _, apiserver = _process(state, "kube-apiserver")
    if not old.argv:
        raise LabError(f"etcd was started by an older claimwarden that did not record its command line; run "
                       f"'claimwarden lab down --dir {state.dir}' and 'lab up' again")
    say(f"stopping etcd (pid {old.pid}) for {down:g} s")
    stop(old)
    time.sleep(down)
    new = start(old.name, old.argv, Path(old.log).parent, old.env)
    state.processes[index] = new
    state.save()
    wait_until("etcd /health", lambda: http_ok(f"http://127.0.0.1:{state.ports['etcd']}/health"),
               START_TIMEOUT, [new])
    ca = str(state.dir / "pki" / "ca.crt")
    wait_until("kube-apiserver /readyz", lambda: http_ok(f"{state.api_url}/readyz", ca), START_TIMEOUT,
               [new, apiserver])
    say(f"etcd ready again (pid {new.pid})")
    return new


def _etcd_post(state: LabState, path: str, body: dict[str, Any]) -> dict[str, Any]:
    url = f"http://127.0.0.1:{state.ports['etcd']}{path}"
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            result: dict[str, Any] = json.loads(response.read())
            return result
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise LabError(f"etcd's HTTP gateway at {url} failed: {exc}") from None


def compact_etcd(state: LabState) -> int:
    """Compact etcd to its current revision (physically) through its HTTP gateway; return that revision.

    Afterwards a watch or list from any older resourceVersion gets 410 Gone, as on a long-lived cluster.
    """
    header = _etcd_post(state, "/v3/kv/range", {"key": base64.b64encode(b"/").decode()}).get("header") or {}
    revision = int(header.get("revision") or 0)
    if revision <= 0:
        raise LabError(f"etcd did not report its current revision (header: {header})")
    _etcd_post(state, "/v3/kv/compaction", {"revision": revision, "physical": True})
    return revision


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
