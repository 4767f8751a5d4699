"""`claimwarden lab demo`: the DRA walkthrough, a broken GPU and its recovery, narrated against the live lab.

The demo starts the lab (unless one already runs in ``--dir``) and claimwarden, then plays scenes.
Each command is introduced by a one-line explanation (``# ...``), printed as the user would type
it (``$ kubectl ...``), run for real with the lab's kubectl, and followed by its real output.
Between commands the demo never sleeps for pacing: it polls the API (``Demo.wait``) until the
state the next command shows has come, and fails with a one-line message naming what did not come
when a timeout passes. The demo also checks each outcome it narrates, so a demo that finishes told
the truth.

Scenes: the cluster; the walkthrough's four experiments; a broken GPU (eviction, the record, a new
pod that waits because the only free device is the broken one); recovery; with ``--models``, a
prioritized list falling back from H100 to A100; what Prometheus would see.

Afterwards claimwarden keeps running in the foreground, streaming its log, until Ctrl-C (which
stops claimwarden and nothing else); ``--exit`` instead ends after the last scene and stops what
the demo started. Everything the scenes create lives in namespace ``demo``; a leftover ``demo``
namespace from an earlier run is removed first.

Part of the lab wing: ``claimwarden run`` never imports it.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any, TextIO, TypeVar, cast

import yaml
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from . import cluster, driver
from .processes import LabError, Process, free_port, http_ok, is_running, log_tail, start, stop

T = TypeVar("T")

NAMESPACE = "demo"
CLAIMWARDEN_NAMESPACE = "claimwarden-system"
DEMO_NODES = 2
DEMO_GPUS_PER_NODE = 4
FALLBACK = ("H100", "A100")
WAIT_SECONDS = 60.0
POLL_SECONDS = 0.2
MARK_PREFIX = "unhealthy.claimwarden.io/"
BROKEN_REASON = "XID 79: fell off the bus"
RECORDS = ("claimwarden.io", "v1alpha1", "unhealthydevices")
ALERT = "ClaimwardenUnhealthyDeviceHasPods"
LOG_NAME = "claimwarden-demo"
IMAGE = "registry.example/app:1"  # kwok runs pods without pulling anything
MODEL_CEL = "device.attributes['{driver}'].model == '{model}'"

# One table for the experiments: which claim holds which device, and for whom.
CLAIM_COLUMNS = ("custom-columns=CLAIM:.metadata.name,NODE:.status.allocation.devices.results[*].pool,"
                 "DEVICE:.status.allocation.devices.results[*].device,RESERVED_FOR:.status.reservedFor[*].name")
# Devices with their models, one line per device (plain kubectl: `kubectl claimwarden devices` needs the plugin).
DEVICE_ROW = '{{printf "%-12s %-7s %-17s %s\\n" '
DEVICES_TEMPLATE = (f'go-template={DEVICE_ROW}"NODE" "DEVICE" "MODEL" "MEMORY"}}}}'
                    '{{range .items}}{{$node := .spec.nodeName}}{{range .spec.devices}}'
                    f'{DEVICE_ROW}$node .name .attributes.model.string .capacity.memory.value}}}}'
                    '{{end}}{{end}}')


class DemoError(RuntimeError):
    """A scene did not come out as narrated, or the demo cannot start; one line naming what and where."""


@dataclass(frozen=True)
class DemoOptions:
    dir: Path = field(default_factory=cluster.default_dir)
    pause: bool = False
    exit: bool = False
    models: str | None = None


# --- pure parts: colour, text, manifests -------------------------------------------------------------


def use_colour(stream: TextIO, environ: Mapping[str, str]) -> bool:
    """ANSI colour only on a terminal, and never when NO_COLOR is set (https://no-color.org)."""
    return not environ.get("NO_COLOR") and stream.isatty()


@dataclass(frozen=True)
class Style:
    colour: bool

    def _paint(self, code: str, text: str) -> str:
        return f"\033[{code}m{text}\033[0m" if self.colour else text

    def heading(self, number: int, total: int, title: str) -> str:
        return self._paint("1;36", f"== {number}/{total}. {title} ==")

    def note(self, text: str) -> str:
        return self._paint("32", f"# {text}")

    def command(self, text: str) -> str:
        return self._paint("1", f"$ {text}")

    def error(self, text: str) -> str:
        return self._paint("1;31", text)


def command_text(args: Sequence[str], stdin: str | None = None) -> str:
    """The kubectl command as a user would type it, with a here-document for what goes to stdin."""
    text = "kubectl " + shlex.join(args)
    return f"{text} <<EOF\n{stdin.rstrip()}\nEOF" if stdin else text


def grep_metrics(text: str, names: Sequence[str]) -> list[str]:
    """The sample lines of ``names`` in Prometheus text, as `grep -E '^(name1|name2)[{ ]'` finds them."""
    pattern = re.compile(rf"^({'|'.join(re.escape(n) for n in names)})[{{ ]")
    return [line for line in text.splitlines() if pattern.match(line)]


def pod_yaml(name: str, claim: str, source: str, containers: Sequence[str] = ("ctr",),
             node: str | None = None) -> str:
    """A pod whose containers all use pod claim ``claim``; ``source`` is `resourceClaimTemplateName: x`
    or `resourceClaimName: x`."""
    lines = ["apiVersion: v1", "kind: Pod", f"metadata: {{name: {name}}}", "spec:"]
    if node:
        lines.append(f"  nodeSelector: {{kubernetes.io/hostname: {node}}}")
    lines.append("  containers:")
    lines += [f"  - {{name: {c}, image: {IMAGE}, resources: {{claims: [{{name: {claim}}}]}}}}" for c in containers]
    lines.append(f"  resourceClaims: [{{name: {claim}, {source}}}]")
    return "\n".join(lines) + "\n"


def template_yaml(name: str, request: str) -> str:
    return (f"apiVersion: resource.k8s.io/v1\nkind: ResourceClaimTemplate\nmetadata: {{name: {name}}}\n"
            f"spec:\n  spec:\n    devices:\n      requests:\n{request}")


def claim_yaml(name: str, request: str) -> str:
    """A standalone claim; ``request`` is indented for it (``indent=CLAIM_INDENT``)."""
    return (f"apiVersion: resource.k8s.io/v1\nkind: ResourceClaim\nmetadata: {{name: {name}}}\n"
            f"spec:\n  devices:\n    requests:\n{request}")


CLAIM_INDENT = "    "


def one_gpu(indent: str = "      ") -> str:
    return f"{indent}- name: gpu\n{indent}  exactly: {{deviceClassName: {driver.DEVICE_CLASS}}}\n"


def gpus(count: int, indent: str = "      ") -> str:
    return (f"{indent}- name: gpus\n{indent}  exactly: {{deviceClassName: {driver.DEVICE_CLASS}, "
            f"allocationMode: ExactCount, count: {count}}}\n")


def first_available(models: Sequence[str], indent: str = "      ") -> str:
    lines = [f"{indent}- name: gpu", f"{indent}  firstAvailable:"]
    for model in models:
        cel = MODEL_CEL.format(driver=driver.DRIVER, model=model)
        lines.append(f'{indent}  - {{name: {model.lower()}, deviceClassName: {driver.DEVICE_CLASS}, '
                     f'selectors: [{{cel: {{expression: "{cel}"}}}}]}}')
    return "\n".join(lines) + "\n"


def documents(*texts: str) -> str:
    return "---\n".join(texts)


def parse_models(text: str | None) -> list[str]:
    """``--models`` for the demo: the lab's models, which must include the fallback pair."""
    if not text:
        return []
    try:
        names = [m.name for m in driver.parse_models(text)]
    except driver.LabConfigError as exc:
        raise DemoError(str(exc)) from None
    missing = [m for m in FALLBACK if m not in names]
    if missing:
        raise DemoError(f"--models {text} lacks {', '.join(missing)}: the fallback scene shows "
                        f"{' -> '.join(FALLBACK)}; for example --models H100,A100,L4")
    return names


def self_command(argv0: str | None = None) -> str:
    """How the user started claimwarden (`.venv/bin/claimwarden` under make), to repeat in hints."""
    path = Path(argv0 if argv0 is not None else sys.argv[0])
    if path.name != "claimwarden":
        return "claimwarden"
    with contextlib.suppress(ValueError):
        path = path.resolve().relative_to(Path.cwd().resolve()) if path.is_absolute() else path
    return shlex.quote(str(path))


def repo_root() -> Path | None:
    """The clone this module runs from, if it is one (a wheel ships neither crds/ nor manifests/)."""
    root = Path(__file__).resolve().parents[2]
    return root if (root / "crds" / "kustomization.yaml").is_file() else None


def alert_rule(root: Path, name: str) -> dict[str, Any] | None:
    """The alerting rule ``name`` from manifests/monitoring/prometheusrule.yaml."""
    path = root / "manifests" / "monitoring" / "prometheusrule.yaml"
    try:
        rule = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError):
        return None
    for group in (rule.get("spec") or {}).get("groups") or []:
        for item in group.get("rules") or []:
            if item.get("alert") == name:
                return dict(item)
    return None


