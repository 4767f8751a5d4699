"""Alertmanager's payload, and which device an alert is about (signals/alerts.py)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest

from claimwarden.health.records import DeviceRef
from claimwarden.signals import alerts
from claimwarden.signals.alerts import Alert, alert_observation, parse_payload, resolve_device
from claimwarden.signals.observations import SOURCE_ALERT, UNHEALTHY
from claimwarden_lab.driver import DEFAULT_MODEL, DRIVER, MODELS, device_uuid, devices

STARTS = "2026-12-02T10:00:00.123456789Z"


def alert(status: str = "firing", **labels: str) -> dict[str, Any]:
    return {"status": status, "labels": {"alertname": "GPUXidError", **labels},
            "annotations": {"summary": "XID 79 on   GPU gpu-3"}, "startsAt": STARTS,
            "endsAt": "0001-01-01T00:00:00Z", "generatorURL": "http://prometheus/graph",
            "fingerprint": "a1b2c3d4e5f60718"}


def payload(*items: dict[str, Any], **extra: Any) -> bytes:
    return json.dumps({"receiver": "claimwarden", "status": "firing", "alerts": list(items), "groupLabels": {},
                       "commonLabels": {}, "commonAnnotations": {}, "externalURL": "http://am:9093",
                       "version": "4", "groupKey": "{}:{}", "truncatedAlerts": 0, **extra}).encode()


def test_a_version_4_payload_parses_into_alerts() -> None:
    parsed, why = parse_payload(payload(alert(xid="79"), alert("resolved")))
    assert why is None
    assert [a.status for a in parsed] == ["firing", "resolved"]
    first = parsed[0]
    assert first.labels == {"alertname": "GPUXidError", "xid": "79"}
    assert first.annotations == {"summary": "XID 79 on   GPU gpu-3"}
    assert first.starts_at == datetime(2026, 12, 2, 10, 0, 0, 123456, tzinfo=UTC)
    assert first.fingerprint == "a1b2c3d4e5f60718"


def test_an_empty_alert_list_is_valid() -> None:
    assert parse_payload(payload()) == ([], None)


@pytest.mark.parametrize(("body", "words"), [
    (b"not json", "not JSON"),
    (b"\xff\xfe", "not JSON"),
    (b"[1, 2]", "not a JSON object"),
    (payload(version="3"), "version is '3'"),
    (json.dumps({"alerts": []}).encode(), "version is None"),
    (payload(alerts="x"), "alerts is not a list"),
    (payload(alert(), "x"), "alerts[1] is not an object"),
    (payload({**alert(), "status": "pending"}), "alerts[0].status"),
    (payload({**alert(), "labels": {"a": 1}}), "alerts[0].labels"),
    (payload({**alert(), "labels": None}), "alerts[0].labels"),
    (payload({**alert(), "annotations": ["x"]}), "alerts[0].annotations"),
    (payload({**alert(), "startsAt": "yesterday"}), "alerts[0].startsAt"),
    (payload({**alert(), "startsAt": None}), "alerts[0].startsAt"),
    (payload({**alert(), "fingerprint": 7}), "alerts[0].fingerprint"),
    (payload({**alert(), "fingerprint": "f" * 129}), "alerts[0].fingerprint"),
])
def test_a_malformed_payload_is_refused_whole_with_a_reason(body: bytes, words: str) -> None:
    parsed, why = parse_payload(body)
    assert parsed == []
    assert why is not None and words in why


def test_an_alert_without_fingerprint_gets_a_stable_one_from_its_labels() -> None:
    one = {**alert(xid="79"), "fingerprint": ""}
    other = {**alert(xid="48")}
    del other["fingerprint"]
    [a], _ = parse_payload(payload(one))
    [again], _ = parse_payload(payload(one))
    [b], _ = parse_payload(payload(other))
    assert a.fingerprint == again.fingerprint and a.fingerprint.startswith("labels:")
    assert b.fingerprint != a.fingerprint


# --- observations --------------------------------------------------------------------------------

def parsed(item: dict[str, Any]) -> Alert:
    [result], why = parse_payload(payload(item))
    assert why is None
    return result


def test_a_firing_alert_is_an_unhealthy_observation_keyed_by_fingerprint_and_start() -> None:
    observation = alert_observation(parsed(alert(xid="79", code="ignored")))
    assert observation is not None
    assert (observation.source, observation.signal, observation.value, observation.state) == (
        SOURCE_ALERT, "GPUXidError", "79", UNHEALTHY)
    assert observation.at == datetime(2026, 12, 2, 10, 0, 0, 123456, tzinfo=UTC)
    assert observation.key == "a1b2c3d4e5f60718@2026-12-02T10:00:00Z"
    assert observation.message == "XID 79 on GPU gpu-3"


def test_the_value_is_xid_else_code_else_empty() -> None:
    assert alert_observation(parsed(alert(code="DCGM_FR_XID_ERROR"))).value == "DCGM_FR_XID_ERROR"  # type: ignore[union-attr]
    assert alert_observation(parsed(alert())).value == ""  # type: ignore[union-attr]


def test_the_same_alert_sent_again_is_the_same_observation_and_a_new_start_is_a_new_one() -> None:
    first = alert_observation(parsed(alert(xid="79")))
    again = alert_observation(parsed(alert(xid="79")))
    later = alert_observation(parsed({**alert(xid="79"), "startsAt": "2026-12-02T11:00:00Z"}))
    assert first == again
    assert later is not None and first is not None and later.key != first.key


def test_a_resolved_alert_is_never_an_observation() -> None:
    assert alert_observation(parsed(alert("resolved", xid="79"))) is None


def test_an_alert_without_alertname_is_no_observation_and_long_texts_are_cut() -> None:
    nameless = alert(xid="79")
    del nameless["labels"]["alertname"]
    assert alert_observation(parsed(nameless)) is None
    long = alert(xid="7" * 300)
    long["annotations"] = {"description": "d" * 1000}
    observation = alert_observation(parsed(long))
    assert observation is not None
    assert len(observation.value) == alerts.NAME_MAX and len(observation.message) == 256


# --- which device --------------------------------------------------------------------------------

def lab_slice(node: str, *, generation: int = 1, pool: str | None = None) -> dict[str, Any]:
    """The lab driver's slice of `node` (driver.devices: attribute `uuid` per device)."""
    return {"spec": {"driver": DRIVER, "nodeName": node,
                     "pool": {"name": pool or node, "generation": generation, "resourceSliceCount": 1},
                     "devices": devices(node, 4, MODELS[DEFAULT_MODEL])}}


