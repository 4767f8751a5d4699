"""`make deploy` on a lab with one real node: claimwarden runs as a real pod of the built image.

The lab (`lab up --real-node`, claimwarden_lab/realnode.py) adds a kubelet with containerd, runc and
the CNI bridge beside a kwok node. The image from test_image.py is imported into containerd and
`manifests/base` applied, pinned to the real node with one replica (a kustomize overlay); the kwok
node carries the fake GPUs. The pod must pass its liveness probe, log in with its ServiceAccount's
projected token, be admitted by the namespace's `restricted` Pod Security level, run as 65532
without capabilities, and evict a pod from a device marked unhealthy.

First, on the same lab, `kubectl claimwarden drain` empties the real node: a real kubelet stops the pods and
confirms their end, and none stays Terminating (the pause container exits on SIGTERM at once, so a grace period is
set but not waited out). The real node has no DRA driver (its kubelet prepares no claims:
DESIGN.md, out of scope), so these pods use no claims; the DRA order is tested on kwok (test_plugin_drain.py).
"""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client, config

from claimwarden_lab import realnode
from claimwarden_lab.cluster import LabState

from .conftest import extra_lab
from .health_helpers import evicts_from_a_marked_device
from .helpers import wait_for
from .test_image import ROOT, VERSION

BASE = ROOT / "manifests" / "base"


@pytest.fixture(scope="module")
def real_lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LabState]:
    with extra_lab(tmp_path_factory, nodes=1, gpus_per_node=4, real_node=True) as state:
        yield state


def _kubectl(lab: LabState, *args: str) -> str:
    result = subprocess.run([f"{lab.bin_dir}/kubectl", f"--kubeconfig={lab.kubeconfig}", *args],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, f"kubectl {' '.join(args)}:\n{result.stdout}{result.stderr}"
    return result.stdout


def _overlay(directory: Path) -> Path:
    """manifests/base, one replica on the real node."""
    directory.mkdir()
    (directory / "kustomization.yaml").write_text(json.dumps({
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        "resources": [os.path.relpath(BASE, directory)],  # kustomize refuses an absolute base
        "images": [{"name": "claimwarden", "newTag": VERSION}],  # the base names no tag (make deploy's overlay)
        "patches": [{"target": {"kind": "Deployment", "name": "claimwarden"}, "patch": json.dumps([
            {"op": "replace", "path": "/spec/replicas", "value": 1},
            {"op": "add", "path": "/spec/template/spec/nodeSelector",
             "value": {"kubernetes.io/hostname": realnode.NODE_NAME}}])}]}))
    return directory


def _status(pid: int) -> dict[str, str]:
    lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    return {k: v.strip() for k, _, v in (line.partition(":") for line in lines)}


def test_drain_empties_the_real_node_and_leaves_no_pod_terminating(real_lab: LabState) -> None:
    api = config.new_client_from_config(config_file=str(real_lab.kubeconfig))
    core = client.CoreV1Api(api)
    namespace = "real-node-drain"
    core.create_namespace(body={"metadata": {"name": namespace}})
    wait_for("the namespace's default ServiceAccount", lambda: core.list_namespaced_service_account(
        namespace, field_selector="metadata.name=default").items, 60)
    grace = {"quick": 0, "graceful": 5}
    for name, seconds in grace.items():
        core.create_namespaced_pod(namespace, body={"metadata": {"name": name}, "spec": {
            "nodeSelector": {"kubernetes.io/hostname": realnode.NODE_NAME}, "terminationGracePeriodSeconds": seconds,
            "containers": [{"name": "c", "image": realnode.PAUSE_IMAGE, "imagePullPolicy": "Never"}]}})
    wait_for("both pods running on the real node", lambda: all(
        core.read_namespaced_pod(n, namespace).status.phase == "Running" for n in grace), 120)
    started = time.monotonic()
    try:
        drain = subprocess.run([str(Path(sys.executable).parent / "kubectl-claimwarden"), "drain", realnode.NODE_NAME,
                                f"--kubeconfig={real_lab.kubeconfig}", "--force", "--timeout", "60s"],
                               capture_output=True, text=True, timeout=90)
        took = time.monotonic() - started
        assert drain.returncode == 0, drain.stdout + drain.stderr
        print(f"drained {realnode.NODE_NAME} in {took:.1f}s\n{drain.stdout}")
        assert {f"evicted pod {namespace}/{n}" in drain.stdout for n in grace} == {True}
        assert took <= max(grace.values()) + 30
        # The kubelet confirmed each pod's end: none left, Terminating or not.
        assert not core.list_namespaced_pod(namespace).items
    finally:
        core.patch_node(realnode.NODE_NAME, {"spec": {"unschedulable": None}})
        core.delete_namespace(namespace)
        api.close()


def test_make_deploy_runs_claimwarden_as_a_real_pod_that_evicts(
        real_lab: LabState, image: str, tmp_path: Path) -> None:
    realnode.import_image(real_lab.dir, ROOT / "dist" / f"claimwarden-{VERSION}.oci.tar", f"claimwarden:{VERSION}")
    _kubectl(real_lab, "apply", "-k", str(_overlay(tmp_path / "overlay")))
    api = config.new_client_from_config(config_file=str(real_lab.kubeconfig))
    core = client.CoreV1Api(api)

    def claimwarden_pod() -> client.V1Pod | None:
        pods = core.list_namespaced_pod("claimwarden-system", label_selector="app.kubernetes.io/name=claimwarden")
        ready = [p for p in pods.items if p.status.container_statuses
                 and p.status.container_statuses[0].ready and p.spec.node_name == realnode.NODE_NAME]
        return ready[0] if ready else None

    pod = wait_for("claimwarden Ready on the real node", claimwarden_pod, 120)
    log_glob = f"/var/log/pods/claimwarden-system_{pod.metadata.name}_{pod.metadata.uid}/claimwarden/*.log"

    def log() -> str:
        return "".join(Path(f).read_text(errors="replace") for f in glob.glob(log_glob))

    # Probes: the kubelet's liveness probe answered 200 (first after initialDelaySeconds 10).
    wait_for("a passing liveness probe", lambda: '"GET /healthz HTTP/1.1\\" 200' in log() and "kube-probe" in log(), 60)
    assert "leads (Lease claimwarden-system/claimwarden)" in log()
    # RBAC is the ServiceAccount's: the only credential in the pod is its projected token.
    assert pod.spec.service_account_name == "claimwarden"
    mounts = {m.mount_path for m in pod.spec.containers[0].volume_mounts}
    assert "/var/run/secrets/kubernetes.io/serviceaccount" in mounts
    # Pod security: admitted where `restricted` is enforced; the process, seen from the host.
    labels = core.read_namespace("claimwarden-system").metadata.labels
    assert labels["pod-security.kubernetes.io/enforce"] == "restricted"
    node = real_lab.dir / "node"
    container_id = pod.status.container_statuses[0].container_id.split("//")[-1]
    tasks = {line.split()[0]: line.split()[1] for line in realnode.ctr(node, "tasks", "ls").stdout.splitlines()[1:]}
    status = _status(int(tasks[container_id]))
    assert status["Uid"].split()[0] == "65532" and int(status["CapEff"], 16) == 0, status

    # The device-health scenario, with claimwarden running as that pod.
    evicts_from_a_marked_device(api, "real-node-health", "ECC errors, seen on the real node")
    assert "Traceback" not in log(), log()[-3000:]
    api.close()
