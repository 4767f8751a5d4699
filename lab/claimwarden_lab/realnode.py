"""One real node beside the kwok nodes: a kubelet of the lab's version with containerd, runc and the
CNI bridge from Debian (`claimwarden lab up --real-node`), so that `manifests/base` runs as a real pod.

What this host needs, each found by running it here (docs/development/real-node.md, "A real node"):
- containerd's `restrict_oom_score_adj`: the sandbox lacks CAP_SYS_RESOURCE, and runc cannot give the
  pause container the kubelet's oom_score_adj -998 ("can't get final child's PID from pipe: EOF").
- CNI plugins where Debian installs them (/usr/lib/cni), not containerd's default /opt/cni/bin.
- A pause image made here (no registry): a static Go program in an OCI archive written below.
- The apiserver listens on 127.0.0.1 and no kube-proxy runs: pods reach it at the `kubernetes`
  Service address (10.0.0.1:443, in the serving certificate), which is put on `lo` with a forwarder
  behind it (forward.py). Only one real-node lab per host can hold that address.
- The ServiceAccount admission plugin on (cluster.py), so that pods get their token.
Needs root. `down` deletes the node's pods through the API first (the kubelet then tears their
sandboxes and networks down), stops the processes, and removes the address and the bridge.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import shutil
import socket
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable
from pathlib import Path

from .processes import LabError, Process, wait_until

NODE_NAME = "real-node-0"
SERVICE_IP = "10.0.0.1"
BRIDGE = "cwlab0"
POD_CIDR = "10.244.0.0/24"
CNI_BIN = Path("/usr/lib/cni")
PAUSE_IMAGE = "localhost/pause:3.10"
PAUSE_SOURCE = Path(__file__).with_name("pause")
Launch = Callable[[str, list[str]], Process]


def missing(bins: Path) -> list[str]:
    """What the real node needs and this host lacks, as install hints."""
    hints = []
    if os.geteuid() != 0:
        hints.append("root")
    if not (bins / "kubelet").is_file():
        hints.append("the kubelet (bins/build-kubelet.sh)")
    for tool, package in (("containerd", "containerd"), ("ctr", "containerd"), ("runc", "runc"), ("go", "Go")):
        if shutil.which(tool) is None:
            hints.append(f"{tool} ({package})")
    if not (CNI_BIN / "bridge").is_file():
        hints.append(f"{CNI_BIN}/bridge (containernetworking-plugins)")
    return hints


def _run(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    if check and result.returncode != 0:
        raise LabError(f"{' '.join(argv)} failed: {(result.stderr or result.stdout).strip()}")
    return result


def ctr(node: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return _run("ctr", f"--address={node / 'containerd.sock'}", "--namespace=k8s.io", *args, check=check)


def _host_ip() -> str:
    """The host's primary IPv4 address (the kubelet refuses a loopback node IP)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect(("192.0.2.123", 9))  # no packet is sent
        return str(probe.getsockname()[0])


def _service_ip_held() -> bool:
    return f"inet {SERVICE_IP}/" in _run("ip", "-4", "addr", "show").stdout


def _pause_archive(node: Path) -> Path:
    """An OCI archive of the pause image: the static Go program, alone in one layer."""
    binary = node / "pause"
    env = {**os.environ, "CGO_ENABLED": "0", "GOFLAGS": "-trimpath -buildvcs=false", "GOWORK": "off"}
    result = subprocess.run(["go", "build", "-ldflags=-s -w", "-o", str(binary), "."], cwd=PAUSE_SOURCE,
                            capture_output=True, text=True, env=env, timeout=300)
    if result.returncode != 0:
        raise LabError(f"building the pause binary failed: {result.stderr.strip()}")
    layer_tar = io.BytesIO()
    with tarfile.open(fileobj=layer_tar, mode="w") as tar:
        info = tar.gettarinfo(str(binary), arcname="pause")
        info.uid = info.gid = 0
        info.mtime = 0
        with binary.open("rb") as f:
            tar.addfile(info, f)
    diff_id = "sha256:" + hashlib.sha256(layer_tar.getvalue()).hexdigest()
    layer = gzip.compress(layer_tar.getvalue(), mtime=0)
    config = json.dumps({"architecture": "amd64", "os": "linux",
                         "config": {"Entrypoint": ["/pause"], "User": "65535:65535"},
                         "rootfs": {"type": "layers", "diff_ids": [diff_id]}}).encode()
    blobs = {"layer": layer, "config": config}
    digests = {k: hashlib.sha256(v).hexdigest() for k, v in blobs.items()}
    manifest = json.dumps({
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                   "digest": f"sha256:{digests['config']}", "size": len(config)},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
                    "digest": f"sha256:{digests['layer']}", "size": len(layer)}]}).encode()
    blobs["manifest"] = manifest
    digests["manifest"] = hashlib.sha256(manifest).hexdigest()
    index = json.dumps({"schemaVersion": 2, "manifests": [{
        "mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": f"sha256:{digests['manifest']}",
        "size": len(manifest), "annotations": {"org.opencontainers.image.ref.name": PAUSE_IMAGE}}]}).encode()
    archive = node / "pause.oci.tar"
    with tarfile.open(archive, "w") as tar:
        entries = {"oci-layout": b'{"imageLayoutVersion": "1.0.0"}', "index.json": index,
                   **{f"blobs/sha256/{digests[k]}": v for k, v in blobs.items()}}
        for name, data in entries.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return archive


