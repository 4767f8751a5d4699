"""A DeviceTaintRule version the server stops serving (an upgrade: 1.36's v1beta2, 1.37's v1) is looked up
again; its "not served" 404 is never taken for "no rule"."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from claimwarden.health.quarantine import Quarantine
from claimwarden.kube.errors import NotServed

RECORD = {"apiVersion": "claimwarden.io/v1alpha1", "kind": "UnhealthyDevice",
          "metadata": {"name": "n1.gpu-0.abc", "uid": "r-uid"},
          "spec": {"driver": "gpu.example.com", "pool": "n1", "device": "gpu-0", "effect": "NoExecute"}}


class FakeKube:
    """Serves DeviceTaintRule at `served` only; records every call."""

    def __init__(self, served: str) -> None:
        self.served = served
        self.calls: list[tuple[str, str]] = []

    async def served_version(self, group: str, plural: str, versions: tuple[str, ...]) -> str | None:
        self.calls.append(("discover", plural))
        return self.served

    def _check(self, call: str, group_version: str) -> None:
        self.calls.append((call, group_version))
        if group_version != f"resource.k8s.io/{self.served}":
            raise NotServed("NotFound", "the server could not find the requested resource")

    async def get_cluster_object(self, group_version: str, plural: str, name: str) -> dict[str, Any] | None:
        self._check("get", group_version)
        return None

    async def delete_cluster_object(self, group_version: str, plural: str, name: str) -> bool:
        self._check("delete", group_version)
        return False

    async def create_cluster_object(self, group_version: str, plural: str, body: dict[str, Any]) -> dict[str, Any]:
        self._check("create", group_version)
        return body


def test_a_taint_rule_version_no_longer_served_is_looked_up_again() -> None:
    kube = FakeKube("v1beta2")
    quarantine = Quarantine(cache=None, kube=kube, namespace="claimwarden")  # type: ignore[arg-type]

    async def scenario() -> None:
        assert await quarantine.sync_taint_rule(RECORD, needed=True)  # created at v1beta2
        kube.served = "v1"  # the control plane was upgraded; claimwarden kept running
        kube.calls.clear()
        with pytest.raises(NotServed):  # its 404 says nothing of the rule: no "deleted", no "none there"
            await quarantine.sync_taint_rule(RECORD, needed=False)
        assert kube.calls == [("delete", "resource.k8s.io/v1beta2")]
        kube.calls.clear()
        await quarantine.sync_taint_rule(RECORD, needed=False)  # the retry asks for the version again
        assert kube.calls == [("discover", "devicetaintrules"), ("get", "resource.k8s.io/v1")]

    asyncio.run(scenario())


def test_the_count_of_unselective_rules_looks_the_version_up_again_too() -> None:
    from claimwarden.health.taint_rules import UnselectiveRules

    class Listing(FakeKube):
        async def list_cluster_objects(self, group_version: str, plural: str) -> list[dict[str, Any]]:
            self._check("list", group_version)
            return [{"metadata": {"name": "everything"}, "spec": {}}]

    kube = Listing("v1beta2")
    quarantine = Quarantine(cache=None, kube=kube, namespace="claimwarden")  # type: ignore[arg-type]
    rules = UnselectiveRules(kube, quarantine.taint_rule_api, quarantine.taint_rule_api_gone)  # type: ignore[arg-type]

    async def scenario() -> None:
        await rules.refresh()
        kube.served = "v1"
        with pytest.raises(NotServed):
            await rules.refresh()
        kube.calls.clear()
        await rules.refresh()
        assert kube.calls == [("discover", "devicetaintrules"), ("list", "resource.k8s.io/v1")]
        assert rules.count == 1

    asyncio.run(scenario())
