"""`kubectl claimwarden drain` on the shared lab's kwok-node-0 (8 devices): 32 pods, of which 26 use claims (six
standalone claims shared by four pods each, two claims from a template), PodDisruptionBudgets over some, grace
periods on some, five pods without claims, one pod standing for the DRA driver, and a DaemonSet's pod.

kwok plays the kubelet with its fast pod-delete stage: a pod with a deletionTimestamp is deleted at once,
whatever its grace period (kwok's kustomize/stage/pod/fast/pod-delete.yaml), so no pod can hang in Terminating
here; the test still checks that none does. claimwarden (the `claimwarden` fixture) releases the claims: the
shared lab runs kube-controller-manager without its resourceclaim controller.

The pods declare no controller (a ReplicaSet would re-create them), so the drain runs with --force.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from claimwarden_lab.audit_policy import CLAIMWARDEN_USER
from claimwarden_lab.cluster import LabState

from .auditor import WRITE_VERBS, LabAudit
from .helpers import create_pods, gpu_claim_spec, pod_with_claims, template, wait_for
from .operator import Operator

PLUGIN = Path(sys.executable).parent / "kubectl-claimwarden"
NODE = "kwok-node-0"
SHARED, SHARING, SOLO, OTHERS = 6, 4, 2, 5
LONGEST_GRACE = 20
BUDGETS = {"shared-0": SHARING - 1, "solo": SOLO - 1}


def drain(lab: LabState, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(PLUGIN), "drain", NODE, f"--kubeconfig={lab.kubeconfig}", *args],
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def uncordon(api: client.ApiClient) -> Iterator[None]:
    """The shared lab's node is cordoned by the drain: schedulable again afterwards, for the tests that follow."""
    yield
    client.CoreV1Api(api).patch_node(NODE, {"spec": {"unschedulable": None}})


def _pod(name: str, uses: list[dict[str, str]], *, app: str, grace: int = 0) -> dict[str, Any]:
    body = pod_with_claims(name, uses) if uses else {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
        "spec": {"containers": [{"name": "c", "image": "registry.example/busybox:1"}]}}
    body["metadata"]["labels"] = {"app": app}
    body["spec"]["nodeSelector"] = {"kubernetes.io/hostname": NODE}
    body["spec"]["terminationGracePeriodSeconds"] = grace
    return body


def _fill_node(api: client.ApiClient, namespace: str) -> tuple[set[str], set[str]]:
    """The 32 pods, the budgets and the DaemonSet; returns (DRA consumers, the other pods), running."""
    core, resource, policy = client.CoreV1Api(api), client.ResourceV1Api(api), client.PolicyV1Api(api)
    resource.create_namespaced_resource_claim_template(namespace, body=template("single-gpu"))
    bodies = []
    for i in range(SHARED):
        resource.create_namespaced_resource_claim(namespace, body={"metadata": {"name": f"shared-{i}"},
                                                                   "spec": gpu_claim_spec()})
        bodies += [_pod(f"shared-{i}-{j}", [{"name": "gpu", "resourceClaimName": f"shared-{i}"}], app=f"shared-{i}",
                        grace=LONGEST_GRACE if i == 1 else 0) for j in range(SHARING)]
    bodies += [_pod(f"solo-{i}", [{"name": "gpu", "resourceClaimTemplateName": "single-gpu"}], app="solo", grace=5)
               for i in range(SOLO)]
    bodies += [_pod(f"web-{i}", [], app="web") for i in range(OTHERS)]
    bodies.append(_pod("dra-driver", [], app="dra-driver", grace=10))
    # Integer minAvailable: the pods have no controller, so a budget can only count them (maxUnavailable needs a
    # controller's scale). Each lets one pod go, then refuses until the test relents.
    for name, keep in BUDGETS.items():
        policy.create_namespaced_pod_disruption_budget(namespace, body={
            "metadata": {"name": name}, "spec": {"minAvailable": keep, "selector": {"matchLabels": {"app": name}}}})
    client.AppsV1Api(api).create_namespaced_daemon_set(namespace, body={
        "metadata": {"name": "node-agent"},
        "spec": {"selector": {"matchLabels": {"app": "node-agent"}}, "template": {
            "metadata": {"labels": {"app": "node-agent"}},
            "spec": {"nodeSelector": {"kubernetes.io/hostname": NODE}, "terminationGracePeriodSeconds": 0,
                     "containers": [{"name": "c", "image": "registry.example/busybox:1"}]}}}})
    create_pods(api, namespace, bodies)
    names = {b["metadata"]["name"] for b in bodies}
    wait_for("32 pods and the DaemonSet's running on the node", lambda: len([
        p for p in core.list_namespaced_pod(namespace).items
        if p.status.phase == "Running" and p.spec.node_name == NODE]) == len(names) + 1, 90)
    for name, keep in BUDGETS.items():
        wait_for(f"budget {name} observed", lambda name=name, keep=keep: (
            policy.read_namespaced_pod_disruption_budget(name, namespace).status.disruptions_allowed or 0) == 1)
    consumers = {n for n in names if n.startswith(("shared-", "solo-"))}
    assert len(names) == 32 and len(consumers) == SHARED * SHARING + SOLO
    return consumers, names - consumers


