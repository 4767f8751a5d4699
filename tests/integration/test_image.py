"""The built image runs against the lab as a pod would run it.

`image/build.sh` builds it with podman (from Debian, on a local mmdebstrap base, see image/), once per
session; the layer cache makes a rebuild of unchanged sources take seconds. The container gets what a
pod gets: the ServiceAccount's token, the cluster CA and the namespace where in-cluster config looks
for them, KUBERNETES_SERVICE_HOST/PORT and POD_NAME; and it runs as the Deployment runs it: user
65532, read-only root, no capabilities. Host network, since the lab's apiserver listens on 127.0.0.1.

If podman cannot build or run here, these tests fail: `make test` installs it (image/install-podman.sh).
"""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, config

from claimwarden import __version__
from claimwarden_lab import cluster
from claimwarden_lab.processes import free_port

from .conftest import SERVICE_ACCOUNT
from .health_helpers import device_of, mark, record_for, unmark, wait_gone
from .helpers import pod_with_claims, template, wait_for
from .operator import LOG_PATHS, Operator, fetch

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "CONTAINERS_CONF": str(ROOT / "image" / "containers.conf")}
VERSION = __version__
IMAGE = f"localhost/claimwarden:{VERSION}"
TOKEN_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"


def podman(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["podman", *args], capture_output=True, text=True, env=ENV, timeout=timeout)


def build_image() -> str:
    """The image, built (or brought up to date) by image/build.sh with podman; also the OCI archive.
    Behind the session fixture `image` (conftest.py)."""
    result = subprocess.run([str(ROOT / "image" / "build.sh")], capture_output=True, text=True, cwd=ROOT,
                            env={**ENV, "ENGINE": "podman", "IMAGE": IMAGE}, timeout=1200)
    if result.returncode != 0:
        pytest.fail(f"image/build.sh failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}", pytrace=False)
    assert (ROOT / "dist" / f"claimwarden-{VERSION}.oci.tar").stat().st_size > 50_000_000
    return IMAGE


def test_the_image_holds_the_locked_dependencies_and_no_lab(image: str) -> None:
    probe = ("import importlib.metadata as m, importlib.util as u, json, os\n"
             "names = sorted(d.metadata['Name'].lower().replace('_', '-') for d in m.distributions())\n"
             "print(json.dumps({'dists': names,\n"
             "  'lab': u.find_spec('claimwarden_lab') is not None, 'pip_conf': os.path.exists('/etc/pip.conf'),\n"
             "  'uid': os.getuid()}))")
    result = podman("run", "--rm", "--network=none", "--read-only", "--cap-drop=ALL", "--entrypoint=python",
                    image, "-c", probe)
    assert result.returncode == 0, result.stderr
    found = json.loads(result.stdout)
    locked = {line.split("==")[0].strip().lower() for line in (ROOT / "requirements.lock").read_text().splitlines()
              if "==" in line and not line.startswith("#")}
    assert set(found["dists"]) == locked | {"claimwarden"}, set(found["dists"]) ^ (locked | {"claimwarden"})
    assert not found["lab"] and "claimwarden-lab" not in found["dists"] and "cryptography" not in found["dists"]
    assert "pip" not in found["dists"], "no pip in the final image"
    assert not found["pip_conf"], "the build's pip configuration was mounted, not copied"
    assert found["uid"] == 65532
    config = json.loads(podman("image", "inspect", image).stdout)[0]["Config"]
    assert config["User"] == "65532:65532" and config["Entrypoint"] == ["claimwarden", "run"]


def _service_account_files(lab: cluster.LabState, directory: Path) -> Path:
    """token, ca.crt and namespace as the kubelet projects them (a TokenRequest for the ServiceAccount)."""
    namespace, name = SERVICE_ACCOUNT
    with config.new_client_from_config(config_file=str(lab.kubeconfig)) as admin:
        token = client.CoreV1Api(admin).create_namespaced_service_account_token(name, namespace, body={
            "spec": {"audiences": [], "expirationSeconds": 3600}}).status.token
    directory.mkdir(mode=0o755)
    (directory / "token").write_text(token)
    (directory / "ca.crt").write_bytes((lab.dir / "pki" / "ca.crt").read_bytes())
    (directory / "namespace").write_text(namespace)
    for path in (directory, *directory.iterdir()):
        path.chmod(0o755 if path.is_dir() else 0o644)  # readable by 65532, as the kubelet's projection is
    return directory


