"""The HealthPolicy CRD and the example policies agree with what signals.policy reads."""

from __future__ import annotations

import re
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from cel_expr_python import cel

from claimwarden.health.records import EFFECTS
from claimwarden.health.siblings import SCOPES
from claimwarden.signals import observations as obs
from claimwarden.signals import policy as hp

ROOT = Path(__file__).resolve().parents[2]
CRD_PATH = ROOT / "crds" / "healthpolicies.claimwarden.io.yaml"
EXAMPLES = ROOT / "manifests" / "policies"


@pytest.fixture(scope="module")
def crd() -> dict[str, Any]:
    loaded = yaml.safe_load(CRD_PATH.read_text())
    assert isinstance(loaded, dict)
    return loaded


@pytest.fixture(scope="module")
def spec(crd: dict[str, Any]) -> dict[str, Any]:
    return dict(crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"])


@pytest.fixture(scope="module")
def rule(spec: dict[str, Any]) -> dict[str, Any]:
    return dict(spec["properties"]["rules"]["items"])


def test_names_group_scope(crd: dict[str, Any]) -> None:
    assert crd["metadata"]["name"] == f"{hp.PLURAL}.{hp.GROUP}"
    assert crd["spec"]["scope"] == "Cluster"
    assert crd["spec"]["names"]["kind"] == hp.KIND
    [version] = crd["spec"]["versions"]
    assert (version["name"], version["served"], version["storage"]) == (hp.VERSION, True, True)
    columns = {c["name"]: c["jsonPath"] for c in version["additionalPrinterColumns"]}
    assert list(columns)[:4] == ["Priority", "Rules", "Enforced", "Accepted"]
    # the columns show what policy_status writes
    status = version["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]
    written = hp.policy_status(None, ["x"])
    assert {columns["Rules"], columns["Enforced"]} == {f".status.{name}" for name in ("rules", "enforced")}
    assert {"rules", "enforced"} <= set(status) and set(written) == {"rules", "enforced", "accepted"}
    assert written["accepted"]["type"] in columns["Accepted"]
    assert (ROOT / "crds" / "kustomization.yaml").read_text().count("healthpolicies.claimwarden.io.yaml") == 1


def test_enums_and_limits_match_the_parser(spec: dict[str, Any], rule: dict[str, Any]) -> None:
    props = rule["properties"]
    assert tuple(props["source"]["enum"]) == obs.SOURCES
    assert tuple(props["effect"]["enum"]) == EFFECTS
    assert tuple(props["scope"]["enum"]) == SCOPES
    assert tuple(props["mode"]["enum"]) == hp.MODES
    assert props["mode"]["default"] == hp.MODE_SHADOW
    assert spec["properties"]["rules"]["maxItems"] == hp.RULES_MAX
    assert props["values"]["maxItems"] == hp.VALUES_MAX
    assert props["signal"]["maxLength"] == obs.SIGNAL_MAX == 317  # a taint key: qualified name, 253 + '/' + 63
    records = yaml.safe_load((ROOT / "crds" / "unhealthydevices.claimwarden.io.yaml").read_text())
    status = records["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]
    observation = status["observations"]["items"]["properties"]
    assert observation["signal"]["maxLength"] == obs.SIGNAL_MAX
    assert observation["value"]["maxLength"] == obs.VALUE_MAX and observation["key"]["maxLength"] == obs.KEY_MAX
    assert props["values"]["items"]["maxLength"] == obs.VALUE_MAX
    priority = spec["properties"]["priority"]
    assert (priority["minimum"], priority["maximum"]) == (hp.PRIORITY_MIN, hp.PRIORITY_MAX)
    assert tuple(spec["properties"]["recovery"]["properties"]["escalateTo"]["enum"]) == ("NoExecute", "NoSchedule")


def _duration(field: dict[str, Any]) -> timedelta:
    parsed = hp.parse_duration(field["default"])
    assert parsed is not None
    return parsed


def test_defaults_match_the_parser(spec: dict[str, Any], rule: dict[str, Any]) -> None:
    threshold = rule["properties"]["threshold"]["properties"]
    assert hp.Threshold(threshold["count"]["default"], _duration(threshold["window"]),
                        _duration(threshold["burst"])) == hp.Threshold()
    recovery = spec["properties"]["recovery"]["properties"]
    assert hp.Recovery(_duration(recovery["healthyHold"]), _duration(recovery["refaultWindow"]),
                       recovery["escalateTo"]["default"]) == hp.Recovery()


def _duration_patterns(node: Any) -> list[str]:
    found: list[str] = []
    if isinstance(node, dict):
        for check in node.get("x-kubernetes-validations", []):
            found += re.findall(r"matches\('(\^\(\[0-9\][^']*)'\)", check["rule"])
        for value in node.values():
            found += _duration_patterns(value)
    elif isinstance(node, list):
        for value in node:
            found += _duration_patterns(value)
    return found


@pytest.mark.parametrize("text", ["1h30m", "10m", "45s", "0s", "999999h", "1h2m3s", "", "10", "1d", "1m1h",
                                  "1.5h", "1234567s", "-1m"])
def test_the_crd_reads_durations_like_parse_duration(spec: dict[str, Any], text: str) -> None:
    patterns = set(_duration_patterns(spec))
    assert len(patterns) == 1, patterns  # one grammar everywhere
    accepted = bool(re.match(patterns.pop(), text)) and text != ""
    assert accepted == (hp.parse_duration(text) is not None)


@pytest.mark.parametrize(("fields", "valid"), [
    ({"source": "NodeCondition"}, False),
    ({"source": "NodeCondition", "values": []}, False),
    ({"source": "NodeCondition", "values": ["True"]}, True),
    ({"source": "DriverTaint", "signal": "gpu.nvidia.com/xid"}, True),
])
def test_the_crd_requires_values_on_node_condition_rules(rule: dict[str, Any], fields: dict[str, Any],
                                                         valid: bool) -> None:
    """The rule's CEL validations, run in a CEL engine, agree with parse_policy (NPD reports False when healthy)."""
    checks = [c["rule"] for c in rule["x-kubernetes-validations"] if "NodeCondition" in c["rule"]]
    assert checks
    env = cel.NewEnv(variables={"self": cel.Type.DYN})
    item = {"name": "a", "signal": "GPUProblem", "effect": "NoSchedule", **fields}
    assert all(env.compile(check).eval(data={"self": item}).value() for check in checks) == valid
    _, errors = hp.parse_policy({"metadata": {"name": "p"}, "spec": {"rules": [item]}})
    assert (errors == []) == valid, errors


@pytest.mark.parametrize("name", ["nvidia-gpu", "gpu-example"])
def test_the_example_policies_parse(name: str) -> None:
    body = yaml.safe_load((EXAMPLES / f"{name}.yaml").read_text())
    policy, errors = hp.parse_policy(body)
    assert errors == []
    assert policy is not None and policy.name == name


def test_the_nvidia_example_is_all_shadow() -> None:
    policy, _ = hp.parse_policy(yaml.safe_load((EXAMPLES / "nvidia-gpu.yaml").read_text()))
    assert policy is not None
    assert {rule.mode for rule in policy.rules} == {hp.MODE_SHADOW}
    assert {"fatal-xid", "gpu-lost", "fatal-xid-alert"} <= {rule.name for rule in policy.rules}
    fatal = policy.rule("fatal-xid")
    assert fatal is not None and {"48", "79", "94", "95"} <= set(fatal.values)
