"""The Helm chart with a real helm (v3.22.0, `make helm`) on a lab with one real node.

The lab (`lab up --real-node`, as test_real_node.py) starts with nothing of claimwarden's: the chart installs all
of it, CRDs included (Helm refuses to take over objects that kubectl created). The image from test_image.py is
imported into the node's containerd. Into claimwarden-system (where the lab's audit policy records claimwarden's
writes, which extra_lab's auditor then checks; tests/chart renders the chart into other namespaces), with two
replicas pinned to the real node:
- `helm install --wait`: a leader; a pod with a claim on the kwok node is evicted when its device is marked;
- `helm upgrade --wait` with one changed value (run.evictionQps): the rollout starts each new pod before it stops
  an old one, and the Lease moves to a new pod with no gap longer than HANDOVER_MAX_GAP (the old leader releases
  it on SIGTERM, the standby takes it on its next try); the new pods carry the flag, and the new leader evicts;
- `helm uninstall --wait` with a device still marked: the CRDs stay (helm.sh/resource-policy: keep), every other
  object of the chart is gone; what claimwarden wrote itself stays: its Lease, the mark's record and the
  quarantine claim that parks the device.
"""

from __future__ import annotations

import datetime
import glob
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from claimwarden_lab import realnode
from claimwarden_lab.binaries import helm_binary
from claimwarden_lab.cluster import LabState

from .conftest import extra_lab
from .health_helpers import evicts_from_a_marked_device, holders, mark, record_for, slice_of
from .helpers import wait_for
from .test_image import ROOT, VERSION

NAMESPACE = "claimwarden-system"
HANDOVER_MAX_GAP = 10.0
"""Seconds without a leader that a rolling hand-over may cost: the standby's retry period (2 s) plus the lab's
slack on a loaded machine (0.7-2.2 s measured idle, 5.9 s once under load); a leader that crashed instead of
releasing the Lease would cost the lease duration (15 s), so this still tells the two apart."""


@pytest.fixture(scope="module")
def real_lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LabState]:
    with extra_lab(tmp_path_factory, install=False, nodes=1, gpus_per_node=4, real_node=True) as state:
        yield state


