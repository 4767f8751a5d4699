"""The real API server refuses bad HealthPolicies with the CRD's messages, and keeps good ones as the
parser reads them (the defaults it fills in are the parser's)."""

from __future__ import annotations

import json
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from claimwarden.signals import policy as hp
from claimwarden_lab import cluster

EXAMPLES = Path(__file__).resolve().parents[2] / "manifests" / "policies"
RULE = {"name": "xid", "source": "DriverTaint", "signal": "gpu.example.com/xid", "effect": "NoExecute"}


@pytest.fixture(scope="module")
def objects(lab: cluster.LabState, api: client.ApiClient) -> Iterator[client.CustomObjectsApi]:
    subprocess.run([f"{lab.bin_dir}/kubectl", f"--kubeconfig={lab.kubeconfig}", "wait",
                    "--for=condition=Established", "--timeout=60s", f"crd/{hp.PLURAL}.{hp.GROUP}"],
                   check=True, capture_output=True)
    yield client.CustomObjectsApi(api)


def _body(**spec: Any) -> dict[str, Any]:
    return {"apiVersion": f"{hp.GROUP}/{hp.VERSION}", "kind": hp.KIND,
            "metadata": {"name": f"crd-validation-{uuid.uuid4().hex[:8]}"}, "spec": {"rules": [RULE], **spec}}


def _create(objects: client.CustomObjectsApi, body: dict[str, Any]) -> dict[str, Any]:
    created: dict[str, Any] = objects.create_cluster_custom_object(hp.GROUP, hp.VERSION, hp.PLURAL, body)
    objects.delete_cluster_custom_object(hp.GROUP, hp.VERSION, hp.PLURAL, created["metadata"]["name"])
    return created


def _refusal(objects: client.CustomObjectsApi, **spec: Any) -> str:
    with pytest.raises(client.ApiException) as refused:
        _create(objects, _body(**spec))
    assert refused.value.status == 422
    return str(json.loads(refused.value.body)["message"])


def _rule(**fields: Any) -> list[dict[str, Any]]:
    return [{**RULE, **fields}]


@pytest.mark.parametrize(("spec", "message"), [
    ({"rules": [RULE, {**RULE, "source": "Alertmanager"}]}, "rule names must be unique within a policy"),
    ({"rules": _rule(threshold={"window": "10 minutes"})},
     "threshold.window must be a duration longer than 0s, like 1h30m, 10m or 45s"),
    ({"rules": _rule(threshold={"window": "0s"})},
     "threshold.window must be a duration longer than 0s, like 1h30m, 10m or 45s"),
    ({"rules": _rule(threshold={"window": "1m", "burst": "5m"})},
     "threshold.burst must not be longer than threshold.window"),
    ({"rules": [{k: v for k, v in RULE.items() if k != "signal"}]}, "signal is required"),
    ({"rules": _rule(drain="EvictAfter=2d")},
     "drain must be Immediate, AllowCompletion, Node or EvictAfter=<duration>"),
    ({"rules": _rule(workloadFault={"devices": 3, "window": "1d"})},
     "workloadFault.window must be a duration like 1h30m, 10m or 45s"),
    ({"recovery": {"healthyHold": "5"}}, "recovery.healthyHold must be a duration like 1h30m, 10m or 45s"),
    ({"pools": ["rack-*-a"]}, "'*' is allowed only at the end"),
    ({"rules": _rule(source="Syslog")}, 'Unsupported value: "Syslog"'),
    ({"rules": _rule(mode="Dry")}, 'Unsupported value: "Dry"'),
    ({"rules": _rule(threshold={"count": 33})}, "should be less than or equal to 32"),
    ({"rules": _rule(values=[str(n) for n in range(17)])}, "must have at most 16 items"),
    ({"rules": [{**RULE, "name": f"r{n}"} for n in range(33)]}, "must have at most 32 items"),
    ({"priority": 5000}, "should be less than or equal to 1000"),
])
def test_a_bad_policy_is_refused_with_the_crds_message(objects: client.CustomObjectsApi, spec: dict[str, Any],
                                                       message: str) -> None:
    refusal = _refusal(objects, **spec)
    assert message in refusal, refusal
    # the parser refuses what the apiserver refuses (an object from an older CRD gets the same verdict)
    assert hp.parse_policy(_body(**spec))[0] is None


@pytest.mark.parametrize("name", ["nvidia-gpu", "gpu-example"])
def test_the_examples_are_accepted_and_read_back_as_parsed(objects: client.CustomObjectsApi, name: str) -> None:
    body = yaml.safe_load((EXAMPLES / f"{name}.yaml").read_text())
    body["metadata"]["name"] = f"{name}-{uuid.uuid4().hex[:6]}"
    stored = _create(objects, body)
    assert hp.parse_policy(stored) == hp.parse_policy(body)


def test_the_apiserver_fills_in_the_parsers_defaults(objects: client.CustomObjectsApi) -> None:
    stored = _create(objects, _body(rules=[{**RULE, "name": "pod", "source": "PodStatus",
                                           "signal": "allocatedResourcesStatus"}, RULE]))
    rule = stored["spec"]["rules"][1]
    assert rule["mode"] == "Shadow"
    assert rule["threshold"] == {"count": 1, "window": "10m", "burst": "0s"}
    assert stored["spec"]["recovery"] == {"healthyHold": "5m", "refaultWindow": "1h", "escalateTo": "NoExecute"}
    assert stored["spec"]["priority"] == 0
    parsed, errors = hp.parse_policy(stored)
    assert errors == [] and parsed is not None
    assert parsed.rules[1].threshold == hp.Threshold() and parsed.recovery == hp.Recovery()