class Container:
    """One `podman run` of the image in the foreground, its output in a log the auditor reads."""

    def __init__(self, image: str, lab: cluster.LabState, secrets: Path, log: Path) -> None:
        self.name = f"claimwarden-image-{uuid.uuid4().hex[:6]}"
        self.liveness_port, self.metrics_port = free_port(), free_port()
        self.log = log
        LOG_PATHS.append(log)
        port = lab.api_url.rsplit(":", 1)[1]
        argv = ["podman", "run", "--rm", f"--name={self.name}", "--network=host", "--read-only",
                "--cap-drop=ALL", "--security-opt=no-new-privileges", "--user=65532:65532",
                # As in Kubernetes: no /etc/passwd entry for 65532 (podman would add one).
                "--passwd=false",
                f"--volume={secrets}:{TOKEN_DIR}:ro",
                "--env=KUBERNETES_SERVICE_HOST=127.0.0.1", f"--env=KUBERNETES_SERVICE_PORT={port}",
                f"--env=POD_NAME={self.name}", image,
                f"--liveness=http://127.0.0.1:{self.liveness_port}/healthz",
                "--metrics-address=127.0.0.1", f"--metrics-port={self.metrics_port}",
                "--namespace=claimwarden-system", "--log-format=full"]
        with log.open("ab") as out:
            self.proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=ENV)

    def alive(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"the container exited with {self.proc.returncode}:\n{self.tail()}")
        return fetch(f"http://127.0.0.1:{self.liveness_port}/healthz") is not None

    def metrics(self) -> str:
        return fetch(f"http://127.0.0.1:{self.metrics_port}/metrics") or ""

    def inspect(self) -> dict[str, Any]:
        result = podman("inspect", self.name)
        assert result.returncode == 0, result.stderr
        found: dict[str, Any] = json.loads(result.stdout)[0]
        return found

    def terminate(self, timeout: float = 40) -> int:
        """SIGTERM to the container's process, as the kubelet sends it; the exit code."""
        if self.proc.poll() is None:
            podman("kill", "--signal=TERM", self.name)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                podman("kill", "--signal=KILL", self.name)
                self.proc.wait()
        return int(self.proc.returncode)

    def tail(self, lines: int = 40) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])


@pytest.fixture
def container(image: str, lab: cluster.LabState, operator_process: Operator,
              tmp_path: Path) -> Iterator[Container]:
    """The image running as the leader: the session's claimwarden steps down (hands the Lease over) meanwhile."""
    secrets = _service_account_files(lab, tmp_path / "serviceaccount")
    with operator_process.stopped():
        running = Container(image, lab, secrets, tmp_path / "container.log")
        try:
            yield running
        finally:
            code = running.terminate()
            assert code == 0, f"the container exited with {code} on SIGTERM:\n{running.tail()}"


def _status(pid: int) -> dict[str, str]:
    lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    return {k: v.strip() for k, _, v in (line.partition(":") for line in lines)}


def test_the_image_runs_in_cluster_as_65532_read_only_without_capabilities(
        container: Container, api: client.ApiClient, namespace: str) -> None:
    wait_for("the container's /healthz", container.alive, 120)
    wait_for("the container to lead", lambda: "\nclaimwarden_leader 1.0" in container.metrics(), 90)

    # What the runtime made of it, seen from the host: the process's user and capabilities.
    state = container.inspect()
    assert state["HostConfig"]["ReadonlyRootfs"] is True
    status = _status(int(state["State"]["Pid"]))
    assert status["Uid"].split()[:2] == ["65532", "65532"] and status["Gid"].split()[0] == "65532", status
    assert int(status["CapEff"], 16) == 0 and int(status["CapPrm"], 16) == 0, status
    assert status["NoNewPrivs"] == "1"
    assert "claimwarden_build_info{" in container.metrics()

    # It generates a claim for a pod from a template (in-cluster config: the mounted token, the lab's CA).
    core, resource = client.CoreV1Api(api), client.ResourceV1Api(api)
    resource.create_namespaced_resource_claim_template(namespace, body=template("single-gpu"))
    core.create_namespaced_pod(namespace, body=pod_with_claims(
        "victim", [{"name": "gpu", "resourceClaimTemplateName": "single-gpu"}]))
    wait_for("victim Running", lambda: core.read_namespaced_pod("victim", namespace).status.phase == "Running")
    [claim] = resource.list_namespaced_resource_claim(namespace).items
    assert claim.metadata.name.startswith("victim-gpu-") and claim.metadata.owner_references[0].name == "victim"
    assert 'claimwarden_claim_creations_total{result="success"}' in container.metrics()

    # It evicts the pod from a device marked unhealthy, and lets go when the mark is removed.
    pool, device = device_of(api, namespace, "victim")
    mark(api, pool, device, "ECC errors, seen by the image test")
    try:
        wait_gone(api, namespace, "victim")
        assert record_for(api, pool, device) is not None
        wait_for("an eviction in the container's metrics", lambda: any(
            line.startswith('claimwarden_evictions_total{result="evicted"}') and float(line.split()[-1]) >= 1
            for line in container.metrics().splitlines()), 30)
    finally:
        unmark(api, pool, device)
    wait_for("the record gone", lambda: record_for(api, pool, device) is None, 60)

    # SIGTERM: a clean exit (0) that hands the Lease over; the fixture checks the code.
    assert container.terminate() == 0, container.tail()
    assert "Traceback" not in container.log.read_text()
