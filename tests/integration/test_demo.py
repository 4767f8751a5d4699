"""`claimwarden lab demo --exit`, as `make demo` plays it but non-interactively, on its own lab.

Each test runs the demo as a subprocess with its own lab in a temporary directory (stdout piped, so
no colour), then asserts every scene's outcome from the real kubectl output the demo printed, the
time it took, and that nothing it started is left running. The demo itself also checks each outcome
it narrates; these assertions make sure the story on screen says it.

The demo's own lab is not the session's, so the auditor's lab rules do not apply; the demo stops
its claimwarden and its lab before the auditor runs.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

CLI = [sys.executable, "-m", "claimwarden"]
# The issue asks for under 90 s; the bound is wider because this machine is shared (the measured time
# is printed, see -s or the report of a failure).
MAX_SECONDS = 150.0
HEADING = re.compile(r"^== (\d+)/(\d+)\. (.+) ==$", re.MULTILINE)


def _play(directory: Path, *options: str) -> tuple[str, float]:
    env = {k: v for k, v in os.environ.items() if k != "NO_COLOR"}
    started = time.monotonic()
    result = subprocess.run([*CLI, "lab", "demo", "--exit", "--dir", str(directory), *options], env=env,
                            stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=400, check=False)
    seconds = time.monotonic() - started
    print(f"demo {' '.join(options)} took {seconds:.1f}s\n{result.stdout}")
    assert result.returncode == 0, f"the demo failed ({seconds:.0f}s):\n{result.stdout}\n{result.stderr}"
    return result.stdout, seconds


def _scenes(output: str) -> dict[str, str]:
    """Scene title -> what the scene printed; checks the headings count 1..N."""
    marks = list(HEADING.finditer(output))
    assert [int(m.group(1)) for m in marks] == list(range(1, len(marks) + 1))
    assert {int(m.group(2)) for m in marks} == {len(marks)}
    return {m.group(3): output[m.end():marks[i + 1].start() if i + 1 < len(marks) else len(output)]
            for i, m in enumerate(marks)}


def _table(scene: str, command: str, occurrence: int = -1, whole: bool = False) -> list[list[str]]:
    """The rows (split on spaces) printed right after the `$ kubectl ...` line containing ``command``
    (being `$ kubectl <command>` if ``whole``)."""
    blocks = []
    lines = scene.splitlines()
    for i, line in enumerate(lines):
        if line == f"$ kubectl {command}" if whole else line.startswith("$ ") and command in line:
            rows = []
            for row in lines[i + 1:]:
                if not row.strip() or row.startswith(("# ", "$ ", "== ", "demo:")):
                    break
                rows.append(row.split())
            blocks.append(rows[1:])  # without the header
    assert blocks, f"no '$ ...{command}...' in:\n{scene}"
    return blocks[occurrence]


def _claims(scene: str) -> dict[str, tuple[str, str, str]]:
    """The claim table (CLAIM NODE DEVICE RESERVED_FOR) the scene printed last."""
    return {row[0]: (row[1], row[2], row[3]) for row in _table(scene, "custom-columns=CLAIM:")}


def _leftovers(directory: Path) -> list[str]:
    """Processes whose command line names the demo's directory: the lab's and claimwarden."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if str(directory) in cmdline:
            found.append(f"{proc.name}: {cmdline[:120]}")
    return found


