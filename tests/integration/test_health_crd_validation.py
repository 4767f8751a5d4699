"""The real API server refuses UnhealthyDevice records whose device a ResourceSlice could never name."""

from __future__ import annotations

import json
import uuid

import pytest
from kubernetes import client

from claimwarden.health import records


def _create(api: client.ApiClient, **spec: str) -> None:
    body = {"apiVersion": records.API_VERSION, "kind": records.KIND,
            "metadata": {"name": f"crd-validation-{uuid.uuid4().hex[:8]}"},
            "spec": {"driver": "gpu.example.com", "pool": "node-1", "device": "gpu-0", "effect": "None",
                     "reason": "validation test", **spec}}
    created = client.CustomObjectsApi(api).create_cluster_custom_object(
        records.GROUP, records.VERSION, records.PLURAL, body)
    client.CustomObjectsApi(api).delete_cluster_custom_object(
        records.GROUP, records.VERSION, records.PLURAL, created["metadata"]["name"])


@pytest.mark.parametrize("pool", ["Node_1", "node-1/", "a//b"])
def test_a_bad_pool_is_refused_with_a_clear_message(api: client.ApiClient, pool: str) -> None:
    with pytest.raises(client.ApiException) as refused:
        _create(api, pool=pool)
    assert refused.value.status == 422
    message = json.loads(refused.value.body)["message"]
    assert "spec.pool" in message
    assert "pool must be one or more DNS subdomains" in message


def test_a_bad_driver_is_refused_with_a_clear_message(api: client.ApiClient) -> None:
    with pytest.raises(client.ApiException) as refused:
        _create(api, driver="gpu_example.com")
    assert refused.value.status == 422
    assert "driver must be a DNS subdomain" in json.loads(refused.value.body)["message"]


def test_every_name_a_slice_may_use_is_accepted(api: client.ApiClient) -> None:
    _create(api, pool="cluster.local/rack-7/node-1")
    _create(api, driver="GPU.Example.com", pool="node-1", device="gpu-7")


@pytest.mark.parametrize("drain", ["Soon", "EvictAfter", "EvictAfter=", "EvictAfter=30", "EvictAfter=2d",
                                   "immediate"])
def test_a_bad_drain_is_refused_with_the_syntax(api: client.ApiClient, drain: str) -> None:
    with pytest.raises(client.ApiException) as refused:
        _create(api, drain=drain)
    assert refused.value.status == 422
    assert "drain must be Immediate, AllowCompletion, Node or EvictAfter=<duration>" in json.loads(
        refused.value.body)["message"]


def test_every_drain_mode_is_accepted(api: client.ApiClient) -> None:
    for drain in ("Immediate", "AllowCompletion", "Node", "EvictAfter=30m", "EvictAfter=1h30m", "EvictAfter=45s"):
        _create(api, drain=drain)


def test_a_scope_is_device_or_fault_domain(api: client.ApiClient) -> None:
    for scope in ("Device", "FaultDomain"):
        _create(api, scope=scope)
    with pytest.raises(client.ApiException) as refused:
        _create(api, scope="Rack")
    assert refused.value.status == 422
    message = json.loads(refused.value.body)["message"]
    assert "spec.scope" in message and '"Device", "FaultDomain"' in message
