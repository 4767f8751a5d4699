"""`claimwarden lab` and `claimwarden run` as a user drives them, against the session's lab."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from kubernetes import client

from claimwarden_lab import binaries, cluster
from claimwarden_lab.processes import free_port, is_running

from .conftest import lab_kubernetes
from .helpers import wait_for
from .operator import fetch

CLI = [sys.executable, "-m", "claimwarden"]


def _cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=timeout, check=False)


def test_kubectl_reports_the_real_server_version(lab: cluster.LabState) -> None:
    """Each version's binaries are stamped with their real version (bins/build.sh), and the lab runs the one asked."""
    out = subprocess.run([f"{lab.bin_dir}/kubectl", f"--kubeconfig={lab.kubeconfig}", "version", "-o", "json"],
                         capture_output=True, text=True, check=True).stdout
    wanted = f"v{binaries.resolve_version(lab_kubernetes())}"
    versions = json.loads(out)
    assert versions["serverVersion"]["gitVersion"] == wanted
    assert versions["clientVersion"]["gitVersion"] == wanted
    assert lab.options["kubernetes"] == wanted[1:]


def test_lab_publishes_nodes_device_class_and_slices(api: client.ApiClient) -> None:
    nodes = client.CoreV1Api(api).list_node().items
    assert sorted(n.metadata.name for n in nodes) == ["kwok-node-0", "kwok-node-1"]
    resource = client.ResourceV1Api(api)
    assert resource.read_device_class("gpu.example.com").spec.selectors[0].cel.expression == (
        "device.driver == 'gpu.example.com'")
    slices = resource.list_resource_slice().items
    assert sorted(s.spec.node_name for s in slices) == ["kwok-node-0", "kwok-node-1"]
    for s in slices:
        assert [d.name for d in s.spec.devices] == [f"gpu-{i}" for i in range(8)]
        assert s.metadata.owner_references[0].kind == "Node"


def test_second_up_on_running_lab_changes_nothing(lab: cluster.LabState) -> None:
    pids = [p.pid for p in lab.processes]
    result = _cli("lab", "up", "--dir", str(lab.dir))
    assert result.returncode == 0, result.stderr
    assert "already running" in result.stdout
    after = cluster.LabState.load(lab.dir)
    assert after is not None and [p.pid for p in after.processes] == pids
    assert all(is_running(p) for p in after.processes)


def test_env_points_at_the_lab(lab: cluster.LabState) -> None:
    result = _cli("lab", "env", "--dir", str(lab.dir))
    assert result.returncode == 0
    assert f"export KUBECONFIG={lab.kubeconfig}" in result.stdout.splitlines()
    assert lab.bin_dir in result.stdout
    status = _cli("lab", "status", "--dir", str(lab.dir)).stdout
    assert "kube-apiserver" in status and "STOPPED" not in status


def test_wrong_models_is_one_clear_line_and_starts_nothing(tmp_path: Path) -> None:
    result = _cli("lab", "up", "--dir", str(tmp_path / "lab"), "--models", "H100,X9")
    assert result.returncode == 1
    assert result.stderr.strip().count("\n") == 0
    assert "'X9'" in result.stderr and "H100,A100,L4" in result.stderr
    assert not (tmp_path / "lab").exists()


def test_busy_port_is_one_clear_line_and_starts_nothing(tmp_path: Path, lab: cluster.LabState) -> None:
    busy = lab.ports["apiserver"]
    result = _cli("lab", "up", "--dir", str(tmp_path / "lab"), "--api-port", str(busy))
    assert result.returncode == 1
    assert result.stderr.strip().count("\n") == 0
    assert f"port {busy}" in result.stderr and "already in use" in result.stderr
    assert not (tmp_path / "lab").exists()


def test_stale_lab_is_cleared_and_down_stops_everything_by_pid(tmp_path: Path) -> None:
    """A lab whose processes were killed is replaced on `up`; `down` leaves no process behind."""
    directory = tmp_path / "lab"
    first = _cli("lab", "up", "--dir", str(directory), "--nodes", "1", "--gpus-per-node", "2")
    assert first.returncode == 0, first.stderr
    state = cluster.LabState.load(directory)
    assert state is not None
    for proc in state.processes:  # a killed run: every process gone, the state left behind
        os.killpg(proc.pid, signal.SIGKILL)
    wait_for("killed lab processes to exit", lambda: not any(is_running(p) for p in state.processes), 30)

    second = _cli("lab", "up", "--dir", str(directory), "--nodes", "1", "--gpus-per-node", "2")
    assert second.returncode == 0, second.stderr
    assert "stale lab" in second.stdout
    fresh = cluster.LabState.load(directory)
    assert fresh is not None and all(is_running(p) for p in fresh.processes)

    down = _cli("lab", "down", "--dir", str(directory))
    assert down.returncode == 0, down.stderr
    assert not any(is_running(p) for p in fresh.processes)
    assert not directory.exists()


def test_run_connects_serves_liveness_and_metrics_and_exits_on_sigterm(lab: cluster.LabState,
                                                                        tmp_path: Path) -> None:
    live, metrics = free_port(), free_port()
    log = (tmp_path / "run.log").open("w")
    proc = subprocess.Popen([*CLI, "run", "--kubeconfig", str(lab.kubeconfig),
                             "--liveness", f"http://127.0.0.1:{live}/healthz",
                             "--metrics-address", "127.0.0.1", "--metrics-port", str(metrics)],
                            stdout=log, stderr=subprocess.STDOUT)
    try:
        health = wait_for("liveness endpoint", lambda: fetch(f"http://127.0.0.1:{live}/healthz"), 60)
        assert '"version"' in health
        exposition = wait_for("metrics endpoint", lambda: fetch(f"http://127.0.0.1:{metrics}/metrics"), 30)
        assert "claimwarden_build_info{" in exposition
        wanted = binaries.resolve_version(lab_kubernetes())
        assert f"connected to Kubernetes v{wanted}" in (tmp_path / "run.log").read_text()

        started = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
        assert time.monotonic() - started < 30
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        log.close()