SLICES = [lab_slice("node-1"), lab_slice("node-2")]


def test_dra_labels_name_the_device_directly() -> None:
    a = parsed(alert(dra_driver_name="gpu.nvidia.com", dra_pool_name="node-9", dra_device_name="gpu-0",
                     UUID=device_uuid("node-1", 2), Hostname="node-1"))
    assert resolve_device(a, SLICES) == DeviceRef("gpu.nvidia.com", "node-9", "gpu-0")


def test_uuid_and_hostname_resolve_through_the_slices_uuid_attribute() -> None:
    a = parsed(alert(UUID=device_uuid("node-2", 3), Hostname="node-2"))
    assert resolve_device(a, SLICES) == DeviceRef(DRIVER, "node-2", "gpu-3")
    # dcgm-exporter writes GPU UUIDs in upper case (GPU-...); the comparison ignores case.
    upper = parsed(alert(UUID=device_uuid("node-2", 3).upper(), Hostname="node-2"))
    assert resolve_device(upper, SLICES) == DeviceRef(DRIVER, "node-2", "gpu-3")


def test_a_uuid_on_another_node_or_unknown_does_not_resolve() -> None:
    assert resolve_device(parsed(alert(UUID=device_uuid("node-2", 3), Hostname="node-1")), SLICES) is None
    assert resolve_device(parsed(alert(UUID="GPU-nope", Hostname="node-1")), SLICES) is None
    assert resolve_device(parsed(alert(UUID=device_uuid("node-2", 3))), SLICES) is None  # no Hostname


