"""The UnhealthyDevice CRD: its structure must match what the health code reads and writes."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from claimwarden.health.records import EFFECTS, GROUP, KIND, PLURAL, SOURCE_MANUAL, VERSION
from claimwarden.health.siblings import SCOPES

CRD_PATH = Path(__file__).resolve().parents[2] / "crds" / "unhealthydevices.claimwarden.io.yaml"


@pytest.fixture(scope="module")
def crd() -> dict[str, Any]:
    with CRD_PATH.open() as stream:
        loaded = yaml.safe_load(stream)
    assert isinstance(loaded, dict)
    return loaded


@pytest.fixture(scope="module")
def version(crd: dict[str, Any]) -> dict[str, Any]:
    versions = crd["spec"]["versions"]
    assert len(versions) == 1
    return dict(versions[0])


@pytest.fixture(scope="module")
def schema(version: dict[str, Any]) -> dict[str, Any]:
    return dict(version["schema"]["openAPIV3Schema"])


def test_names_group_and_scope(crd: dict[str, Any]) -> None:
    assert crd["apiVersion"] == "apiextensions.k8s.io/v1"
    assert crd["kind"] == "CustomResourceDefinition"
    assert crd["metadata"]["name"] == f"{PLURAL}.{GROUP}"
    assert crd["spec"]["group"] == GROUP
    assert crd["spec"]["scope"] == "Cluster"
    names = crd["spec"]["names"]
    assert names["kind"] == KIND
    assert names["plural"] == PLURAL
    assert names["singular"] == "unhealthydevice"
    assert names["shortNames"] == ["ud"]


def test_single_served_storage_version_with_status_subresource(version: dict[str, Any]) -> None:
    assert version["name"] == VERSION
    assert version["served"] is True
    assert version["storage"] is True
    assert version["subresources"] == {"status": {}}


def test_no_preserve_unknown_fields_anywhere(crd: dict[str, Any]) -> None:
    assert "preserveUnknownFields" not in yaml.safe_dump(crd)
    assert "x-kubernetes-preserve-unknown-fields" not in yaml.safe_dump(crd)


def test_spec_required_fields(schema: dict[str, Any]) -> None:
    spec = schema["properties"]["spec"]
    assert sorted(spec["required"]) == ["device", "driver", "effect", "pool", "reason"]
    assert set(spec["properties"]) == {"driver", "pool", "device", "effect", "reason", "source", "expiresAt", "drain",
                                      "recommendedAction", "scope"}
    assert tuple(spec["properties"]["scope"]["enum"]) == SCOPES and "default" not in spec["properties"]["scope"]


def test_spec_field_constraints(schema: dict[str, Any]) -> None:
    props = schema["properties"]["spec"]["properties"]
    assert props["driver"]["maxLength"] == 63
    assert props["pool"]["maxLength"] == 253
    assert props["pool"]["minLength"] == 1
    assert props["device"]["pattern"] == "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
    assert props["device"]["maxLength"] == 63
    assert props["reason"]["minLength"] == 1
    assert props["reason"]["maxLength"] == 1024
    assert props["source"]["maxLength"] == 253
    assert props["source"]["default"] == SOURCE_MANUAL
    assert props["expiresAt"] == {**props["expiresAt"], "type": "string", "format": "date-time"}


def test_effect_enum_and_default(schema: dict[str, Any]) -> None:
    effect = schema["properties"]["spec"]["properties"]["effect"]
    assert tuple(effect["enum"]) == EFFECTS
    assert all(isinstance(value, str) for value in effect["enum"])
    assert effect["default"] == "NoExecute"


@pytest.mark.parametrize("field", ["driver", "pool", "device"])
def test_device_identity_is_immutable(schema: dict[str, Any], field: str) -> None:
    rules = schema["properties"]["spec"]["properties"][field]["x-kubernetes-validations"]
    assert [rule["rule"] for rule in rules].count("self == oldSelf") == 1


def test_status_fields(schema: dict[str, Any]) -> None:
    props = schema["properties"]["status"]["properties"]
    assert props["observedGeneration"] == {"type": "integer", "format": "int64"}
    assert props["markedAt"]["format"] == "date-time"
    for counter in ("podsPending", "podsEvicted", "podsWouldEvict"):
        assert props[counter]["type"] == "integer"
    assert props["quarantineClaims"]["items"] == {"type": "string"}
    assert props["deviceTaintRule"]["type"] == "string"
    assert props["podsWouldEvictNames"]["maxItems"] == 50
    assert props["adminAccessPods"]["maxItems"] == 50 and props["adminAccessPods"]["items"] == {"type": "string"}
    assert props["recentEvictions"]["items"]["required"] == ["pod", "at"]
    assert set(props["approval"]["properties"]) == {"by", "generation", "at"}
    assert props["approval"]["properties"]["generation"]["type"] == "integer"


def test_status_conditions_are_standard(schema: dict[str, Any]) -> None:
    conditions = schema["properties"]["status"]["properties"]["conditions"]
    assert conditions["x-kubernetes-list-type"] == "map"
    assert conditions["x-kubernetes-list-map-keys"] == ["type"]
    item = conditions["items"]
    assert "type" in item["required"] and "status" in item["required"]
    assert set(item["properties"]) == {"type", "status", "reason", "message", "lastTransitionTime",
                                       "observedGeneration"}
    assert item["properties"]["status"]["enum"] == ["True", "False", "Unknown"]
    assert item["properties"]["lastTransitionTime"]["format"] == "date-time"


def test_printer_columns(version: dict[str, Any]) -> None:
    columns = {column["name"]: column for column in version["additionalPrinterColumns"]}
    assert list(columns) == ["Driver", "Pool", "Device", "Effect", "Reason", "Drain", "Repair", "Scope", "Domain",
                             "Pending", "Evicted", "Age"]
    assert (columns["Repair"]["jsonPath"], columns["Repair"]["priority"]) == (".status.recommendedAction", 1)
    assert columns["Driver"]["jsonPath"] == ".spec.driver"
    assert columns["Driver"]["priority"] == 1
    assert columns["Pool"]["jsonPath"] == ".spec.pool"
    assert columns["Device"]["jsonPath"] == ".spec.device"
    assert columns["Effect"]["jsonPath"] == ".spec.effect"
    assert columns["Reason"]["jsonPath"] == ".spec.reason"
    assert columns["Pending"]["jsonPath"] == ".status.podsPending"
    assert columns["Evicted"]["jsonPath"] == ".status.podsEvicted"
    assert columns["Age"] == {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}
    assert columns["Drain"] == {"name": "Drain", "type": "string", "jsonPath": ".spec.drain", "priority": 1}
    assert columns["Scope"] == {"name": "Scope", "type": "string", "jsonPath": ".spec.scope", "priority": 1}
    assert columns["Domain"] == {"name": "Domain", "type": "integer", "jsonPath": ".status.faultDomainSize",
                                 "priority": 1}
    assert all("priority" not in column for name, column in columns.items()
               if name not in ("Driver", "Drain", "Repair", "Scope", "Domain"))


def _accepts(schema: dict[str, Any], field: str, value: str) -> bool:
    """What the API server decides for ``value``: length, pattern and the CEL ``matches`` rules.

    The CEL rules here are plain ``self.matches('<RE2>')`` calls whose expressions mean the same in
    Python's ``re``; the lab test (tests/integration/test_health_crd_validation.py) checks the real server.
    """
    prop = schema["properties"]["spec"]["properties"][field]
    if not prop.get("minLength", 0) <= len(value) <= prop["maxLength"]:
        return False
    patterns = [prop["pattern"]] if "pattern" in prop else []
    for rule in prop.get("x-kubernetes-validations") or []:
        if rule["rule"] != "self == oldSelf":
            found = re.fullmatch(r"self\.matches\('([^']*)'\)", rule["rule"])
            assert found, f"unexpected rule on {field}: {rule['rule']}"
            assert rule["message"], "every rule says what is wrong in words"
            patterns.append(found.group(1))
    # RE2's '$' matches only at the very end; Python's also before a final newline.
    return all(re.search(re.sub(r"\$$", r"\\Z", pattern), value) for pattern in patterns)


SUBDOMAIN_253 = ".".join(["a" * 63, "b" * 63, "c" * 63, "d" * 61])  # 253 characters


@pytest.mark.parametrize(("pool", "valid"), [
    ("node-1", True),
    ("gpu.example.com", True),
    ("worker-1/gpus", True),
    ("cluster.local/rack-7/node-1", True),
    ("a", True),
    (SUBDOMAIN_253, True),
    (SUBDOMAIN_253 + "e", False),  # 254 characters
    ("Node-1", False),
    ("node_1", False),
    ("-node", False),
    ("node-", False),
    ("node..1", False),
    ("node/", False),
    ("/node", False),
    ("a//b", False),
    ("node 1", False),
    ("node-1\n", False),
])
def test_pool_follows_upstream_pool_name_rule(schema: dict[str, Any], pool: str, valid: bool) -> None:
    """validatePoolName: one or more DNS subdomains separated by '/', at most 253 characters in all."""
    assert _accepts(schema, "pool", pool) is valid


@pytest.mark.parametrize(("driver", "valid"), [
    ("gpu.example.com", True),
    ("GPU.Example.com", True),  # upstream lower-cases a driver name before checking it
    ("d" * 63, True),
    ("d" * 64, False),
    ("gpu_example.com", False),
    ("gpu.example.com.", False),
    ("gpu/example", False),
    ("", False),
])
def test_driver_is_a_dns_subdomain_of_at_most_63(schema: dict[str, Any], driver: str, valid: bool) -> None:
    assert _accepts(schema, "driver", driver) is valid


@pytest.mark.parametrize(("device", "valid"), [
    ("gpu-0", True),
    ("d" * 63, True),
    ("d" * 64, False),
    ("gpu.0", False),
    ("GPU-0", False),
    ("gpu-0\n", False),
])
def test_device_is_a_dns_label(schema: dict[str, Any], device: str, valid: bool) -> None:
    assert _accepts(schema, "device", device) is valid