def _sample(lines: Sequence[str], name: str) -> float:
    """Sum of the samples of ``name`` (any labels) among Prometheus text lines."""
    total = 0.0
    for line in lines:
        metric, _, value = line.rpartition(" ")
        if metric.split("{")[0] == name:
            total += float(value)
    return total


# --- the imperative shell: the lab, claimwarden, kubectl, waiting ------------------------------------


class Demo:
    def __init__(self, options: DemoOptions, out: TextIO, style: Style) -> None:
        self.options = options
        self.out = out
        self.style = style
        self.directory = options.dir.expanduser().resolve()
        self.models = parse_models(options.models)
        self.state: cluster.LabState | None = None
        self.started_lab = False
        self.claimwarden: Process | None = None
        self.metrics_port = 0
        self.api: client.ApiClient | None = None
        self.marked: tuple[str, str] | None = None  # (slice, device) while a device is marked
        self.seen = ""  # what the last probe saw, for a timeout's message
        self.scenes: list[tuple[str, Callable[[], None]]] = []
        self.number = 0
        self.broken: tuple[str, str] = ("", "")  # (node, device) of the broken GPU

    # output ----------------------------------------------------------------------------------------

    def print(self, text: str = "") -> None:
        print(text, file=self.out, flush=True)

    def say(self, text: str) -> None:
        self.print(self.style.note(text))

    def kubectl(self, explanation: str, *args: str, stdin: str | None = None) -> str:
        """Explain, show and run one kubectl command; print its real output; fail if it fails."""
        assert self.state is not None
        self.say(explanation)
        self.print(self.style.command(command_text(args, stdin)))
        result = subprocess.run([f"{self.state.bin_dir}/kubectl", f"--kubeconfig={self.state.kubeconfig}", *args],
                                input=stdin, capture_output=True, text=True, timeout=120, check=False)
        text = (result.stdout + result.stderr).rstrip("\n")
        if text:
            self.print(text)
        if result.returncode:
            last = (result.stderr.strip().splitlines() or ["no output"])[-1]
            raise DemoError(f"'{command_text(args)}' failed with exit code {result.returncode}: {last}")
        return result.stdout

    def apply(self, explanation: str, manifest: str) -> None:
        self.kubectl(explanation, "apply", "-n", NAMESPACE, "-f", "-", stdin=manifest)

    # waiting ---------------------------------------------------------------------------------------

    def wait(self, what: str, probe: Callable[[], T | None], timeout: float = WAIT_SECONDS) -> T:
        """Poll ``probe`` until it returns something truthy; claimwarden must stay alive meanwhile."""
        deadline = time.monotonic() + timeout
        self.seen = ""
        while True:
            self._check_claimwarden()
            try:
                result = probe()
            except ApiException as exc:
                self.seen = f"the API answered {exc.status} {exc.reason}"
                result = None
            if result:
                return result
            if time.monotonic() >= deadline:
                seen = f" (last seen: {self.seen})" if self.seen else ""
                raise DemoError(f"timed out after {timeout:.0f}s waiting for {what}{seen}; "
                                f"claimwarden's log: {self._log_path()}")
            time.sleep(POLL_SECONDS)

    def _check_claimwarden(self) -> None:
        if self.claimwarden is not None and not is_running(self.claimwarden):
            last = log_tail(self.claimwarden, 1) or "no output"
            raise DemoError(f"claimwarden exited: {last} (log: {self._log_path()})")

    def _log_path(self) -> Path:
        return self.directory / "logs" / f"{LOG_NAME}.log"

    # reading the cluster ---------------------------------------------------------------------------

    @property
    def core(self) -> client.CoreV1Api:
        return client.CoreV1Api(self.api)

    @property
    def resource(self) -> client.ResourceV1Api:
        return client.ResourceV1Api(self.api)

    # The client's models type every field as optional; these helpers read objects the demo created
    # and waited for, so they take and return Any rather than assert each level.

    def pod(self, name: str) -> Any:
        try:
            return self.core.read_namespaced_pod(name, NAMESPACE)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def running(self, *names: str) -> list[Any] | None:
        pods: list[Any] = [self.pod(n) for n in names]
        self.seen = ", ".join(f"{n}: {p.status.phase if p else 'absent'}" for n, p in zip(names, pods, strict=True))
        if all(p is not None and p.status.phase == "Running" for p in pods):
            return pods
        return None

    def claims(self, namespace: str = NAMESPACE) -> list[Any]:
        return list(self.resource.list_namespaced_resource_claim(namespace).items)

    def claim_of(self, pod: Any) -> Any:
        """The (only) claim of ``pod``: its template claim as recorded in its status, or the named claim."""
        [source] = pod.spec.resource_claims
        name = source.resource_claim_name
        for status in pod.status.resource_claim_statuses or []:
            if status.name == source.name:
                name = status.resource_claim_name
        return self.resource.read_namespaced_resource_claim(name, NAMESPACE)

    @staticmethod
    def devices_of(claim: Any) -> list[tuple[str, str]]:
        allocation = claim.status.allocation if claim.status else None
        return [(r.pool, r.device) for r in allocation.devices.results] if allocation else []

    def slices(self) -> list[Any]:
        return [s for s in self.resource.list_resource_slice().items if s.spec.driver == driver.DRIVER]

    def free_devices(self) -> dict[str, list[tuple[str, str]]]:
        """node -> [(device, model)] not allocated to any claim, in the order the slices list them."""
        claims: list[Any] = self.resource.list_resource_claim_for_all_namespaces().items
        taken = {(r.pool, r.device) for c in claims
                 if c.status and c.status.allocation for r in c.status.allocation.devices.results
                 if r.driver == driver.DRIVER}
        free: dict[str, list[tuple[str, str]]] = {}
        for s in sorted(self.slices(), key=lambda s: s.spec.node_name or ""):
            free.setdefault(s.spec.node_name, []).extend(
                (d.name, d.attributes["model"].string) for d in s.spec.devices or []
                if (s.spec.pool.name, d.name) not in taken)
        return free

    def record_of(self, pool: str, device: str) -> dict[str, Any] | None:
        """The UnhealthyDevice record of one device (other records in a reused lab are not ours)."""
        listed = cast(dict[str, Any], client.CustomObjectsApi(self.api).list_cluster_custom_object(*RECORDS))
        items: list[dict[str, Any]] = listed["items"]
        return next((r for r in items if (r["spec"].get("pool"), r["spec"].get("device")) == (pool, device)), None)

    def quarantined(self, pool: str, device: str) -> bool:
        return any(self.devices_of(c) == [(pool, device)] for c in self.claims(CLAIMWARDEN_NAMESPACE))

    def events(self, pod: str, reason: str) -> list[Any]:
        selector = f"involvedObject.name={pod},reason={reason}"
        return list(self.core.list_namespaced_event(NAMESPACE, field_selector=selector).items)

    def metrics(self) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5) as response:
            return str(response.read().decode())

    # setting up and tearing down -------------------------------------------------------------------

    def setup(self) -> None:
        root = repo_root()
        if root is None:
            raise DemoError("the demo installs claimwarden's CRD from the repository's crds/, which an installed "
                            "wheel does not ship; run it from a clone: 'make demo'")
        state = cluster.LabState.load(self.directory)
        if state is not None and state.ready and len(state.running()) == len(state.processes):
            self.print(f"demo: using the lab already running in {self.directory} (the demo leaves it running)")
            lab_models = state.options.get("models") or []
            if self.models and any(m not in lab_models for m in FALLBACK):
                raise DemoError(f"the lab in {self.directory} runs {','.join(lab_models) or 'other models'}, "
                                f"not {' and '.join(FALLBACK)}; stop it ('{self_command()} lab down --dir "
                                f"{self.directory}') so that the demo starts one with --models, or drop --models")
        else:
            state = cluster.up(cluster.LabOptions(
                dir=self.directory, nodes=max(DEMO_NODES, len(self.models)), gpus_per_node=DEMO_GPUS_PER_NODE,
                models=",".join(self.models) or None), say=lambda line: self.print(f"lab: {line}"))
            self.started_lab = True
        self.state = state
        for proc in cluster.stop_guests(self.directory):
            self.print(f"demo: stopped {proc.name} (pid {proc.pid}), left running by an earlier demo")
        self.api = config.new_client_from_config(config_file=str(state.kubeconfig))
        self._install_crds(root)
        self._start_claimwarden()
        self._fresh_namespace()

    def _install_crds(self, root: Path) -> None:
        assert self.state is not None
        kubectl = [f"{self.state.bin_dir}/kubectl", f"--kubeconfig={self.state.kubeconfig}"]
        args = ["apply", "-k", str(root / "crds")]
        result = subprocess.run([*kubectl, *args], capture_output=True, text=True, timeout=90, check=False)
        if result.returncode:
            raise DemoError(f"'kubectl {shlex.join(args)}' failed: {result.stderr.strip()}")
        # Polled here rather than with `kubectl wait --for=condition=Established`: that fails at once ("accessor
        # error") when it reads a CRD before the apiserver has written any condition.
        names = ("unhealthydevices.claimwarden.io", "healthpolicies.claimwarden.io")
        extensions = client.ApiextensionsV1Api(self.api)
        deadline = time.monotonic() + 60
        while not all(_established(extensions.read_custom_resource_definition(name)) for name in names):
            if time.monotonic() > deadline:
                raise DemoError(f"the CRDs {', '.join(names)} were not Established within 60 s")
            time.sleep(0.2)
        self.print("demo: installed the UnhealthyDevice and HealthPolicy CRDs (kubectl apply -k crds/)")

    def _start_claimwarden(self) -> None:
        assert self.state is not None
        liveness = free_port()
        self.metrics_port = free_port()
        self.claimwarden = start(LOG_NAME, [
            sys.executable, "-m", "claimwarden", "run", "--kubeconfig", str(self.state.kubeconfig),
            "--liveness", f"http://127.0.0.1:{liveness}/healthz",
            "--metrics-address", "127.0.0.1", "--metrics-port", str(self.metrics_port),
            # One process on a development lab: no Lease to wait for after an interrupted demo.
            "--leader-elect=false"], self.directory / "logs")
        cluster.add_guest(self.directory, self.claimwarden)
        self.wait("claimwarden's liveness endpoint", lambda: http_ok(f"http://127.0.0.1:{liveness}/healthz"))
        self.print(f"demo: claimwarden runs (pid {self.claimwarden.pid}, metrics on 127.0.0.1:{self.metrics_port}, "
                   f"log {self._log_path()})")

    def _fresh_namespace(self) -> None:
        if self._namespace_exists():
            self.print(f"demo: removing namespace {NAMESPACE} left by an earlier demo")
            self._delete_namespace()
        self.core.create_namespace(body=client.V1Namespace.model_validate({"metadata": {"name": NAMESPACE}}))

    def _namespace_exists(self) -> bool:
        try:
            self.core.read_namespace(NAMESPACE)
            return True
        except ApiException as exc:
            if exc.status == 404:
                return False
            raise

    def _delete_namespace(self) -> None:
        with contextlib.suppress(ApiException):
            self.core.delete_namespace(NAMESPACE)
        self.wait(f"namespace {NAMESPACE} to be deleted", lambda: not self._namespace_exists())

    def _unmark(self) -> None:
        if self.marked is None:
            return
        slice_name, device = self.marked
        self.print(f"demo: clearing the mark on {device} (annotation {MARK_PREFIX}{device} on {slice_name})")
        self.resource.patch_resource_slice(slice_name, {"metadata": {"annotations": {MARK_PREFIX + device: None}}})
        self.marked = None
        node = self.broken[0]
        self.wait("claimwarden to remove the UnhealthyDevice record", lambda: not self.record_of(node, device), 30)

    def clean_up(self) -> None:
        """Undo what the scenes did, then stop what the demo started (and only that).

        The lab stays unless the demo started it and --exit was given. Objects are removed while
        claimwarden still runs, since it is what releases their devices and finalizers. A second
        Ctrl-C skips the waiting but still stops the processes.
        """
        lab_goes = self.started_lab and self.options.exit
        try:
            if self.api is not None and self.claimwarden is not None and not lab_goes:
                self._unmark()
                if self._namespace_exists():
                    self.print(f"demo: deleting namespace {NAMESPACE}")
                    self._delete_namespace()
        except (KeyboardInterrupt, DemoError, ApiException) as exc:
            self.print(f"demo: clean-up cut short ({type(exc).__name__}: {exc}); the next demo removes the rest")
        finally:
            self.stop_claimwarden()
            if lab_goes:
                cluster.down(self.directory, say=lambda line: self.print(f"lab: {line}"))
            if self.api is not None:
                self.api.close()

    def stop_claimwarden(self, announce: bool = True) -> None:
        if self.claimwarden is None:
            return
        stop(self.claimwarden, grace=30)
        cluster.remove_guest(self.directory, self.claimwarden)
        if announce:
            self.print(f"demo: stopped claimwarden (pid {self.claimwarden.pid})")
        self.claimwarden = None

    # the play --------------------------------------------------------------------------------------

    def play(self) -> None:
        self.scenes = [
            ("The cluster", self.scene_cluster),
            ("Experiment 1: two pods, one ResourceClaimTemplate", self.scene_template),
            ("Experiment 2: two containers, one claim", self.scene_containers),
            ("Experiment 3: two pods, one standalone claim", self.scene_shared),
            ("Experiment 4: deleting the pods", self.scene_delete),
            ("A broken GPU", self.scene_broken),
            ("Recovery", self.scene_recovery),
        ]
        if self.models:
            self.scenes.append((f"A prioritized list: {', else '.join(FALLBACK)}", self.scene_fallback))
        self.scenes.append(("What Prometheus would see", self.scene_metrics))
        for number, (title, scene) in enumerate(self.scenes, start=1):
            if number > 1 and self.options.pause:
                self._pause()
            self.print()
            self.print(self.style.heading(number, len(self.scenes), title))
            scene()

    def _pause(self) -> None:
        self.print(self.style.note("(press Enter for the next scene)"))
        with contextlib.suppress(EOFError):
            input()

    def claim_table(self, explanation: str) -> str:
        return self.kubectl(explanation, "get", "resourceclaims", "-n", NAMESPACE, "-o", CLAIM_COLUMNS)

    def scene_cluster(self) -> None:
        self.kubectl("Nodes: kwok plays their kubelets, so pods on them become Running without containers.",
                     "get", "nodes")
        self.kubectl("The DeviceClass: an admin's frame that selects devices by CEL, here all of one driver.",
                     "get", "deviceclasses", "-o",
                     "custom-columns=NAME:.metadata.name,SELECTOR:.spec.selectors[*].cel.expression")
        self.kubectl("The fake driver publishes one ResourceSlice per node, listing that node's GPUs.",
                     "get", "resourceslices")
        self.kubectl("Their devices with model and memory ('kubectl claimwarden devices' shows them too).",
                     "get", "resourceslices", "-o", DEVICES_TEMPLATE)

    def scene_template(self) -> None:
        manifest = documents(template_yaml("single-gpu", one_gpu()),
                             pod_yaml("pod1", "gpu", "resourceClaimTemplateName: single-gpu"),
                             pod_yaml("pod2", "gpu", "resourceClaimTemplateName: single-gpu"))
        self.apply("A template stamps out one claim per pod; claimwarden creates them, the scheduler allocates.",
                   manifest)
        pods = self.wait("pod1 and pod2 Running", lambda: self.running("pod1", "pod2"))
        devices = [self.devices_of(self.claim_of(p)) for p in pods]
        if len({d[0] for d in devices if d}) != 2:
            raise DemoError(f"experiment 1: pod1 and pod2 should hold two different devices, not {devices}")
        self.kubectl("Each pod has its own claim, named <pod>-<pod claim>-<random>, allocated and reserved:",
                     "get", "resourceclaims", "-n", NAMESPACE)
        self.claim_table("...on two different devices, each reserved for its pod:")

    def scene_containers(self) -> None:
        self.apply("One pod, two containers naming the same pod claim:",
                   pod_yaml("pod3", "gpu", "resourceClaimTemplateName: single-gpu", containers=("ctr0", "ctr1")))
        [pod] = self.wait("pod3 Running", lambda: self.running("pod3"))
        claim = self.claim_of(pod)
        if len(self.devices_of(claim)) != 1 or [r.name for r in claim.status.reserved_for] != ["pod3"]:
            raise DemoError(f"experiment 2: pod3's claim should hold one device for pod3: {claim.status}")
        self.kubectl("Both containers use the pod's one claim...", "get", "pod", "pod3", "-n", NAMESPACE, "-o",
                     "custom-columns=POD:.metadata.name,CONTAINERS:.spec.containers[*].name,"
                     "CLAIMS:.spec.containers[*].resources.claims[*].name")
        self.claim_table("...which holds one device:")

    def scene_shared(self) -> None:
        manifest = documents(claim_yaml("shared-gpu", one_gpu(CLAIM_INDENT)),
                             pod_yaml("pod4", "gpu", "resourceClaimName: shared-gpu"),
                             pod_yaml("pod5", "gpu", "resourceClaimName: shared-gpu"))
        self.apply("A standalone ResourceClaim, created by the user, and two pods naming it:", manifest)
        self.wait("pod4 and pod5 Running", lambda: self.running("pod4", "pod5"))
        claim: Any = self.resource.read_namespaced_resource_claim("shared-gpu", NAMESPACE)
        holders = sorted(r.name for r in claim.status.reserved_for or [])
        if len(self.devices_of(claim)) != 1 or holders != ["pod4", "pod5"]:
            raise DemoError(f"experiment 3: shared-gpu should hold one device reserved for pod4 and pod5: {holders}")
        self.claim_table("One device; reservedFor lists both pods:")

    def scene_delete(self) -> None:
        self.kubectl("Delete every pod (kubectl waits until they are gone):",
                     "delete", "pods", "--all", "-n", NAMESPACE)

        def settled() -> bool:
            claims = self.claims()
            self.seen = ", ".join(f"{c.metadata.name}: {'allocated' if self.devices_of(c) else 'pending'}"
                                  for c in claims)
            return [c.metadata.name for c in claims] == ["shared-gpu"] and not self.devices_of(claims[0])

        self.wait("the generated claims to be deleted and shared-gpu to be deallocated", settled)
        self.kubectl("The generated claims went with their pods; the standalone claim stays, pending (its device "
                     "is free again); the template stays:",
                     "get", "resourceclaims,resourceclaimtemplates", "-n", NAMESPACE)

    def scene_broken(self) -> None:
        free = self.free_devices()
        node = next((n for n, devices in free.items() if devices), None)
        if node is None:
            raise DemoError("no GPU is free in the lab for the broken-GPU scene; free one (kubectl get "
                            "resourceclaims -A) or run the demo on a fresh lab")
        others = len(free[node]) - 1
        manifests = []
        if others:
            manifests += [claim_yaml("batch-gpus", gpus(others, CLAIM_INDENT)),
                          pod_yaml("batch", "gpus", "resourceClaimName: batch-gpus", node=node)]
        manifests.append(pod_yaml("trainer", "gpu", "resourceClaimTemplateName: single-gpu", node=node))
        self.apply(f"Fill {node}: 'batch' takes {others} of its {others + 1} GPUs, 'trainer' the last one.",
                   documents(*manifests))
        names = ("batch", "trainer") if others else ("trainer",)
        pods = self.wait(" and ".join(names) + " Running", lambda: self.running(*names))
        [(pool, device)] = self.devices_of(self.claim_of(pods[-1]))
        self.broken = (node, device)
        self.claim_table(f"trainer runs on {pool}/{device}:")

        slice_name = next(s.metadata.name for s in self.slices() if s.spec.node_name == node)
        self.marked = (slice_name, device)
        self.kubectl(f"{device} breaks. Mark it unhealthy by annotating the slice that lists it:",
                     "annotate", "resourceslice", slice_name, f"{MARK_PREFIX}{device}={BROKEN_REASON}")
        trainer_uid = pods[-1].metadata.uid

        def evicted() -> bool:
            pod = self.pod("trainer")
            record = self.record_of(pool, device)
            status = (record or {}).get("status") or {}
            self.seen = f"trainer {'gone' if pod is None else pod.status.phase}, record status {status}"
            return ((pod is None or pod.metadata.uid != trainer_uid) and status.get("podsEvicted") == 1
                    and bool(self.events("trainer", "EvictedUnhealthyDevice")))

        self.wait("claimwarden to evict trainer and count it in the UnhealthyDevice record", evicted)
        self.kubectl("claimwarden evicted trainer through the Eviction API and said why:",
                     "get", "events", "-n", NAMESPACE,
                     "--field-selector", "involvedObject.name=trainer,reason=EvictedUnhealthyDevice")
        self.kubectl("The record of the broken device counts the evicted and the still pending pods:",
                     "get", "unhealthydevices")

        self.wait(f"a quarantine claim on {pool}/{device}", lambda: self.quarantined(pool, device))
        self.kubectl("A quarantine claim holds the device, so the scheduler hands it to no one:",
                     "get", "resourceclaims", "-n", CLAIMWARDEN_NAMESPACE)

        self.apply(f"trainer comes back (as its Job would re-create it), again on {node}, where only "
                   f"{device} is not in use:",
                   pod_yaml("trainer-2", "gpu", "resourceClaimTemplateName: single-gpu", node=node))

        def waiting() -> bool:
            pod = self.pod("trainer-2")
            conditions = {c.type: c for c in (pod.status.conditions or [])} if pod else {}
            scheduled = conditions.get("PodScheduled")
            self.seen = f"trainer-2 {pod.status.phase if pod else 'absent'}"
            return (scheduled is not None and scheduled.status == "False" and scheduled.reason == "Unschedulable"
                    and bool(self.events("trainer-2", "FailedScheduling")))

        self.wait("the scheduler to find no device for trainer-2", waiting)
        self.kubectl("It does not land on the broken device: nothing else is free there, so it waits.",
                     "get", "events", "-n", NAMESPACE,
                     "--field-selector", "involvedObject.name=trainer-2,reason=FailedScheduling")

    def scene_recovery(self) -> None:
        node, device = self.broken
        assert self.marked is not None
        slice_name, _ = self.marked
        self.kubectl(f"{device} is repaired. Clear the mark:",
                     "annotate", "resourceslice", slice_name, f"{MARK_PREFIX}{device}-")
        self.marked = None
        [pod] = self.wait("trainer-2 Running", lambda: self.running("trainer-2"), 90)
        got = self.devices_of(self.claim_of(pod))
        if got != [(node, device)]:
            raise DemoError(f"recovery: trainer-2 should have {node}/{device}, it has {got}")
        self.wait("the record and its quarantine claim to be removed",
                  lambda: not self.record_of(node, device) and not self.quarantined(node, device))
        self.kubectl("claimwarden removed the record, and with it the quarantine claim:", "get", "unhealthydevices")
        self.claim_table(f"The waiting pod got {device}:")
        self.kubectl("Every pod runs:", "get", "pods", "-n", NAMESPACE, "-o", "wide")

    def scene_fallback(self) -> None:
        preferred, fallback = FALLBACK
        free = [(node, len([m for _, m in devices if m == preferred]))
                for node, devices in self.free_devices().items()]
        free = [(node, count) for node, count in free if count]
        manifests = []
        for i, (node, count) in enumerate(free):
            manifests += [claim_yaml(f"{preferred.lower()}-jobs-{i}", gpus(count, CLAIM_INDENT)),
                          pod_yaml(f"{preferred.lower()}-job-{i}", "gpus",
                                   f"resourceClaimName: {preferred.lower()}-jobs-{i}", node=node)]
        taken_by = "the pods above"
        if manifests:
            taken_by = "these pods and the ones above"
            self.apply(f"Take the {preferred}s that are still free:", documents(*manifests))
            names = [f"{preferred.lower()}-job-{i}" for i in range(len(free))]
            self.wait(" and ".join(names) + " Running", lambda: self.running(*names))
        if not any(model == fallback for devices in self.free_devices().values() for _, model in devices):
            raise DemoError(f"the fallback scene needs a free {fallback}; none is left in the lab")
        self.apply(f"Every {preferred} is in use ({taken_by} hold them). A template asking for an {preferred}, "
                   f"else an {fallback} (firstAvailable), and a pod using it:",
                   documents(template_yaml(f"{preferred.lower()}-or-{fallback.lower()}", first_available(FALLBACK)),
                             pod_yaml("inference", "gpu",
                                      f"resourceClaimTemplateName: {preferred.lower()}-or-{fallback.lower()}")))
        [pod] = self.wait("inference Running", lambda: self.running("inference"))
        claim = self.claim_of(pod)
        [result] = claim.status.allocation.devices.results
        if result.request != f"gpu/{fallback.lower()}":
            raise DemoError(f"fallback: inference's claim should be allocated by gpu/{fallback.lower()}, "
                            f"not {result.request}")
        self.kubectl(f"The claim was allocated by its second choice, subrequest gpu/{fallback.lower()}:",
                     "get", "resourceclaim", claim.metadata.name, "-n", NAMESPACE, "-o",
                     "custom-columns=CLAIM:.metadata.name,REQUEST:.status.allocation.devices.results[*].request,"
                     "NODE:.status.allocation.devices.results[*].pool,"
                     "DEVICE:.status.allocation.devices.results[*].device")

    def scene_metrics(self) -> None:
        names = ["claimwarden_devices", "claimwarden_unhealthy_devices", "claimwarden_eviction_pending_pods",
                 "claimwarden_evictions_total", "claimwarden_eviction_latency_seconds_count",
                 "claimwarden_eviction_latency_seconds_sum"]

        def scraped() -> list[str] | None:
            lines = grep_metrics(self.metrics(), names)
            self.seen = f"{len(lines)} line(s), evictions {_sample(lines, 'claimwarden_evictions_total')}"
            return lines if _sample(lines, "claimwarden_eviction_latency_seconds_count") >= 1 else None

        lines = self.wait("claimwarden's /metrics to count the eviction", scraped)
        self.say("claimwarden's /metrics, which Prometheus scrapes (the Service claimwarden-metrics in a cluster):")
        self.print(self.style.command(f"curl -s http://127.0.0.1:{self.metrics_port}/metrics | "
                                      f"grep -E '^({'|'.join(names)})[{{ ]'"))
        self.print("\n".join(lines))
        latency = _sample(lines, "claimwarden_eviction_latency_seconds_sum") / _sample(
            lines, "claimwarden_eviction_latency_seconds_count")
        root = repo_root()
        rule = alert_rule(root, ALERT) if root else None
        if rule is None:
            self.say(f"(the alert {ALERT} is in manifests/monitoring/prometheusrule.yaml of the repository)")
            return
        self.say(f"Alert {ALERT} ({rule['expr']}, for {rule['for']}) fires when pods stay on a device marked "
                 f"NoExecute for {rule['for']}, for example because a PodDisruptionBudget refuses the eviction.")
        self.say(f"It did not fire here: claimwarden evicted trainer {latency:.1f}s after the mark "
                 f"(claimwarden_eviction_latency_seconds_sum), and no pod is pending now.")
        gone = _sample([line for line in lines if 'result="gone"' in line], "claimwarden_evictions_total")
        if gone:
            self.say(f'result="gone" counts {gone:.0f} later check(s) that found the pod already gone, '
                     'not evictions.')

    # after the scenes ------------------------------------------------------------------------------

    def foreground(self) -> int:
        """Stream claimwarden's log until it exits or Ctrl-C, which stops claimwarden and leaves the lab."""
        assert self.claimwarden is not None
        self.print()
        self.say(f"claimwarden keeps running on the lab; its log follows (also in {self._log_path()}).")
        me = self_command()
        self.say(f"Explore: eval \"$({me} lab env --dir {self.directory})\"; "
                 f"kubectl get pods,resourceclaims -n {NAMESPACE}")
        self.say(f"Ctrl-C stops claimwarden; 'make lab-down' (or '{me} lab down --dir {self.directory}') "
                 "stops the lab.")
        with self._log_path().open(errors="replace") as log:
            log.seek(0, os.SEEK_END)
            try:
                while is_running(self.claimwarden):
                    line = log.readline()
                    if line:
                        self.out.write(line)
                        self.out.flush()
                    else:
                        time.sleep(POLL_SECONDS)  # waiting for the log to grow, not pacing
                self.print(self.style.error(f"claimwarden exited; see {self._log_path()}"))
                self.stop_claimwarden()
                return 1
            except KeyboardInterrupt:
                pid = self.claimwarden.pid
                self.stop_claimwarden(announce=False)
                self.out.write(log.read())
                self.print(f"demo: stopped claimwarden (pid {pid})")
        self.print(f"demo: the lab keeps running in {self.directory}; 'make lab-down' "
                   f"(or '{self_command()} lab down --dir {self.directory}') stops it")
        return 0


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def run(options: DemoOptions, out: TextIO | None = None, environ: Mapping[str, str] | None = None) -> int:
    """Play the demo; return the exit code.

    SIGTERM is handled like Ctrl-C: clean up, stop what we started. SIGINT is handled even when the
    demo was started with it ignored (a shell's background job), so that Ctrl-C semantics are testable.
    """
    out = out or sys.stdout
    style = Style(use_colour(out, os.environ if environ is None else environ))
    previous = signal.signal(signal.SIGTERM, _interrupt), signal.signal(signal.SIGINT, _interrupt)
    started = time.monotonic()
    demo: Demo | None = None
    try:
        demo = Demo(options, out, style)
        demo.setup()
        demo.play()
        print(f"\ndemo: {len(demo.scenes)} scenes played in {time.monotonic() - started:.1f}s", file=out, flush=True)
        if not options.exit:
            return demo.foreground()
        demo.clean_up()
        return 0
    except (DemoError, LabError) as exc:
        print(style.error(f"demo: error: {exc}"), file=out, flush=True)
        if demo is not None:
            demo.clean_up()
        return 1
    except KeyboardInterrupt:
        print("\ndemo: interrupted; cleaning up", file=out, flush=True)
        if demo is not None:
            demo.clean_up()
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous[0])
        signal.signal(signal.SIGINT, previous[1])


def _established(crd: client.V1CustomResourceDefinition) -> bool:
    conditions = (crd.status.conditions if crd.status else None) or []
    return any(c.type == "Established" and c.status == "True" for c in conditions)