def _containerd_config(node: Path) -> str:
    return f'''version = 2
root = "{node / 'containerd'}"
state = "{node / 'containerd-state'}"
[grpc]
  address = "{node / 'containerd.sock'}"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{PAUSE_IMAGE}"
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{CNI_BIN}"
    conf_dir = "{node / 'cni'}"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
'''


def _kubelet_config(node: Path) -> str:
    return f'''apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: 127.0.0.1
port: {_free_port()}
readOnlyPort: 0
healthzPort: 0
cgroupDriver: cgroupfs
failCgroupV1: false  # this host is cgroup v1; 1.35+ refuses to start without it
failSwapOn: false
containerRuntimeEndpoint: unix://{node / 'containerd.sock'}
authentication:
  anonymous: {{enabled: false}}
  webhook: {{enabled: true}}
authorization: {{mode: Webhook}}
podCIDR: {POD_CIDR}
resolvConf: ""
enforceNodeAllocatable: []
localStorageCapacityIsolation: false
evictionHard: {{}}
'''


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start(*, directory: Path, bins: Path, kubeconfig: Path, api_port: int, launch: Launch,
          say: Callable[[str], None]) -> None:
    """Start containerd, the apiserver forwarder and the kubelet; return once the node has registered."""
    hints = missing(bins)
    if hints:
        raise LabError(f"--real-node needs {', '.join(hints)}; on Debian: apt-get install containerd runc "
                       "containernetworking-plugins, and bins/build-kubelet.sh")
    if _service_ip_held():
        raise LabError(f"{SERVICE_IP} is already on this host (another real-node lab?); one real node per host")
    node = directory / "node"
    (node / "cni").mkdir(parents=True)
    (node / "containerd.toml").write_text(_containerd_config(node))
    (node / "cni" / "10-bridge.conflist").write_text(json.dumps({
        "cniVersion": "1.0.0", "name": "lab", "plugins": [
            {"type": "bridge", "bridge": BRIDGE, "isGateway": True, "ipMasq": True, "hairpinMode": True,
             "ipam": {"type": "host-local", "ranges": [[{"subnet": POD_CIDR}]], "routes": [{"dst": "0.0.0.0/0"}]}},
            {"type": "portmap", "capabilities": {"portMappings": True}}]}))
    say("starting containerd (real node)")
    containerd = launch("containerd", ["containerd", f"--config={node / 'containerd.toml'}"])
    wait_until("containerd", lambda: ctr(node, "version", check=False).returncode == 0, 60, [containerd])
    ctr(node, "images", "import", str(_pause_archive(node)))
    _run("ip", "addr", "add", f"{SERVICE_IP}/32", "dev", "lo")
    forward = launch("apiserver-forward", [sys.executable, "-m", "claimwarden_lab.forward",
                                           SERVICE_IP, "443", str(api_port)])
    (node / "kubelet.yaml").write_text(_kubelet_config(node))
    say(f"starting the kubelet (node {NODE_NAME})")
    kubelet = launch("kubelet", [
        str(bins / "kubelet"), f"--config={node / 'kubelet.yaml'}", f"--kubeconfig={kubeconfig}",
        f"--root-dir={node / 'kubelet'}", f"--cert-dir={node / 'kubelet-pki'}",
        f"--hostname-override={NODE_NAME}", f"--node-ip={_host_ip()}", "--v=1"])
    del forward, kubelet


def import_image(directory: Path, archive: Path, name: str) -> None:
    """Import an OCI archive into the node's containerd under ``name`` as the kubelet resolves it."""
    node = directory / "node"
    out = ctr(node, "images", "import", str(archive)).stdout
    imported = next((w for line in out.splitlines() for w in line.split() if "/" in w and ":" in w), "")
    full = name if "/" in name.split(":")[0] else f"docker.io/library/{name}"
    if imported and imported != full:
        ctr(node, "images", "tag", "--force", imported, full)


def stop_pods(directory: Path, list_pods: Callable[[], list[tuple[str, str]]],
              delete_pod: Callable[[str, str], None]) -> None:
    """Delete the node's pods through the API and wait for their containers to go (CNI teardown included)."""
    node = directory / "node"
    for namespace, name in list_pods():
        delete_pod(namespace, name)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        tasks = ctr(node, "tasks", "ls", "-q", check=False).stdout.split()
        if not tasks and not list_pods():
            return
        time.sleep(1)
    for task in ctr(node, "tasks", "ls", "-q", check=False).stdout.split():
        ctr(node, "tasks", "kill", "--signal=SIGKILL", task, check=False)
        ctr(node, "tasks", "rm", "--force", task, check=False)


def unmount(directory: Path) -> None:
    """Unmount what the kubelet and containerd left mounted under the lab (the kubelet bind-mounts its
    root directory onto itself), deepest first, so that the directory can be removed."""
    node = str((directory / "node").resolve())
    mounts = [line.split()[1] for line in Path("/proc/mounts").read_text().splitlines()]
    for target in sorted((m for m in mounts if m == node or m.startswith(node + "/")), key=len, reverse=True):
        _run("umount", "--lazy", target, check=False)


def cleanup_host() -> None:
    """Undo what start() changed outside the lab directory: the Service address and the bridge."""
    if _service_ip_held():
        _run("ip", "addr", "del", f"{SERVICE_IP}/32", "dev", "lo", check=False)
    _run("ip", "link", "del", BRIDGE, check=False)
