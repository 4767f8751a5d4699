"""A marked device evicts the pods that hold it through their PodGroup's reservation (KEP-5729).

A claim generated for a PodGroup is reserved for the group, as one `reservedFor` entry, and names
none of the pods that use it: the health controller finds them by their
`spec.schedulingGroup.podGroupName`. Like test_podgroups.py, this module starts its own 1.37 lab with
the podgroups preset, whatever $CLAIMWARDEN_KUBERNETES the rest of the suite runs, and fails (never
skips) when those binaries or gates are missing.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client, watch

from claimwarden_lab.cluster import LabState

from .auditor import LabAudit
from .conftest import extra_lab, service_account_kubeconfig
from .health_helpers import create_record, delete_record, events, holders, mark, record_for, unmark, wait_gone
from .helpers import create_pods, taint_rule_version, template, wait_for
from .operator import Operator
from .test_podgroups import (
    GROUP,
    KUBERNETES,
    PLURAL,
    VERSION,
    _api,
    _claims,
    _create_podgroup,
    _member,
    _pods,
    _serves_podgroups,
)

pytestmark = pytest.mark.podgroups

MEMBERS = 5
USES = [{"name": "gpu", "resourceClaimTemplateName": "gpu"}]


@pytest.fixture(scope="module")
def health_lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LabState]:
    # Two devices: the group's claim takes one, the other group's claim the other.
    with extra_lab(tmp_path_factory, kubernetes=KUBERNETES, presets="podgroups", nodes=1, gpus_per_node=2) as state:
        yield state


def _evictions(audit: LabAudit) -> Counter[tuple[str, str]]:
    """Successful evictions per (namespace, pod) in the audit log since the last call, by anyone."""
    counted: Counter[tuple[str, str]] = Counter()
    for event in audit.new_events():
        ref = event.get("objectRef") or {}
        if (event.get("stage") == "ResponseComplete" and event.get("verb") == "create"
                and ref.get("resource") == "pods" and ref.get("subresource") == "eviction"
                and (event.get("responseStatus") or {}).get("code") == 201):
            counted[(ref.get("namespace") or "", ref.get("name") or "")] += 1
    return counted


def _group_claim(api: client.ApiClient, namespace: str, group: str) -> dict[str, object]:
    """The one claim the PodGroup owns, once it is allocated and reserved for the group."""
    def found() -> dict[str, object] | None:
        owned = [c for c in _claims(api, namespace)
                 if [r["name"] for r in c["metadata"].get("ownerReferences") or []] == [group]]
        if len(owned) == 1 and (owned[0].get("status") or {}).get("allocation") and [
                (r["resource"], r["name"]) for r in owned[0]["status"].get("reservedFor") or []] == [(PLURAL, group)]:
            return owned[0]
        return None
    return wait_for(f"the claim of PodGroup {group} allocated and reserved for it", found, 60)


def _taint_rules(api: client.ApiClient) -> list[tuple[str, str]]:
    """(device, effect) of each DeviceTaintRule (1.37 serves them: their absence is a failure)."""
    version = taint_rule_version(api)
    assert version, "DeviceTaintRule is not served"
    listing = client.CustomObjectsApi(api).list_cluster_custom_object("resource.k8s.io", version, "devicetaintrules")
    return [(r["spec"]["deviceSelector"]["device"], r["spec"]["taint"]["effect"]) for r in listing["items"]]


def _device(claim: dict[str, object]) -> tuple[str, str]:
    [result] = claim["status"]["allocation"]["devices"]["results"]  # type: ignore[index]
    return result["pool"], result["device"]


def _tear_down(api: client.ApiClient, namespace: str, operator: Operator) -> None:
    """Delete the namespace with claimwarden still running (it removes the claims' delete-protection
    finalizers), then stop it."""
    core = client.CoreV1Api(api)
    core.delete_namespace(namespace)
    wait_for("the namespace gone", lambda: namespace not in {
        n.metadata.name for n in core.list_namespace().items}, 300, interval=2)
    operator.stop()
    api.close()


def test_marking_the_device_of_a_podgroup_claim_evicts_each_member_once_and_spares_another_group(
        health_lab: LabState, tmp_path_factory: pytest.TempPathFactory) -> None:
    api = _api(health_lab)
    _serves_podgroups(api)
    core = client.CoreV1Api(api)
    namespace = "train"
    core.create_namespace(body={"metadata": {"name": namespace}})
    client.ResourceV1Api(api).create_namespaced_resource_claim_template(namespace, body=template("gpu"))
    operator = Operator(service_account_kubeconfig(health_lab), tmp_path_factory.mktemp("pgh") / "claimwarden.log")
    operator.start()
    audit = LabAudit(health_lab)
    try:
        _create_podgroup(api, namespace, "team", USES)
        _create_podgroup(api, namespace, "bystanders", USES)
        members = [f"team-{i}" for i in range(MEMBERS)]
        create_pods(api, namespace, [_member(name, "team", USES) for name in members]
                    + [_member("bystander", "bystanders", USES)])
        wait_for("all pods running", lambda: sum(1 for p in _pods(api, namespace)
                                                 if (p.get("status") or {}).get("phase") == "Running")
                 == MEMBERS + 1, 120)
        team_claim = _group_claim(api, namespace, "team")
        other_claim = _group_claim(api, namespace, "bystanders")
        pool, device = _device(team_claim)
        assert _device(other_claim) != (pool, device), "both groups' claims on one device"
        # Nobody's pod entry: only the group's entry stands for the five pods.
        assert len(team_claim["status"]["reservedFor"]) == 1  # type: ignore[index]

        mark(api, pool, device, "ECC errors")
        for name in members:
            wait_gone(api, namespace, name, 90)
        record = wait_for("the record counts five evictions", lambda: (
            r if (r := record_for(api, pool, device)) and (r.get("status") or {}).get("podsEvicted") == MEMBERS
            and r["status"].get("podsPending") == 0 else None), 60)
        assert record["status"]["podsWouldEvict"] == 0, record["status"]
        assert [c["reason"] for c in record["status"]["conditions"] if c["type"] == "Evicting"] == ["Completed"]
        for name in members:
            [event] = wait_for(f"the eviction's Event on {name}",
                               lambda name=name: events(api, namespace, name, "EvictedUnhealthyDevice"))
            assert f"gpu.example.com/{pool}/{device}" in event.message and "ECC errors" in event.message

        time.sleep(3)  # a second eviction, if one were coming, would be in the audit log by now
        evicted = _evictions(audit)
        assert evicted == Counter({(namespace, name): 1 for name in members}), evicted
        assert f'claimwarden_evictions_total{{result="evicted"}} {float(MEMBERS)}' in operator.metrics()
        # The other group's pod, on the other device, runs on; the group's claim stays reserved for it.
        bystander = core.read_namespaced_pod("bystander", namespace)
        assert bystander.status.phase == "Running" and bystander.metadata.deletion_timestamp is None
        assert events(api, namespace, "bystander", "EvictedUnhealthyDevice") == []
        # The team's claim stays allocated and reserved for its PodGroup (the PodGroup still exists): new pods
        # of the group would get the same claim on the same device. While it holds the device, no other claim
        # can be given it, so no quarantine claim is made beside it; the record says so.
        team = f"{namespace}/{team_claim['metadata']['name']}"  # type: ignore[index]
        wait_for("the record saying the team's claim holds the device", lambda: any(
            c["type"] == "Quarantined" and c["reason"] == "HeldByClaims" and team in c["message"]
            for c in ((record_for(api, pool, device) or {}).get("status") or {}).get("conditions") or []), 30)
        assert holders(api, pool, device) == [team]

        # never NoExecute: upstream must not evict
        wait_for("the taint rule", lambda: _taint_rules(api) == [(device, "NoSchedule")], 30)

        unmark(api, pool, device)
        wait_for("the record gone", lambda: record_for(api, pool, device) is None, 60)
        wait_for("the taint rule gone with its record", lambda: _taint_rules(api) == [], 60)
        assert not any(h.startswith("claimwarden-system/") for h in holders(api, pool, device))
        assert "Traceback" not in Path(operator.log_path).read_text()
    finally:
        _tear_down(api, namespace, operator)


def test_a_podgroup_claim_on_a_quarantined_device_is_deleted_with_its_allocation(
        health_lab: LabState, tmp_path_factory: pytest.TempPathFactory) -> None:
    """Rule 2 of the quarantine trap for a PodGroup's claim (issue 20, finding 4): once its PodGroup is gone, the
    claim goes with its allocation, never deallocated first (a deallocation wakes pending pods while the
    scheduler sees the device free); the quarantine claim then takes the device."""
    api = _api(health_lab)
    core, resource = client.CoreV1Api(api), client.ResourceV1Api(api)
    namespace = "release"
    core.create_namespace(body={"metadata": {"name": namespace}})
    resource.create_namespaced_resource_claim_template(namespace, body=template("gpu"))
    operator = Operator(service_account_kubeconfig(health_lab), tmp_path_factory.mktemp("pgr") / "claimwarden.log")
    operator.start()
    try:
        _create_podgroup(api, namespace, "team", USES)
        create_pods(api, namespace, [_member("team-0", "team", USES)])
        team_claim = _group_claim(api, namespace, "team")
        name = str(team_claim["metadata"]["name"])  # type: ignore[index]
        pool, device = _device(team_claim)
        create_record(api, "hold-team-device", pool, device, "NoSchedule", "kept from new work")
        wait_for("the record saying the team's claim holds the device", lambda: any(
            c["type"] == "Quarantined" and c["reason"] == "HeldByClaims"
            for c in ((record_for(api, pool, device) or {}).get("status") or {}).get("conditions") or []), 30)

        seen: list[tuple[str, bool]] = []  # (event type, allocated) of the team's claim, until it is deleted
        version = client.CustomObjectsApi(api).get_namespaced_custom_object(
            "resource.k8s.io", "v1", namespace, "resourceclaims", name)["metadata"]["resourceVersion"]

        def follow() -> None:  # raw JSON: the client's models predate 1.37's PodGroup entries of reservedFor
            for event in watch.Watch().stream(client.CustomObjectsApi(api).list_namespaced_custom_object,
                                              "resource.k8s.io", "v1", namespace, "resourceclaims",
                                              field_selector=f"metadata.name={name}", resource_version=version,
                                              timeout_seconds=120):
                seen.append((event["type"], bool((event["object"].get("status") or {}).get("allocation"))))
                if event["type"] == "DELETED":
                    return

        follower = threading.Thread(target=follow, daemon=True)
        follower.start()
        core.delete_namespaced_pod("team-0", namespace)
        wait_gone(api, namespace, "team-0", 60)
        client.CustomObjectsApi(api).delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "team")
        follower.join(120)
        assert seen and seen[-1] == ("DELETED", True), f"deleted with its allocation: {seen}"
        assert ("MODIFIED", False) not in seen, f"never deallocated first: {seen}"
        wait_for("the quarantine claim holding the device", lambda: [h for h in holders(api, pool, device)
                                                                   if h.startswith("claimwarden-system/")], 30)
        delete_record(api, "hold-team-device")
        wait_for("the device free again", lambda: holders(api, pool, device) == [], 30)
        assert "Traceback" not in Path(operator.log_path).read_text()
    finally:
        _tear_down(api, namespace, operator)