def _state(api: client.ApiClient, namespace: str) -> dict[str, str]:
    """resourceVersion of the node and of every pod and claim of the namespace."""
    core, resource = client.CoreV1Api(api), client.ResourceV1Api(api)
    versions = {"node": core.read_node(NODE).metadata.resource_version}
    versions |= {f"pod/{p.metadata.name}": p.metadata.resource_version
                 for p in core.list_namespaced_pod(namespace).items}
    versions |= {f"claim/{c.metadata.name}": c.metadata.resource_version
                 for c in resource.list_namespaced_resource_claim(namespace).items}
    return versions


def _listed(out: str, header: str) -> set[str]:
    """The objects ("namespace/name") listed under the dry run's line starting with `header`."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header))
    names = set()
    for line in lines[start + 1:]:
        if not line.startswith("  "):
            break
        names.add(line.split()[1].rstrip(":"))
    return names


def _foreign_pods(api: client.ApiClient, namespace: str) -> list[str]:
    """Pods of other namespaces on the node that a drain would evict: an earlier test's, its namespace still
    being deleted (the drain takes every pod of the node, so these would change its plan and its timing)."""
    pods = client.CoreV1Api(api).list_pod_for_all_namespaces(field_selector=f"spec.nodeName={NODE}").items
    return [f"{p.metadata.namespace}/{p.metadata.name}" for p in pods if p.metadata.namespace != namespace
            and not any(r.controller and r.kind == "DaemonSet" for r in p.metadata.owner_references or [])
            and "kubernetes.io/config.mirror" not in (p.metadata.annotations or {})]


def _no_foreign_pods(api: client.ApiClient, namespace: str) -> None:
    try:
        wait_for(f"no pod of an earlier test on {NODE}", lambda: not _foreign_pods(api, namespace), 60)
    except AssertionError:
        raise AssertionError(f"pods of earlier tests stay on {NODE}: {_foreign_pods(api, namespace)}") from None


def _evictions(events: list[dict[str, Any]], namespace: str) -> list[tuple[str, str]]:
    """(time, pod) of each successful eviction in the namespace, in the apiserver's order."""
    return sorted((e["stageTimestamp"], e["objectRef"]["name"]) for e in events
                  if e.get("stage") == "ResponseComplete"
                  and (e.get("objectRef") or {}).get("subresource") == "eviction"
                  and e["objectRef"].get("namespace") == namespace
                  and (e.get("responseStatus") or {}).get("code") == 201)


