"""Setting the stage up and taking it down: the lab, the CRDs, claimwarden, the demo's namespace.

The demo starts the lab (unless one already runs in ``--dir``) and claimwarden, and gives the scenes
a fresh ``demo`` namespace (a leftover one from an earlier run is removed first). Afterwards
claimwarden keeps running in the foreground, streaming its log, until Ctrl-C (which stops claimwarden
and nothing else); ``--exit`` instead ends after the last scene and stops what the demo started.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from .. import cluster, guests
from ..processes import free_port, http_ok, is_running, start, stop
from .narration import self_command
from .options import DEMO_GPUS_PER_NODE, DEMO_NODES, FALLBACK, LOG_NAME, MARK_PREFIX, NAMESPACE, DemoError, repo_root
from .stage import POLL_SECONDS, Stage


def setup(stage: Stage) -> None:
    root = repo_root()
    if root is None:
        raise DemoError("the demo installs claimwarden's CRD from the repository's crds/, which an installed "
                        "wheel does not ship; run it from a clone: 'make demo'")
    state = cluster.LabState.load(stage.directory)
    if state is not None and state.ready and len(state.running()) == len(state.processes):
        stage.print(f"demo: using the lab already running in {stage.directory} (the demo leaves it running)")
        lab_models = state.options.get("models") or []
        if stage.models and any(m not in lab_models for m in FALLBACK):
            raise DemoError(f"the lab in {stage.directory} runs {','.join(lab_models) or 'other models'}, "
                            f"not {' and '.join(FALLBACK)}; stop it ('{self_command()} lab down --dir "
                            f"{stage.directory}') so that the demo starts one with --models, or drop --models")
    else:
        state = cluster.up(cluster.LabOptions(
            dir=stage.directory, nodes=max(DEMO_NODES, len(stage.models)), gpus_per_node=DEMO_GPUS_PER_NODE,
            models=",".join(stage.models) or None), say=lambda line: stage.print(f"lab: {line}"))
        stage.started_lab = True
    stage.state = state
    for proc in guests.stop_guests(stage.directory):
        stage.print(f"demo: stopped {proc.name} (pid {proc.pid}), left running by an earlier demo")
    stage.api = config.new_client_from_config(config_file=str(state.kubeconfig))
    _install_crds(stage, root=root)
    _start_claimwarden(stage)
    _fresh_namespace(stage)


def _install_crds(stage: Stage, *, root: Path) -> None:
    assert stage.state is not None
    kubectl = [f"{stage.state.bin_dir}/kubectl", f"--kubeconfig={stage.state.kubeconfig}"]
    args = ["apply", "-k", str(root / "crds")]
    result = subprocess.run([*kubectl, *args], capture_output=True, text=True, timeout=90, check=False)
    if result.returncode:
        raise DemoError(f"'kubectl {shlex.join(args)}' failed: {result.stderr.strip()}")
    # Polled here rather than with `kubectl wait --for=condition=Established`: that fails at once ("accessor
    # error") when it reads a CRD before the apiserver has written any condition.
    names = ("unhealthydevices.claimwarden.io", "healthpolicies.claimwarden.io")
    extensions = client.ApiextensionsV1Api(stage.api)
    deadline = time.monotonic() + 60
    while not all(_established(extensions.read_custom_resource_definition(name)) for name in names):
        if time.monotonic() > deadline:
            raise DemoError(f"the CRDs {', '.join(names)} were not Established within 60 s")
        time.sleep(0.2)
    stage.print("demo: installed the UnhealthyDevice and HealthPolicy CRDs (kubectl apply -k crds/)")


def _start_claimwarden(stage: Stage) -> None:
    assert stage.state is not None
    liveness = free_port()
    stage.metrics_port = free_port()
    stage.claimwarden = start(LOG_NAME, [
        sys.executable, "-m", "claimwarden", "run", "--kubeconfig", str(stage.state.kubeconfig),
        "--liveness", f"http://127.0.0.1:{liveness}/healthz",
        "--metrics-address", "127.0.0.1", "--metrics-port", str(stage.metrics_port),
        # One process on a development lab: no Lease to wait for after an interrupted demo.
        "--leader-elect=false"], stage.directory / "logs")
    guests.add_guest(stage.directory, stage.claimwarden)
    stage.wait("claimwarden's liveness endpoint", lambda: http_ok(f"http://127.0.0.1:{liveness}/healthz"))
    stage.print(f"demo: claimwarden runs (pid {stage.claimwarden.pid}, metrics on 127.0.0.1:{stage.metrics_port}, "
                f"log {stage.log_path()})")


def _fresh_namespace(stage: Stage) -> None:
    if _namespace_exists(stage):
        stage.print(f"demo: removing namespace {NAMESPACE} left by an earlier demo")
        _delete_namespace(stage)
    stage.core.create_namespace(body=client.V1Namespace.model_validate({"metadata": {"name": NAMESPACE}}))


def _namespace_exists(stage: Stage) -> bool:
    try:
        stage.core.read_namespace(NAMESPACE)
        return True
    except ApiException as exc:
        if exc.status == 404:
            return False
        raise


def _delete_namespace(stage: Stage) -> None:
    with contextlib.suppress(ApiException):
        stage.core.delete_namespace(NAMESPACE)
    stage.wait(f"namespace {NAMESPACE} to be deleted", lambda: not _namespace_exists(stage))


def _unmark(stage: Stage) -> None:
    if stage.marked is None:
        return
    slice_name, device = stage.marked
    stage.print(f"demo: clearing the mark on {device} (annotation {MARK_PREFIX}{device} on {slice_name})")
    stage.resource.patch_resource_slice(slice_name, {"metadata": {"annotations": {MARK_PREFIX + device: None}}})
    stage.marked = None
    node = stage.broken[0]
    stage.wait("claimwarden to remove the UnhealthyDevice record", lambda: not stage.record_of(node, device), 30)


def clean_up(stage: Stage) -> None:
    """Undo what the scenes did, then stop what the demo started (and only that).

    The lab stays unless the demo started it and --exit was given. Objects are removed while
    claimwarden still runs, since it is what releases their devices and finalizers. A second
    Ctrl-C skips the waiting but still stops the processes.
    """
    lab_goes = stage.started_lab and stage.options.exit
    try:
        if stage.api is not None and stage.claimwarden is not None and not lab_goes:
            _unmark(stage)
            if _namespace_exists(stage):
                stage.print(f"demo: deleting namespace {NAMESPACE}")
                _delete_namespace(stage)
    except (KeyboardInterrupt, DemoError, ApiException) as exc:
        stage.print(f"demo: clean-up cut short ({type(exc).__name__}: {exc}); the next demo removes the rest")
    finally:
        stop_claimwarden(stage)
        if lab_goes:
            cluster.down(stage.directory, say=lambda line: stage.print(f"lab: {line}"))
        if stage.api is not None:
            stage.api.close()


def stop_claimwarden(stage: Stage, *, announce: bool = True) -> None:
    if stage.claimwarden is None:
        return
    stop(stage.claimwarden, grace=30)
    guests.remove_guest(stage.directory, stage.claimwarden)
    if announce:
        stage.print(f"demo: stopped claimwarden (pid {stage.claimwarden.pid})")
    stage.claimwarden = None


def foreground(stage: Stage) -> int:
    """Stream claimwarden's log until it exits or Ctrl-C, which stops claimwarden and leaves the lab."""
    assert stage.claimwarden is not None
    stage.print()
    stage.say(f"claimwarden keeps running on the lab; its log follows (also in {stage.log_path()}).")
    me = self_command()
    stage.say(f"Explore: eval \"$({me} lab env --dir {stage.directory})\"; "
              f"kubectl get pods,resourceclaims -n {NAMESPACE}")
    stage.say(f"Ctrl-C stops claimwarden; 'make lab-down' (or '{me} lab down --dir {stage.directory}') "
              "stops the lab.")
    with stage.log_path().open(errors="replace") as log:
        log.seek(0, os.SEEK_END)
        try:
            while is_running(stage.claimwarden):
                line = log.readline()
                if line:
                    stage.out.write(line)
                    stage.out.flush()
                else:
                    time.sleep(POLL_SECONDS)  # waiting for the log to grow, not pacing
            stage.print(stage.style.error(f"claimwarden exited; see {stage.log_path()}"))
            stop_claimwarden(stage)
            return 1
        except KeyboardInterrupt:
            pid = stage.claimwarden.pid
            stop_claimwarden(stage, announce=False)
            stage.out.write(log.read())
            stage.print(f"demo: stopped claimwarden (pid {pid})")
    stage.print(f"demo: the lab keeps running in {stage.directory}; 'make lab-down' "
                f"(or '{self_command()} lab down --dir {stage.directory}') stops it")
    return 0


def _established(crd: client.V1CustomResourceDefinition) -> bool:
    conditions = (crd.status.conditions if crd.status else None) or []
    return any(c.type == "Established" and c.status == "True" for c in conditions)
