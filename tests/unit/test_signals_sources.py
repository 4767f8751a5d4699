"""The signal sources (issue 21): driver taints, KEP-4680 pod status and node conditions -> observations."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from claimwarden.health.records import TAINT_KEY, DeviceRef
from claimwarden.signals import decide, keys, nodes, podhealth, taints
from claimwarden.signals.observations import (
    HEALTHY,
    KEY_MAX,
    SOURCE_NODE,
    SOURCE_POD,
    SOURCE_TAINT,
    UNHEALTHY,
    UNKNOWN,
    from_json,
    merge,
    to_json,
)
from claimwarden.signals.policy import Policy, Rule

NVIDIA = "gpu.nvidia.com"
T0 = datetime(2026, 12, 2, 12, 0, 0, tzinfo=UTC)
NOW = T0 + timedelta(minutes=5)
REF = DeviceRef(NVIDIA, "node-1", "gpu-0")


def rfc(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def taint(key: str, value: str | None = None, effect: str = "NoSchedule", at: datetime | None = T0) -> dict[str, Any]:
    body: dict[str, Any] = {"key": key, "effect": effect}
    if value is not None:
        body["value"] = value
    if at is not None:
        body["timeAdded"] = rfc(at)
    return body


def device(name: str, device_taints: list[dict[str, Any]] | None = None, **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"name": name, **extra}
    if device_taints is not None:
        body["taints"] = device_taints
    return body


def slice_(name: str, pool: str, devices: list[dict[str, Any]], generation: int = 1, count: int = 1,
           driver: str = NVIDIA, node: str | None = None, **spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": name},
            "spec": {"driver": driver, "nodeName": node if node is not None else pool,
                     "pool": {"name": pool, "generation": generation, "resourceSliceCount": count},
                     "devices": devices, **spec}}


# --- complete pools -------------------------------------------------------------------------------

def test_a_pool_split_over_slices_is_complete_only_with_all_its_slices() -> None:
    first = slice_("a", "node-1", [device("gpu-0")], count=2)
    second = slice_("b", "node-1", [device("gpu-1")], count=2)
    assert taints.complete_pools([first]) == {}
    assert taints.complete_pools([first, second]) == {(NVIDIA, "node-1"): [first, second]}


def test_only_the_highest_generation_counts_and_an_incomplete_one_hides_the_pool() -> None:
    old = slice_("old", "node-1", [device("gpu-0", [taint("gpu.nvidia.com/xid", "79")])], generation=1)
    new_a = slice_("new-a", "node-1", [device("gpu-0")], generation=2, count=2)
    new_b = slice_("new-b", "node-1", [device("gpu-1")], generation=2, count=2)
    # Generation 2 half published: no conclusion at all, not generation 1's view.
    assert taints.complete_pools([old, new_a]) == {}
    assert taints.complete_pools([old, new_a, new_b]) == {(NVIDIA, "node-1"): [new_a, new_b]}


def test_a_slice_listed_twice_counts_once_and_disagreeing_counts_are_incomplete() -> None:
    one = slice_("a", "node-1", [device("gpu-0")], count=2)
    assert taints.complete_pools([one, one]) == {}
    other = slice_("b", "node-1", [device("gpu-1")], count=3)
    assert taints.complete_pools([one, other]) == {}


def test_pools_are_per_driver_and_malformed_slices_are_skipped() -> None:
    ours = slice_("a", "node-1", [device("gpu-0")])
    theirs = slice_("b", "node-1", [device("nic-0")], driver="nic.example.com")
    broken = [{"spec": {"driver": NVIDIA, "pool": {"name": "node-2", "generation": "1",
                                                     "resourceSliceCount": 1}}},
              {"spec": {"pool": {"name": "node-3", "generation": 1, "resourceSliceCount": 1}}},
              {"metadata": {"name": "x"}}, {"spec": None}]
    pools = taints.complete_pools([ours, theirs, *broken])
    assert pools == {(NVIDIA, "node-1"): [ours], ("nic.example.com", "node-1"): [theirs]}


def test_pool_names_with_slashes_are_kept_whole() -> None:
    item = slice_("a", "rack-1/node-1", [device("gpu-0", [taint("gpu.nvidia.com/gpu-lost")])])
    pools = taints.complete_pools([item])
    assert list(pools) == [(NVIDIA, "rack-1/node-1")]
    assert list(taints.device_taints(pools[(NVIDIA, "rack-1/node-1")])) == [
        DeviceRef(NVIDIA, "rack-1/node-1", "gpu-0")]


# --- device taints --------------------------------------------------------------------------------

def test_every_device_is_listed_with_its_taints_or_none() -> None:
    xid = taint("gpu.nvidia.com/xid", "79")
    items = [slice_("a", "node-1", [device("gpu-0", [xid]), device("gpu-1")], count=2),
             slice_("b", "node-1", [device("gpu-2", [{"value": "no key"}, "junk", xid]), {"taints": [xid]}],
                    count=2)]
    assert taints.device_taints(items) == {
        DeviceRef(NVIDIA, "node-1", "gpu-0"): [xid],
        DeviceRef(NVIDIA, "node-1", "gpu-1"): [],
        DeviceRef(NVIDIA, "node-1", "gpu-2"): [xid],
    }


# --- taint observations ---------------------------------------------------------------------------

def test_a_new_taint_is_one_unhealthy_observation_at_its_time_added() -> None:
    found = taints.taint_observations(REF, [taint("gpu.nvidia.com/xid", "79")], [], NOW)
    assert len(found) == 1
    (observation,) = found
    assert (observation.source, observation.signal, observation.value, observation.state, observation.at) == (
        SOURCE_TAINT, "gpu.nvidia.com/xid", "79", UNHEALTHY, T0)
    assert observation.key == f"gpu.nvidia.com/xid=79@{rfc(T0)}"
    assert "79" in observation.message and "NoSchedule" in observation.message


def test_the_same_taint_seen_again_adds_nothing_and_an_incomplete_pool_concludes_nothing() -> None:
    present = [taint("gpu.nvidia.com/xid", "79")]
    first = taints.taint_observations(REF, present, [], NOW)
    assert taints.taint_observations(REF, present, first, NOW + timedelta(minutes=1)) == []
    # Incomplete pool: not even the removal of what the record holds.
    assert taints.taint_observations(REF, None, first, NOW) == []


def test_a_value_change_under_one_key_is_a_new_observation_not_a_removal() -> None:
    # NVIDIA keeps only the latest value per key: the history is ours.
    first = taints.taint_observations(REF, [taint("gpu.nvidia.com/xid", "79")], [], NOW)
    later = T0 + timedelta(minutes=2)
    second = taints.taint_observations(REF, [taint("gpu.nvidia.com/xid", "48", at=later)], first, NOW)
    assert [(o.value, o.state, o.at) for o in second] == [("48", UNHEALTHY, later)]


def test_a_removed_taint_is_one_healthy_observation_then_nothing() -> None:
    first = taints.taint_observations(REF, [taint("gpu.nvidia.com/gpu-lost")], [], NOW)
    removed = taints.taint_observations(REF, [], first, NOW)
    assert [(o.signal, o.state, o.at, o.key) for o in removed] == [
        ("gpu.nvidia.com/gpu-lost", HEALTHY, NOW, f"gpu.nvidia.com/gpu-lost removed@{rfc(NOW)}")]
    assert removed[0].value == ""
    assert taints.taint_observations(REF, [], first + removed, NOW + timedelta(minutes=1)) == []


def test_a_removal_comes_after_its_fault_even_when_our_clock_is_behind_the_apiservers() -> None:
    first = taints.taint_observations(REF, [taint("gpu.nvidia.com/xid", "79", at=NOW)], [], NOW)
    behind = NOW - timedelta(seconds=2)
    (removed,) = taints.taint_observations(REF, [], first, behind)
    assert removed.state == HEALTHY and removed.at > first[0].at
    assert removed.at - first[0].at < timedelta(milliseconds=1)


def test_a_taint_back_after_its_removal_is_new_again() -> None:
    first = taints.taint_observations(REF, [taint("gpu.nvidia.com/xid", "79")], [], NOW)
    removed = taints.taint_observations(REF, [], first, NOW)
    back_at = NOW + timedelta(minutes=1)
    back = taints.taint_observations(REF, [taint("gpu.nvidia.com/xid", "79", at=back_at)], first + removed,
                                     back_at)
    assert [(o.state, o.at) for o in back] == [(UNHEALTHY, back_at)]


def test_a_taint_back_is_dated_after_its_removal_even_when_the_apiservers_clock_is_behind() -> None:
    """Review finding: re-added with a timeAdded at or before the removal we dated, it never counted."""
    xid = "gpu.nvidia.com/xid"
    first = taints.taint_observations(REF, [taint(xid, "79", at=T0)], [], T0)
    removed = taints.taint_observations(REF, [], first, NOW)
    behind = NOW - timedelta(seconds=2)  # the apiserver's timeAdded for the taint coming back
    (back,) = taints.taint_observations(REF, [taint(xid, "48", at=behind)], first + removed, NOW + timedelta(seconds=1))
    assert back.at > removed[0].at and back.at - removed[0].at < timedelta(milliseconds=1)
    assert back.key == f"{xid}=48@{rfc(behind)}"  # its identity is still the taint's
    seen = first + removed + [back]
    assert taints.taint_observations(REF, [taint(xid, "48", at=behind)], seen, NOW + timedelta(minutes=1)) == []
    # and so decide counts it: the mark recovered at the removal, the re-fault escalates
    p = Policy("p", rules=(Rule("xid", SOURCE_TAINT, xid, (), "NoSchedule", "Enforce"),))
    history = decide.History()
    for moment, known in ((T0, first), (NOW, first + removed), (NOW + timedelta(seconds=1), seen)):
        decision = decide.decide(p, known, history, lambda *_: 1, moment)
        history = decision.history
    assert (decision.effect, decision.escalated) == ("NoExecute", True)


def test_the_longest_taint_key_is_kept_whole_and_never_looks_removed() -> None:
    """A taint key is a qualified name: a 253-character DNS prefix, '/', a 63-character name (317)."""
    key = ".".join(["a" * 63] * 3 + ["b" * 61]) + "/" + "x" * 63
    assert len(key) == 317
    first = taints.taint_observations(REF, [taint(key, "79")], [], NOW)
    stored = [o for o in map(from_json, map(to_json, first)) if o is not None]
    assert [o.signal for o in stored] == [key]
    assert taints.taint_observations(REF, [taint(key, "79")], stored, NOW + timedelta(minutes=1)) == []


def test_duplicate_taints_in_one_device_count_once() -> None:
    xid = taint("gpu.nvidia.com/xid", "79")
    assert len(taints.taint_observations(REF, [xid, dict(xid)], [], NOW)) == 1


def test_claimwardens_own_taint_is_never_a_signal() -> None:
    assert taints.taint_observations(REF, [taint(TAINT_KEY, "unhealthy", "NoExecute")], [], NOW) == []


def test_a_taint_without_time_added_is_dated_when_first_seen_and_not_repeated() -> None:
    bare = [taint("gpu.nvidia.com/unmonitored", effect="None", at=None)]
    first = taints.taint_observations(REF, bare, [], NOW)
    assert [(o.at, o.state) for o in first] == [(NOW, UNHEALTHY)]
    assert taints.taint_observations(REF, bare, first, NOW + timedelta(seconds=30)) == []


def test_taint_observations_ignore_other_sources_in_the_record() -> None:
    pod = podhealth.pod_health_observations(
        [podhealth.DeviceHealth(REF, "uid/ctr/x", UNHEALTHY, "")], [], NOW)
    assert taints.taint_observations(REF, [], pod, NOW) == []


def test_taint_observations_survive_a_record_merge() -> None:
    first = taints.taint_observations(REF, [taint("gpu.nvidia.com/xid", "79")], [], NOW)
    merged, added = merge([], first)
    assert added == first
    assert taints.taint_observations(REF, [taint("gpu.nvidia.com/xid", "79")], merged, NOW) == []


# --- pod status -----------------------------------------------------------------------------------

def resource(resource_id: Any, health: Any, message: Any = None) -> dict[str, Any]:
    body = {"resourceID": resource_id, "health": health}
    if message is not None:
        body["message"] = message
    return body


def pod(uid: str | None = "uid-1", containers: list[dict[str, Any]] | None = None,
        init: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    status: dict[str, Any] = {}
    if containers is not None:
        status["containerStatuses"] = containers
    if init is not None:
        status["initContainerStatuses"] = init
    return {"metadata": {"name": "p", "namespace": "ns", **({"uid": uid} if uid else {})}, "status": status}


def container(name: str, entries: list[dict[str, Any]]) -> dict[str, Any]:
    return {"name": name, "ready": True, "allocatedResourcesStatus": entries}


def test_pod_health_reads_containers_and_init_containers() -> None:
    body = pod(containers=[container("main", [{"name": "claim:gpu-claim/gpu", "resources": [
        resource(f"{NVIDIA}/node-1/gpu-0", "Unhealthy", "XID 79"),
        resource(f"{NVIDIA}/node-1/gpu-1", "Healthy")]}])],
        init=[container("setup", [{"name": "claim:gpu-claim", "resources": [
            resource(f"{NVIDIA}/node-1/gpu-0", "Unknown")]}])])
    found = podhealth.pod_device_health(body)
    assert [(h.ref.device, h.key, h.health, h.message) for h in found] == [
        ("gpu-0", f"uid-1/setup/{NVIDIA}/node-1/gpu-0", UNKNOWN, ""),
        ("gpu-0", f"uid-1/main/{NVIDIA}/node-1/gpu-0", UNHEALTHY, "XID 79"),
        ("gpu-1", f"uid-1/main/{NVIDIA}/node-1/gpu-1", HEALTHY, ""),
    ]


def test_resource_ids_with_slashes_in_the_pool_name() -> None:
    body = pod(containers=[container("main", [{"name": "claim:c/r", "resources": [
        resource(f"{NVIDIA}/rack-1/node-1/gpu-0", "Unhealthy")]}])])
    (found,) = podhealth.pod_device_health(body)
    assert found.ref == DeviceRef(NVIDIA, "rack-1/node-1", "gpu-0")
    assert podhealth.parse_resource_id("a/b") is None
    assert podhealth.parse_resource_id("/pool/dev") is None
    assert podhealth.parse_resource_id("drv//dev") is None


def test_malformed_pod_health_entries_are_skipped() -> None:
    good = resource(f"{NVIDIA}/node-1/gpu-0", "Unhealthy")
    body = pod(containers=[
        container("main", [
            {"name": "nvidia.com/gpu", "resources": [resource("GPU-1234", "Unhealthy")]},  # a device plugin's
            {"name": "claim:c/r", "resources": [resource(f"{NVIDIA}/node-1", "Unhealthy"),
                                                  resource(f"{NVIDIA}/node-1/gpu-1", "Broken"),
                                                  resource(7, "Unhealthy"), "junk", good]},
            {"resources": [good]}, "junk", {"name": "claim:c/r", "resources": "junk"}]),
        {"allocatedResourcesStatus": [{"name": "claim:c/r", "resources": [good]}]},  # no container name
        "junk"])
    found = podhealth.pod_device_health(body)
    assert [(h.ref.device, h.health) for h in found] == [("gpu-0", UNHEALTHY)]
    assert podhealth.pod_device_health(pod(uid=None, containers=body["status"]["containerStatuses"])) == []
    assert podhealth.pod_device_health({"metadata": {"uid": "u"}}) == []
    assert podhealth.pod_device_health({"metadata": {"uid": "u"}, "status": {"containerStatuses": None}}) == []


def health(health_value: str, key: str = "uid-1/main/x", message: str = "") -> podhealth.DeviceHealth:
    return podhealth.DeviceHealth(REF, key, health_value, message)


def test_pod_health_observations_only_on_change_per_key() -> None:
    first = podhealth.pod_health_observations([health(UNHEALTHY, message="XID 79")], [], T0)
    assert [(o.source, o.signal, o.value, o.state, o.at, o.key, o.message) for o in first] == [
        (SOURCE_POD, "allocatedResourcesStatus", UNHEALTHY, UNHEALTHY, T0, "uid-1/main/x", "XID 79")]
    assert podhealth.pod_health_observations([health(UNHEALTHY)], first, NOW) == []
    healed = podhealth.pod_health_observations([health(HEALTHY)], first, NOW)
    assert [(o.state, o.at) for o in healed] == [(HEALTHY, NOW)]
    again = podhealth.pod_health_observations([health(UNHEALTHY)], first + healed, NOW + timedelta(minutes=1))
    assert [o.state for o in again] == [UNHEALTHY]


def test_pod_health_unknown_is_its_own_state_and_keys_are_independent() -> None:
    first = podhealth.pod_health_observations([health(UNHEALTHY, key="a")], [], T0)
    found = podhealth.pod_health_observations([health(UNKNOWN, key="a"), health(HEALTHY, key="b")], first, NOW)
    assert sorted((o.key, o.state) for o in found) == [("a", UNKNOWN), ("b", HEALTHY)]
    assert all(o.message for o in found)


def test_pod_health_same_key_twice_counts_once_last_wins() -> None:
    found = podhealth.pod_health_observations([health(UNHEALTHY), health(HEALTHY)], [], NOW)
    assert [o.state for o in found] == [HEALTHY]


def test_pod_health_observations_ignore_other_sources() -> None:
    taint_obs = taints.taint_observations(REF, [taint("gpu.nvidia.com/xid", "79")], [], NOW)
    clash = [o.__class__(**{**o.__dict__, "key": "uid-1/main/x"}) for o in taint_obs]
    assert [o.state for o in podhealth.pod_health_observations([health(UNHEALTHY)], clash, NOW)] == [UNHEALTHY]


# --- node conditions ------------------------------------------------------------------------------

def test_node_conditions_are_observations_keyed_by_transition_time() -> None:
    conditions = [
        {"type": "XidCriticalError", "status": "True", "reason": "Xid79", "message": "GPU fell off the bus",
         "lastTransitionTime": rfc(T0), "lastHeartbeatTime": rfc(NOW)},
        {"type": "Ready", "status": "True", "lastTransitionTime": rfc(T0)},
        {"type": "NoTime", "status": "True"}, {"status": "True", "lastTransitionTime": rfc(T0)},
        {"type": "NoStatus", "lastTransitionTime": rfc(T0)}, "junk",
    ]
    found = nodes.condition_observations("node-1", conditions)
    assert [(o.source, o.signal, o.value, o.state, o.at, o.key) for o in found] == [
        (SOURCE_NODE, "XidCriticalError", "True", UNHEALTHY, T0, f"node-1/XidCriticalError@{rfc(T0)}"),
        (SOURCE_NODE, "Ready", "True", UNHEALTHY, T0, f"node-1/Ready@{rfc(T0)}"),
    ]
    assert "Xid79" in found[0].message and "GPU fell off the bus" in found[0].message
    # A heartbeat changes nothing: the same observation.
    beat = [{**conditions[0], "lastHeartbeatTime": rfc(NOW + timedelta(minutes=1))}]
    assert nodes.condition_observations("node-1", beat)[0].key == found[0].key


def test_devices_of_a_node_whole_slices_and_per_device_selection() -> None:
    items = [
        slice_("a", "node-1", [device("gpu-0"), device("gpu-1")]),
        slice_("b", "node-2", [device("gpu-0")]),
        slice_("c", "fabric", [device("nic-0", nodeName="node-1"), device("nic-1", nodeName="node-2"),
                               device("nic-2", allNodes=True)],
               driver="nic.example.com", node="", perDeviceNodeSelection=True),
        slice_("d", "node-1", [device("gpu-0")]),  # the same device twice (two generations): once
        {"spec": {"nodeName": "node-1"}}, {"spec": None},
    ]
    assert nodes.devices_of_node("node-1", items) == [
        DeviceRef(NVIDIA, "node-1", "gpu-0"), DeviceRef(NVIDIA, "node-1", "gpu-1"),
        DeviceRef("nic.example.com", "fabric", "nic-0")]
    assert nodes.devices_of_node("node-3", items) == []


# --- what the sources make fits a record ----------------------------------------------------------

def test_the_longest_keys_the_api_allows_fit_a_record_whole() -> None:
    prefix = f"{'v' * 50}.example.com/{'p' * 253}"  # the longest driver and pool names the API allows
    body = pod(uid="u" * 36, containers=[container("c" * 63, [{"name": "claim:c", "resources": [
        resource(f"{prefix}/{'d' * 128}", "Unhealthy"), resource(f"{prefix}/{'e' * 128}", "Unhealthy")]}])])
    first, second = podhealth.pod_device_health(body)
    assert len(first.key) < KEY_MAX and first.key.endswith("d" * 128) and second.key.endswith("e" * 128)
    conditions = [{"type": "example.com/" + "x" * 300, "status": "True", "lastTransitionTime": rfc(T0)}]
    (condition,) = nodes.condition_observations("n" * 253, conditions)
    assert len(condition.key) < KEY_MAX and condition.key.endswith(f"@{rfc(T0)}")


def test_a_key_too_long_keeps_its_head_and_a_hash_of_all_of_it() -> None:
    one, other = "k" * KEY_MAX + "1", "k" * KEY_MAX + "2"
    assert len(keys.bounded(one)) == KEY_MAX and keys.bounded(one) != keys.bounded(other)
    assert keys.bounded(one) == keys.bounded(one) and keys.bounded(one).startswith("k" * 900)
    assert keys.bounded("short") == "short"


def test_every_source_observation_survives_the_records_json() -> None:
    made = [
        *taints.taint_observations(REF, [taint("gpu.nvidia.com/gpu-lost"), taint("gpu.nvidia.com/xid", "79")], [],
                                   NOW),
        *taints.taint_observations(REF, [], taints.taint_observations(REF, [taint("a.example/x")], [], T0), NOW),
        *podhealth.pod_health_observations([health(UNKNOWN), health(HEALTHY, key="k2")], [], NOW),
        *nodes.condition_observations("node-1", [{"type": "Ready", "status": "False",
                                                  "lastTransitionTime": rfc(T0)}]),
    ]
    assert len(made) == 6
    assert [from_json(to_json(o)) for o in made] == made