def test_a_domain_qualified_uuid_attribute_and_per_device_nodes_resolve() -> None:
    slice_ = {"spec": {"driver": "gpu.nvidia.com", "perDeviceNodeSelection": True,
                       "pool": {"name": "rack/1", "generation": 3},
                       "devices": [{"name": "gpu-0", "nodeName": "n1",
                                    "attributes": {"gpu.nvidia.com/uuid": {"string": "GPU-aaa"}}},
                                   {"name": "gpu-1", "nodeName": "n2",
                                    "attributes": {"gpu.nvidia.com/uuid": {"string": "GPU-bbb"}}},
                                   {"name": "gpu-2", "nodeName": "n2",
                                    "attributes": {"gpu.nvidia.com/uuidx": {"string": "GPU-ccc"}}}]}}
    assert resolve_device(parsed(alert(UUID="GPU-bbb", Hostname="n2")), [slice_]) == DeviceRef(
        "gpu.nvidia.com", "rack/1", "gpu-1")
    assert resolve_device(parsed(alert(UUID="GPU-bbb", Hostname="n1")), [slice_]) is None
    assert resolve_device(parsed(alert(UUID="GPU-ccc", Hostname="n2")), [slice_]) is None


def test_only_the_newest_generation_of_a_pool_counts_and_ambiguity_resolves_to_none() -> None:
    old = lab_slice("node-1", generation=1)
    new = lab_slice("node-1", generation=2)
    new["spec"]["devices"] = [{**d, "name": f"new-{d['name']}"} for d in new["spec"]["devices"]]
    a = parsed(alert(UUID=device_uuid("node-1", 1), Hostname="node-1"))
    assert resolve_device(a, [old, new]) == DeviceRef(DRIVER, "node-1", "new-gpu-1")
    # Two pools on one node claiming one UUID: no guess.
    other = lab_slice("node-1", pool="node-1-b")
    assert resolve_device(a, [old, other]) is None


def test_the_claimwarden_device_label_is_the_last_way() -> None:
    a = parsed(alert(claimwarden_device="gpu.example.com/rack/7/gpu-1"))
    assert resolve_device(a, []) == DeviceRef("gpu.example.com", "rack/7", "gpu-1")
    # A UUID that resolves wins over the label; one that does not falls back to it.
    both = parsed(alert(UUID=device_uuid("node-1", 0), Hostname="node-1", claimwarden_device="d/p/x"))
    assert resolve_device(both, SLICES) == DeviceRef(DRIVER, "node-1", "gpu-0")
    missing = parsed(alert(UUID="GPU-nope", Hostname="node-1", claimwarden_device="d/p/x"))
    assert resolve_device(missing, SLICES) == DeviceRef("d", "p", "x")


@pytest.mark.parametrize("text", ["", "driver", "driver/pool", "/pool/dev", "driver/pool/", "driver//dev"])
def test_a_malformed_claimwarden_device_resolves_to_none(text: str) -> None:
    assert resolve_device(parsed(alert(claimwarden_device=text)), SLICES) is None


def test_partial_dra_labels_fall_through_to_the_next_way() -> None:
    a = parsed(alert(dra_driver_name=DRIVER, dra_pool_name="node-1", UUID=device_uuid("node-1", 2),
                     Hostname="node-1"))
    assert resolve_device(a, SLICES) == DeviceRef(DRIVER, "node-1", "gpu-2")
    assert resolve_device(parsed(alert(dra_driver_name=DRIVER, dra_pool_name="node-1")), SLICES) is None