def test_demo_plays_every_scene_and_leaves_nothing_running(tmp_path: Path) -> None:
    directory = tmp_path / "lab"
    output, seconds = _play(directory)

    assert "\033[" not in output, "colour only on a terminal"
    scenes = _scenes(output)
    assert list(scenes) == ["The cluster", "Experiment 1: two pods, one ResourceClaimTemplate",
                            "Experiment 2: two containers, one claim", "Experiment 3: two pods, one standalone claim",
                            "Experiment 4: deleting the pods", "A broken GPU", "Recovery", "What Prometheus would see"]
    cluster, exp1, exp2, exp3, exp4, broken, recovery, metrics = scenes.values()

    # 1. nodes, the DeviceClass, slices, and devices with their models
    assert [row[0] for row in _table(cluster, "get nodes")] == ["kwok-node-0", "kwok-node-1"]
    assert _table(cluster, "get deviceclasses")[0][0] == "gpu.example.com"
    assert len(_table(cluster, "get resourceslices", 0)) == 2
    devices = _table(cluster, "go-template=")
    assert len(devices) == 8 and {tuple(row[2:]) for row in devices} == {("LATEST-GPU-MODEL", "80Gi")}

    # 2. two pods from one template: two generated claims, allocated and reserved, on two devices
    states = {row[0]: row[1] for row in _table(exp1, "get resourceclaims -n demo", whole=True)}
    assert sorted(re.sub(r"-[a-z0-9]{5}$", "", name) for name in states) == ["pod1-gpu", "pod2-gpu"]
    assert set(states.values()) == {"allocated,reserved"}
    claims = _claims(exp1)
    assert len({(node, device) for node, device, _ in claims.values()}) == 2
    assert sorted(holder for _, _, holder in claims.values()) == ["pod1", "pod2"]

    # 3. two containers of one pod share one claim and one device
    assert _table(exp2, "get pod pod3") == [["pod3", "ctr0,ctr1", "gpu,gpu"]]
    [pod3] = [value for name, value in _claims(exp2).items() if name.startswith("pod3-gpu-")]
    assert "," not in pod3[1] and pod3[2] == "pod3"

    # 4. two pods share one standalone claim; reservedFor lists both
    _, device, holders = _claims(exp3)["shared-gpu"]
    assert "," not in device and sorted(holders.split(",")) == ["pod4", "pod5"]

    # 5. deleting the pods: the standalone claim pending, the generated claims gone, the template kept
    claims_left = _table(exp4, "get resourceclaims,resourceclaimtemplates")  # the first of two tables
    assert [row[:2] for row in claims_left] == [["resourceclaim.resource.k8s.io/shared-gpu", "pending"]]
    assert re.search(r"^resourceclaimtemplate\.resource\.k8s\.io/single-gpu ", exp4, re.MULTILINE)

    # 6. a broken GPU: eviction with an Event naming device and reason, counts, a new pod that waits
    [(pool, device, holder)] = [v for name, v in _claims(broken).items() if name.startswith("trainer-gpu-")]
    assert holder == "trainer"
    [event] = _table(broken, "involvedObject.name=trainer,reason=EvictedUnhealthyDevice")
    assert f"evicted: device gpu.example.com/{pool}/{device} is unhealthy: XID 79: fell off the bus" in " ".join(event)
    [record] = _table(broken, "get unhealthydevices")
    assert record[1:4] == [pool, device, "NoExecute"] and record[-3:-1] == ["0", "1"]  # PENDING 0, EVICTED 1
    [quarantine] = _table(broken, "-n claimwarden-system")
    assert quarantine[1] == "allocated"
    [waiting] = _table(broken, "involvedObject.name=trainer-2,reason=FailedScheduling")
    assert "cannot allocate all claims" in " ".join(waiting)

    # 7. recovery: the mark cleared, the record gone, the waiting pod has the device
    assert "No resources found" in recovery
    [(node2, device2, holder2)] = [v for name, v in _claims(recovery).items() if name.startswith("trainer-2-gpu-")]
    assert (node2, device2, holder2) == (pool, device, "trainer-2")
    assert {row[0]: row[2] for row in _table(recovery, "get pods")} == {"batch": "Running", "trainer-2": "Running"}

    # 8. /metrics and the alert
    assert 'claimwarden_evictions_total{result="evicted"} 1.0' in metrics
    assert "claimwarden_eviction_latency_seconds_count 1.0" in metrics
    assert "claimwarden_eviction_pending_pods 0.0" in metrics
    assert "Alert ClaimwardenUnhealthyDeviceHasPods" in metrics and "did not fire" in metrics

    assert seconds < MAX_SECONDS, f"the demo took {seconds:.0f}s (the issue asks for < 90 s)"
    assert not directory.exists(), "--exit stops the lab the demo started and removes its directory"
    assert _leftovers(directory) == []


@pytest.mark.timeout(600)
def test_demo_with_models_falls_back_from_h100_to_a100(tmp_path: Path) -> None:
    directory = tmp_path / "lab"
    output, seconds = _play(directory, "--models", "H100,A100,L4")
    scenes = _scenes(output)
    assert list(scenes)[-2:] == ["A prioritized list: H100, else A100", "What Prometheus would see"]
    models = {(row[0], row[2]) for row in _table(scenes["The cluster"], "go-template=")}
    assert models == {("kwok-node-0", "H100"), ("kwok-node-1", "A100"), ("kwok-node-2", "L4")}
    [[claim, request, node, _]] = _table(scenes["A prioritized list: H100, else A100"], "REQUEST:")
    assert claim.startswith("inference-gpu-") and (request, node) == ("gpu/a100", "kwok-node-1")
    assert seconds < MAX_SECONDS
    assert not directory.exists() and _leftovers(directory) == []
