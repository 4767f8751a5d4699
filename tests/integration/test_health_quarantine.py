"""A marked device keeps new work away, in the default lab and where DeviceTaintRule is served.

Each lab here has 6 devices (2 nodes x 3). The scheduler forgets a device whenever any claim
holding it lets go, so the important moment is the release of the evicted pod's claim while a
pod is already waiting for a device.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client, config

from claimwarden_lab.binaries import resolve_version
from claimwarden_lab.cluster import LabState

from .conftest import extra_lab, lab_kubernetes, service_account_kubeconfig
from .health_helpers import device_of, holders, mark, unmark, wait_gone
from .helpers import pod_with_claims, taint_rule_version, template, wait_for
from .operator import Operator

TEMPLATE_CLAIM = [{"name": "gpu", "resourceClaimTemplateName": "single-gpu"}]
LABS = {
    "quarantine-claim": {},
    "quarantine-claim-and-taint-rule": {"presets": "device-taints"},
}
NO_TAINT_RULES_FROM_1_37 = {"feature_gates": "DRADeviceTaintRules=false",
                            "runtime_config": "resource.k8s.io/v1/devicetaintrules=false"}
"""DeviceTaintRule is GA and served by default from 1.37: the lab without it turns it off explicitly."""


@pytest.fixture(scope="module", params=list(LABS))
def small_lab(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LabState]:
    options = LABS[request.param]
    if not options and int(resolve_version(lab_kubernetes()).split(".")[1]) >= 37:
        options = NO_TAINT_RULES_FROM_1_37
    with extra_lab(tmp_path_factory, nodes=2, gpus_per_node=3, **options) as state:
        yield state


def _pods(core: client.CoreV1Api, namespace: str) -> dict[str, Any]:
    return {p.metadata.name: p for p in core.list_namespaced_pod(namespace).items}


def _running(core: client.CoreV1Api, namespace: str) -> set[str]:
    return {n for n, p in _pods(core, namespace).items() if p.status.phase == "Running"}


def _unscheduled(core: client.CoreV1Api, namespace: str) -> set[str]:
    return {n for n, p in _pods(core, namespace).items() if not p.spec.node_name}


def _users(api: client.ApiClient, pool: str, device: str) -> list[str]:
    """Claims holding the device other than claimwarden's quarantine claims."""
    return [h for h in holders(api, pool, device) if not h.startswith("claimwarden-system/")]


def _claim_of(core: client.CoreV1Api, namespace: str, pod: str) -> str:
    return str(core.read_namespaced_pod(pod, namespace).status.resource_claim_statuses[0].resource_claim_name)


def _keeps_claims(api: client.ApiClient) -> bool:
    """Whether claimwarden keeps a generated claim on a quarantined device (rule 4): the scheduler retries pending
    pods on a claim's deletion (1.37+) and no DeviceTaintRule is served."""
    minor = int(client.VersionApi(api).get_code().minor.rstrip("+"))
    return minor >= 37 and taint_rule_version(api) is None


def _kept(resource: client.ResourceV1Api, key: str) -> bool:
    """The claim is being deleted, still allocated, and reserved for nobody."""
    namespace, name = key.split("/", 1)
    claim = resource.read_namespaced_resource_claim(name, namespace)
    return bool(claim.metadata.deletion_timestamp and claim.status.allocation and not claim.status.reserved_for)


def _taint_rules(api: client.ApiClient) -> list[dict[str, Any]]:
    version = taint_rule_version(api)
    assert version, "DeviceTaintRule is not served"
    listing = client.CustomObjectsApi(api).list_cluster_custom_object("resource.k8s.io", version, "devicetaintrules")
    return list(listing["items"])