def _helm(lab: LabState, *args: str, timeout: float = 300) -> str:
    result = subprocess.run([str(helm_binary()), f"--kubeconfig={lab.kubeconfig}", "--namespace", NAMESPACE, *args],
                            capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, f"helm {' '.join(args)}:\n{result.stdout}{result.stderr}"
    return result.stdout


PINNED = ("replicaCount=2", f"nodeSelector.kubernetes\\.io/hostname={realnode.NODE_NAME}")


def _sets(*values: str) -> list[str]:
    return [item for value in (*PINNED, *values) for item in ("--set", value)]


def _pods(core: client.CoreV1Api) -> list[client.V1Pod]:
    return list(core.list_namespaced_pod(NAMESPACE, label_selector="app.kubernetes.io/name=claimwarden").items)


def _lease(coordination: client.CoordinationV1Api) -> client.V1LeaseSpec | None:
    """The Lease's spec, None until the first replica has created it."""
    try:
        return coordination.read_namespaced_lease("claimwarden", NAMESPACE).spec
    except ApiException as error:
        if error.status == 404:
            return None
        raise


def _handover_gaps(samples: list[client.V1LeaseSpec | None]) -> list[tuple[str, str, float]]:
    """(from, to, seconds without a leader) for every change of holder seen: from the old holder's last renewal
    to the new holder's acquisition."""
    gaps = []
    last: client.V1LeaseSpec | None = None
    for spec in samples:
        if spec is None or not spec.holder_identity:
            continue
        if last is not None and spec.holder_identity != last.holder_identity:
            gaps.append((last.holder_identity, spec.holder_identity,
                         (spec.acquire_time - last.renew_time).total_seconds()))
        last = spec
    return gaps


def _upgrade_watching_the_lease(lab: LabState, coordination: client.CoordinationV1Api,
                                *sets: str) -> list[client.V1LeaseSpec | None]:
    command = [str(helm_binary()), f"--kubeconfig={lab.kubeconfig}", "--namespace", NAMESPACE, "upgrade",
               "claimwarden", str(ROOT / "charts" / "claimwarden"), "--wait", "--timeout=4m", *_sets(*sets)]
    samples: list[client.V1LeaseSpec | None] = []
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as upgrade:
        while upgrade.poll() is None:
            samples.append(_lease(coordination))
            time.sleep(0.1)
        out, err = upgrade.communicate()
    assert upgrade.returncode == 0, f"helm upgrade:\n{out}{err}"
    return samples


def test_helm_installs_upgrades_with_a_rolling_handover_and_uninstalls(
        real_lab: LabState, image: str, tmp_path: Path) -> None:
    started = time.monotonic()
    realnode.import_image(real_lab.dir, ROOT / "dist" / f"claimwarden-{VERSION}.oci.tar", f"claimwarden:{VERSION}")
    api = config.new_client_from_config(config_file=str(real_lab.kubeconfig))
    core, coordination = client.CoreV1Api(api), client.CoordinationV1Api(api)
    core.create_namespace(body={"metadata": {"name": NAMESPACE, "labels": {
        "pod-security.kubernetes.io/enforce": "restricted"}}})

    _helm(real_lab, "install", "claimwarden", str(ROOT / "charts" / "claimwarden"), "--wait", "--timeout=4m",
          *_sets())
    installed = {p.metadata.name for p in _pods(core)}
    assert len(installed) == 2
    # --wait waited for both to be ready: /readyz, leader and standby alike (readiness.py).
    assert all(p.spec.containers[0].readiness_probe.http_get.path == "/readyz" and p.status.container_statuses[0].ready
               for p in _pods(core))
    lease = wait_for("a leader", lambda: (spec := _lease(coordination)) and spec.holder_identity and spec, 60)
    assert lease.holder_identity in installed
    print(f"helm install --wait, then a leader: {time.monotonic() - started:.1f} s")
    evicts_from_a_marked_device(api, "helm-health", "ECC errors, claimwarden installed by helm")

    upgrading = time.monotonic()
    samples = _upgrade_watching_the_lease(real_lab, coordination, "run.evictionQps=5")
    print(f"helm upgrade --wait: {time.monotonic() - upgrading:.1f} s")
    # Helm's --wait counts the new pods that are ready, not available: with minReadySeconds it returns while the
    # Deployment still waits those seconds before it stops the last old pod.
    wait_for("the old pods gone", lambda: not {p.metadata.name for p in _pods(core)} & installed, 60)
    upgraded = {p.metadata.name: p for p in _pods(core) if p.metadata.deletion_timestamp is None}
    assert len(upgraded) == 2 and not set(upgraded) & installed
    for pod in upgraded.values():
        assert "--eviction-qps=5" in pod.spec.containers[0].args, pod.spec.containers[0].args
    wait_for("a new leader", lambda: (spec := _lease(coordination)) and spec.holder_identity in upgraded, 60)
    gaps = _handover_gaps([*samples, _lease(coordination)])
    assert gaps and gaps[-1][1] in upgraded, gaps
    assert all(gap < HANDOVER_MAX_GAP for _, _, gap in gaps), gaps
    print(f"hand-overs during the upgrade (from, to, seconds without a leader): {gaps}")
    evicts_from_a_marked_device(api, "helm-health-upgraded", "ECC errors, after the upgrade")
    for pod in upgraded.values():
        log = "".join(Path(f).read_text(errors="replace") for f in glob.glob(
            f"/var/log/pods/{NAMESPACE}_{pod.metadata.name}_{pod.metadata.uid}/claimwarden/*.log"))
        assert "Traceback" not in log, log[-3000:]

    # A mark left in place through the uninstall: its record and the quarantine claim that parks the device.
    kept = client.ResourceV1Api(api).read_resource_slice(slice_of(api, "kwok-node-0"))
    pool, device = kept.spec.pool.name, kept.spec.devices[0].name
    mark(api, "kwok-node-0", device, "ECC errors, kept through helm uninstall")
    quarantine = wait_for("the kept mark's quarantine claim", lambda: [
        h for h in holders(api, pool, device) if h.startswith(f"{NAMESPACE}/")], 60)
    record = record_for(api, pool, device)
    assert record is not None

    uninstalled = _helm(real_lab, "uninstall", "claimwarden", "--wait", "--timeout=2m")
    assert "kept due to the resource policy" in uninstalled, uninstalled
    wait_for("the pods gone", lambda: not _pods(core), 60)
    extensions = client.ApiextensionsV1Api(api)
    assert sorted(c.metadata.name for c in extensions.list_custom_resource_definition().items
                  if c.spec.group == "claimwarden.io") == ["healthpolicies.claimwarden.io",
                                                          "unhealthydevices.claimwarden.io"]
    helm_label = "app.kubernetes.io/managed-by=Helm"
    rbac, apps = client.RbacAuthorizationV1Api(api), client.AppsV1Api(api)
    admission = client.AdmissionregistrationV1Api(api)
    assert not apps.list_namespaced_deployment(NAMESPACE).items
    assert not rbac.list_cluster_role(label_selector=helm_label).items
    assert not rbac.list_cluster_role_binding(label_selector=helm_label).items
    assert not rbac.list_namespaced_role(NAMESPACE).items and not rbac.list_namespaced_role_binding(NAMESPACE).items
    assert not admission.list_validating_admission_policy(label_selector=helm_label).items
    assert not admission.list_validating_admission_policy_binding(label_selector=helm_label).items
    assert [s.metadata.name for s in core.list_namespaced_service_account(NAMESPACE).items] == ["default"]
    assert not core.list_namespaced_service(NAMESPACE).items
    assert not core.list_namespaced_secret(NAMESPACE).items, "helm's release records are gone"
    assert not client.PolicyV1Api(api).list_namespaced_pod_disruption_budget(NAMESPACE).items
    # The record and its quarantine claim, which Helm never owned, stay: the broken device stays parked.
    kept_record = record_for(api, pool, device)
    assert kept_record is not None and kept_record["metadata"]["uid"] == record["metadata"]["uid"]
    assert [f"{NAMESPACE}/{c.metadata.name}" for c in client.ResourceV1Api(api).list_namespaced_resource_claim(
        NAMESPACE).items] == quarantine == [h for h in holders(api, pool, device) if h.startswith(f"{NAMESPACE}/")]
    assert not client.NetworkingV1Api(api).list_namespaced_network_policy(NAMESPACE).items
    assert not client.SchedulingV1Api(api).list_priority_class(label_selector=helm_label).items
    # What claimwarden wrote itself and Helm never owned: its Lease.
    assert [lease.metadata.name for lease in coordination.list_namespaced_lease(NAMESPACE).items] == ["claimwarden"]
    elapsed = datetime.timedelta(seconds=round(time.monotonic() - started))
    print(f"install, evict, upgrade, uninstall: {elapsed}")
    api.close()