def test_drain_evicts_dra_consumers_first_waits_for_their_claims_then_the_rest(
        api: client.ApiClient, lab: LabState, namespace: str, claimwarden: Operator, uncordon: None,
        tmp_path: Path) -> None:
    core, resource = client.CoreV1Api(api), client.ResourceV1Api(api)
    consumers, others = _fill_node(api, namespace)
    _no_foreign_pods(api, namespace)
    audit = LabAudit(lab)

    # Without --force the pods without a controller are refused, and nothing is written.
    before = _state(api, namespace)
    refused = drain(lab)
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert "cannot drain kwok-node-0: nothing written" in refused.stdout
    assert "declares no controller" in refused.stdout
    # The dry run lists exactly what would happen, and writes nothing either.
    dry = drain(lab, "--force", "--dry-run")
    assert dry.returncode == 0, dry.stdout + dry.stderr
    assert "step 1: would cordon node kwok-node-0" in dry.stdout
    assert _listed(dry.stdout, "step 2:") == {f"{namespace}/{name}" for name in consumers}
    assert _listed(dry.stdout, "step 4:") == {f"{namespace}/{name}" for name in others}
    claims = {f"{namespace}/{c.metadata.name}" for c in resource.list_namespaced_resource_claim(namespace).items}
    assert _listed(dry.stdout, "step 3:") == claims and len(claims) == SHARED + SOLO
    assert f"left alone: pod {namespace}/node-agent-" in dry.stdout and "DaemonSet-managed" in dry.stdout
    assert _state(api, namespace) == before
    print(f"$ kubectl claimwarden drain {NODE} --force --dry-run\n{dry.stdout}")
    assert not _evictions(audit.new_events(), namespace)

    started = time.monotonic()
    output = tmp_path / "drain.out"
    with output.open("w") as sink:
        process = subprocess.Popen([str(PLUGIN), "drain", NODE, f"--kubeconfig={lab.kubeconfig}", "--force",
                                    "--timeout", "120s"], stdout=sink, stderr=subprocess.STDOUT, text=True)
    try:
        # Both budgets refuse the second eviction of their pods; the drain retries and says which budget refused.
        wait_for("both budgets named as refusing", lambda: all(
            f"refused by PodDisruptionBudget {namespace}/{name}:" in output.read_text() for name in BUDGETS), 30)
        assert "step 4" not in output.read_text()
        for name in BUDGETS:
            client.PolicyV1Api(api).patch_namespaced_pod_disruption_budget(name, namespace,
                                                                           {"spec": {"minAvailable": 0}})
        code = process.wait(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
    took = time.monotonic() - started
    result = subprocess.CompletedProcess(process.args, code, output.read_text(), "")
    assert result.returncode == 0, result.stdout
    assert took <= LONGEST_GRACE + 30, f"drained in {took:.1f}s, more than the longest grace period + 30 s"
    print(f"drained {NODE} in {took:.1f}s\n{result.stdout}")

    # The apiserver's order: every DRA consumer's eviction before the first of any other pod.
    events = audit.new_events()
    evictions = _evictions(events, namespace)
    evicted = [pod for _, pod in evictions]
    assert sorted(evicted) == sorted(consumers | others), "each pod evicted exactly once"
    last_consumer = max(i for i, pod in enumerate(evicted) if pod in consumers)
    first_other = min(i for i, pod in enumerate(evicted) if pod in others)
    assert last_consumer < first_other, evicted
    # ...and claimwarden's last write releasing a claim (reservation, deallocation, finalizer) before it too.
    releases = sorted(e["stageTimestamp"] for e in events if e.get("stage") == "ResponseComplete"
                      and (e.get("user") or {}).get("username") == CLAIMWARDEN_USER
                      and e.get("verb") in WRITE_VERBS
                      and (e.get("objectRef") or {}).get("resource") == "resourceclaims"
                      and e["objectRef"].get("namespace") == namespace)
    assert releases and releases[-1] < evictions[first_other][0], (releases[-1:], evictions[first_other])
    # The claims are released: no reservation, standalone claims deallocated, generated claims gone.
    claims = resource.list_namespaced_resource_claim(namespace).items
    assert sorted(c.metadata.name for c in claims) == [f"shared-{i}" for i in range(SHARED)]
    assert all(not c.status or (c.status.allocation is None and not c.status.reserved_for) for c in claims)
    # Nothing Terminating; only the DaemonSet's pod is left, and the output says why.
    left = core.list_namespaced_pod(namespace).items
    assert [p.metadata.name.startswith("node-agent-") for p in left] == [True]
    assert not any(p.metadata.deletion_timestamp for p in left)
    assert "DaemonSet-managed" in result.stdout and core.read_node(NODE).spec.unschedulable

    again = drain(lab, "--force", "--timeout", "10s")
    assert again.returncode == 0 and "cordoned" not in again.stdout and "evicted pod" not in again.stdout


def test_what_holds_the_drain_is_named_at_the_timeout_and_a_rerun_continues(
        api: client.ApiClient, lab: LabState, namespace: str, claimwarden: Operator, uncordon: None) -> None:
    """A budget that never allows (step 2), then claims nobody releases while claimwarden is stopped (step 3):
    each named at --timeout with exit 1; --force-after deletes past the budget; each run (a new process, with
    nothing remembered) continues where the last one stopped."""
    core, resource = client.CoreV1Api(api), client.ResourceV1Api(api)
    resource.create_namespaced_resource_claim_template(namespace, body=template("single-gpu"))
    uses = [{"name": "gpu", "resourceClaimTemplateName": "single-gpu"}]
    for name in ("guarded", "holder"):
        core.create_namespaced_pod(namespace, _pod(name, uses, app=name))
    core.create_namespaced_pod(namespace, _pod("web", [], app="web"))
    _no_foreign_pods(api, namespace)
    policy = client.PolicyV1Api(api)
    policy.create_namespaced_pod_disruption_budget(namespace, body={
        "metadata": {"name": "never"}, "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "guarded"}}}})
    wait_for("the budget observed", lambda: (policy.read_namespaced_pod_disruption_budget(
        "never", namespace).status.current_healthy or 0) == 1, 60)
    claims = wait_for("both claims reserved", lambda: sorted(
        c.metadata.name for c in resource.list_namespaced_resource_claim(namespace).items
        if c.status and c.status.reserved_for) if len(resource.list_namespaced_resource_claim(
            namespace).items) == 2 else None)

    with claimwarden.stopped():  # nothing releases the claims (the shared lab's KCM runs without its claim controller)
        blocked = drain(lab, "--force", "--timeout", "5s")
        assert blocked.returncode == 1, blocked.stdout + blocked.stderr
        assert re.search(r"timed out after \d+s at step 2 \(evict DRA consumers\); stuck:", blocked.stdout), \
            blocked.stdout
        assert f"  pod/{namespace}/guarded: eviction refused by PodDisruptionBudget {namespace}/never: " \
            in blocked.stdout
        assert f"evicted pod {namespace}/holder" in blocked.stdout
        assert "and 1 other pod(s) waiting for step 4" in blocked.stdout
        assert core.read_namespaced_pod("web", namespace).metadata.deletion_timestamp is None

        forced = drain(lab, "--force", "--timeout", "8s", "--force-after", "2s")
        assert forced.returncode == 1, forced.stdout + forced.stderr
        print(f"{blocked.stdout}\n{forced.stdout}")
        assert "cordoned" not in forced.stdout  # the second run continues where the first stopped
        assert f"--force-after: pod {namespace}/guarded deleted past its PodDisruptionBudget" in forced.stdout
        assert "at step 3 (wait until their claims are released); stuck:" in forced.stdout
        for claim, pod in zip(claims, ("guarded", "holder"), strict=True):
            assert (f"  resourceclaim/{namespace}/{claim}: reserved for pod(s) {namespace}/{pod} (gone, its "
                    "reservation not removed yet)") in forced.stdout, forced.stdout
        assert core.read_namespaced_pod("web", namespace).metadata.deletion_timestamp is None

    done = drain(lab, "--force", "--timeout", "60s")  # claimwarden runs again and releases them
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"evicted pod {namespace}/web" in done.stdout and "guarded" not in done.stdout
    assert not core.list_namespaced_pod(namespace).items
    assert not resource.list_namespaced_resource_claim(namespace).items