def test_marked_devices_are_never_given_out_until_cleared(small_lab: LabState,
                                                          tmp_path_factory: pytest.TempPathFactory) -> None:
    api = config.new_client_from_config(config_file=str(small_lab.kubeconfig))
    core, resource = client.CoreV1Api(api), client.ResourceV1Api(api)
    namespace = "fill"
    core.create_namespace(body={"metadata": {"name": namespace}})
    resource.create_namespaced_resource_claim_template(namespace, body=template("single-gpu"))
    log = tmp_path_factory.mktemp("quarantine") / "claimwarden.log"
    operator = Operator(service_account_kubeconfig(small_lab), log)
    operator.start()
    taint_rules = taint_rule_version(api) is not None
    assert taint_rules == ("device-taints" in small_lab.options.get("presets", "")), "the lab serves what it was asked"
    try:
        # A device marked before anyone uses it.
        mark(api, "kwok-node-0", "gpu-2", "marked while free")
        wait_for("gpu-2 quarantined", lambda: holders(api, "kwok-node-0", "gpu-2"))

        # Fill the lab: five pods take the five other devices, a sixth waits.
        for i in range(6):
            core.create_namespaced_pod(namespace, body=pod_with_claims(f"pod-{i}", TEMPLATE_CLAIM))
        wait_for("five pods running", lambda: len(_running(core, namespace)) == 5, 60)
        [waiting] = _unscheduled(core, namespace)
        assert _users(api, "kwok-node-0", "gpu-2") == []

        # Mark a used device: its pod is evicted and its claim released while a pod is waiting.
        victim = sorted(_running(core, namespace))[0]
        pool, device = device_of(api, namespace, victim)
        victim_claim = f"{namespace}/{_claim_of(core, namespace, victim)}"
        mark(api, pool, device, "ECC errors")
        wait_gone(api, namespace, victim)
        if _keeps_claims(api):
            # Rule 4 (health/__init__.py): from 1.37 the scheduler retries pending pods on a claim's deletion too,
            # and without DeviceTaintRule the victim's claim keeps the device, reserved for nobody, until cleared.
            wait_for("the victim's claim kept, reserved for nobody", lambda: _kept(resource, victim_claim), 60)
            kept = [victim_claim]
        else:
            wait_for("the victim's claim released", lambda: _users(api, pool, device) == [], 60)
            kept = []
        time.sleep(8)
        assert _unscheduled(core, namespace) == {waiting}, "the waiting pod must not get a marked device"
        assert _users(api, pool, device) == kept and _users(api, "kwok-node-0", "gpu-2") == []
        if taint_rules:
            effects = {(r["spec"]["deviceSelector"]["device"], r["spec"]["taint"]["effect"]) for r in _taint_rules(api)}
            assert effects == {("gpu-2", "NoSchedule"), (device, "NoSchedule")}

        # Clearing a mark lets the waiting pod take that device.
        unmark(api, pool, device)
        wait_for(f"{waiting} scheduled on the cleared device", lambda: waiting not in _unscheduled(core, namespace), 60)
        assert device_of(api, namespace, waiting) == (pool, device)
        unmark(api, "kwok-node-0", "gpu-2")
        wait_for("gpu-2 free again", lambda: holders(api, "kwok-node-0", "gpu-2") == [], 30)
        if taint_rules:
            wait_for("the taint rules removed", lambda: _taint_rules(api) == [], 30)
        core.create_namespaced_pod(namespace, body=pod_with_claims("last", TEMPLATE_CLAIM))
        wait_for("last running", lambda: "last" in _running(core, namespace), 60)
        assert device_of(api, namespace, "last") == ("kwok-node-0", "gpu-2")
        held: dict[tuple[str, str], list[str]] = {}
        for claim in resource.list_resource_claim_for_all_namespaces().items:
            for result in claim.status.allocation.devices.results if claim.status.allocation else []:
                held.setdefault((result.pool, result.device), []).append(claim.metadata.name)
        assert all(len(names) == 1 for names in held.values()), held
        assert len(held) == 6
    finally:
        assert operator.stop() == 0
        api.close()


def test_a_taint_rule_without_a_selector_is_counted_for_the_alert(small_lab: LabState,
                                                                  tmp_path_factory: pytest.TempPathFactory) -> None:
    """kubernetes/kubernetes#141620, #141422: no deviceSelector taints every device. The gauge behind
    ClaimwardenDeviceTaintRuleSelectsEverything counts such rules where the API is served, else is absent."""
    api = config.new_client_from_config(config_file=str(small_lab.kubeconfig))
    operator = Operator(service_account_kubeconfig(small_lab), tmp_path_factory.mktemp("rules") / "claimwarden.log")
    operator.start()
    gauge = "\nclaimwarden_device_taint_rules_unselective "
    try:
        version = taint_rule_version(api)
        if version is None:
            time.sleep(2)
            assert gauge not in operator.metrics(), "no DeviceTaintRule API, no series"
            return
        wait_for("the gauge at 0", lambda: f"{gauge}0.0" in operator.metrics(), 40)
        rules = client.CustomObjectsApi(api)
        for name, spec in (("no-selector", {}), ("empty-selector", {"deviceSelector": {}}),
                           ("one-driver", {"deviceSelector": {"driver": "gpu.example.com"}})):
            rules.create_cluster_custom_object("resource.k8s.io", version, "devicetaintrules", {
                "apiVersion": f"resource.k8s.io/{version}", "kind": "DeviceTaintRule", "metadata": {"name": name},
                "spec": {**spec, "taint": {"key": "example.com/broken", "effect": "NoSchedule"}}})
        try:
            wait_for("the gauge at 2", lambda: f"{gauge}2.0" in operator.metrics(), 40)
        finally:
            for name in ("no-selector", "empty-selector", "one-driver"):
                rules.delete_cluster_custom_object("resource.k8s.io", version, "devicetaintrules", name)
        wait_for("the gauge back at 0", lambda: f"{gauge}0.0" in operator.metrics(), 40)
    finally:
        assert operator.stop() in (None, 0)
