"""The UnhealthyDevice CRD: its structure must match what the health code reads and writes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from claimwarden.health.records import EFFECTS, GROUP, KIND, PLURAL, SOURCE_MANUAL, VERSION

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
    assert set(spec["properties"]) == {"driver", "pool", "device", "effect", "reason", "source", "expiresAt"}


def test_spec_field_constraints(schema: dict[str, Any]) -> None:
    props = schema["properties"]["spec"]["properties"]
    assert props["driver"]["maxLength"] == 63
    assert "pattern" in props["driver"]
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
    assert [rule["rule"] for rule in rules] == ["self == oldSelf"]


def test_status_fields(schema: dict[str, Any]) -> None:
    props = schema["properties"]["status"]["properties"]
    assert props["observedGeneration"] == {"type": "integer", "format": "int64"}
    assert props["markedAt"]["format"] == "date-time"
    for counter in ("podsPending", "podsEvicted", "podsWouldEvict"):
        assert props[counter]["type"] == "integer"
    assert props["quarantineClaims"]["items"] == {"type": "string"}
    assert props["deviceTaintRule"]["type"] == "string"


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
    assert list(columns) == ["Driver", "Pool", "Device", "Effect", "Reason", "Pending", "Evicted", "Age"]
    assert columns["Driver"]["jsonPath"] == ".spec.driver"
    assert columns["Driver"]["priority"] == 1
    assert columns["Pool"]["jsonPath"] == ".spec.pool"
    assert columns["Device"]["jsonPath"] == ".spec.device"
    assert columns["Effect"]["jsonPath"] == ".spec.effect"
    assert columns["Reason"]["jsonPath"] == ".spec.reason"
    assert columns["Pending"]["jsonPath"] == ".status.podsPending"
    assert columns["Evicted"]["jsonPath"] == ".status.podsEvicted"
    assert columns["Age"] == {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}
    assert all("priority" not in column for name, column in columns.items() if name != "Driver")
