"""Which approvals claimwarden honours (health/approval.py), and the poller of the admission policies."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import yaml

from claimwarden import metrics
from claimwarden.health import approval
from claimwarden.health.admission import MARKING_POLICY, AdmissionPolicies
from claimwarden.kube.errors import ApiError

MANIFESTS = Path(__file__).resolve().parents[2] / "manifests"


def record(generation: int = 1, **annotations: str) -> dict[str, Any]:
    return {"metadata": {"name": "r", "generation": generation, "annotations": annotations}}


def approved(by: str, generation: int | str, current: int) -> dict[str, Any]:
    return record(current, **{approval.APPROVED_BY: by, approval.APPROVED_GENERATION: str(generation)})


def shipped(directory: str) -> tuple[dict[str, Any], dict[str, Any]]:
    policy, binding = yaml.safe_load_all((MANIFESTS / directory / "policy.yaml").read_text())
    return policy, binding


def test_an_approval_for_the_current_generation_counts_with_the_policy_in_force() -> None:
    verdict = approval.judge(approved("alice", 2, 2), policy_in_force=True)
    assert verdict.honoured == "alice" and verdict.reason == approval.HONOURED and verdict.generation == 2


def test_a_spec_change_after_the_approval_makes_it_stale() -> None:
    verdict = approval.judge(approved("alice", 1, 2), policy_in_force=True)
    assert verdict.honoured is None and verdict.reason == approval.STALE
    assert "generation 1" in verdict.message and "generation 2" in verdict.message


def test_no_approval_counts_without_the_policy_and_it_is_removed_from_the_version_judged() -> None:
    verdict = approval.judge(approved("alice", 2, 2), policy_in_force=False)
    assert verdict.honoured is None and verdict.reason == approval.UNVERIFIED
    assert "claimwarden-approval" in verdict.message and "not honoured" in verdict.message
    body = approved("alice", 2, 2)
    body["metadata"]["resourceVersion"] = "42"
    assert approval.removal(body) == {"metadata": {"resourceVersion": "42", "annotations": {
        approval.APPROVED_BY: None, approval.APPROVED_GENERATION: None}}}


def test_an_approval_without_a_generation_does_not_count() -> None:
    for given in ({approval.APPROVED_BY: "alice"},
                  {approval.APPROVED_BY: "alice", approval.APPROVED_GENERATION: "latest"}):
        verdict = approval.judge(record(1, **given), policy_in_force=True)
        assert verdict.honoured is None and verdict.reason == approval.INCOMPLETE


def test_no_approval_says_nothing() -> None:
    assert approval.judge(record(1), policy_in_force=False) == approval.Verdict(reason="")
    assert approval.judge({"metadata": {}}, policy_in_force=True).honoured is None


def test_status_approval_keeps_the_first_moment_it_was_honoured_per_generation() -> None:
    honoured = approval.judge(approved("alice", 2, 2), policy_in_force=True)
    first = approval.status_approval(honoured, None, "2026-06-01T12:00:00Z")
    assert first == {"by": "alice", "generation": 2, "at": "2026-06-01T12:00:00Z"}
    assert approval.status_approval(honoured, first, "2026-06-01T12:05:00Z") == first
    again = approval.judge(approved("alice", 3, 3), policy_in_force=True)
    assert approval.status_approval(again, first, "2026-06-01T12:05:00Z")["generation"] == 3
    stale = approval.judge(approved("alice", 2, 3), policy_in_force=True)
    assert approval.status_approval(stale, first, "2026-06-01T12:05:00Z") is None


def test_the_shipped_policy_and_binding_are_in_force() -> None:
    policy, binding = shipped("approval")
    assert policy["metadata"]["annotations"][approval.POLICY_REVISION_ANNOTATION] == approval.POLICY_REVISION
    assert approval.policy_in_force(policy, [binding]) == (True, "")


def test_the_policy_is_not_in_force_without_a_denying_binding_or_at_an_older_revision() -> None:
    policy, binding = shipped("approval")
    assert not approval.policy_in_force(None, [binding])[0]
    assert "Binding" in approval.policy_in_force(policy, [])[1]
    warn_only = {**binding, "spec": {**binding["spec"], "validationActions": ["Warn", "Audit"]}}
    assert not approval.policy_in_force(policy, [warn_only])[0]
    other = {**binding, "spec": {**binding["spec"], "policyName": "something-else"}}
    assert not approval.policy_in_force(policy, [other])[0]
    older = {**policy, "metadata": {"name": approval.POLICY}}  # revision 1 carried no revision annotation
    assert "revision" in approval.policy_in_force(older, [binding])[1]
    ignoring = {**policy, "spec": {**policy["spec"], "failurePolicy": "Ignore"}}
    assert not approval.policy_in_force(ignoring, [binding])[0]


def test_the_marking_policy_ships_with_a_denying_binding() -> None:
    policy, binding = shipped("marking")
    assert policy["metadata"]["name"] == MARKING_POLICY
    assert approval.policy_bound(MARKING_POLICY, policy, [binding])
    assert not approval.policy_bound(MARKING_POLICY, None, [binding])
    assert "marking" not in (MANIFESTS / "base" / "kustomization.yaml").read_text()  # optional


class FakeKube:
    def __init__(self) -> None:
        self.objects: dict[str, dict[str, Any]] = {}
        self.bindings: list[dict[str, Any]] = []
        self.error: ApiError | None = None
        self.lists = 0

    async def get_cluster_object(self, _group_version: str, _plural: str, name: str) -> dict[str, Any] | None:
        if self.error is not None:
            raise self.error
        return self.objects.get(name)

    async def list_cluster_objects(self, _group_version: str, _plural: str) -> list[dict[str, Any]]:
        self.lists += 1
        await asyncio.sleep(0)
        return list(self.bindings)


def gauge(policy: str) -> float | None:
    return metrics.REGISTRY.get_sample_value("claimwarden_admission_policy_installed", {"policy": policy})


def test_the_poller_follows_the_policy_coming_and_going_and_fails_closed_when_it_may_not_look() -> None:
    kube = FakeKube()
    changes: list[bool] = []
    recreations: list[bool] = []
    policies: AdmissionPolicies

    async def changed(recreated: bool) -> None:
        changes.append(policies.approval_in_force)
        recreations.append(recreated)

    policies = AdmissionPolicies(kube, on_change=changed)  # type: ignore[arg-type]
    policy, binding = shipped("approval")

    async def scenario() -> None:
        assert not policies.known and not policies.approval_in_force  # nothing counts, nothing is removed yet
        await policies.refresh()  # nothing installed: the first read is a change (to "not in force")
        assert changes == [False] and gauge(approval.POLICY) == 0 and gauge(MARKING_POLICY) == 0 and policies.known
        policy["metadata"]["uid"], binding["metadata"]["uid"] = "p1", "b1"
        kube.objects[approval.POLICY], kube.bindings = policy, [binding]
        await policies.refresh()  # back after a read found it missing: approvals present then were not checked
        await policies.refresh()  # unchanged: no second call
        assert changes == [False, True] and recreations == [False, True] and gauge(approval.POLICY) == 1
        kube.bindings = [binding, {**binding, "metadata": {"name": "another", "uid": "b2"}}]
        await policies.refresh()  # a binding added is no gap
        assert changes == [False, True]
        kube.bindings = [{**binding, "metadata": {"name": binding["metadata"]["name"], "uid": "b3"}}]
        await policies.refresh()  # deleted and created again between two reads: the approvals present are suspect
        assert changes == [False, True, True] and recreations == [False, True, True]
        kube.error = ApiError(403, "Forbidden", "validatingadmissionpolicies is forbidden")
        await policies.refresh()
        assert changes == [False, True, True, False] and "may not read" in policies.approval_problem
        kube.error = ApiError(503, "ServiceUnavailable", "etcd")
        with pytest.raises(ApiError):
            await policies.refresh()  # a passing failure changes nothing (run() logs it and tries again)
        assert changes == [False, True, True, False]

    asyncio.run(scenario())


def test_confirm_reads_after_it_is_asked_and_shares_that_read() -> None:
    kube = FakeKube()
    policy, binding = shipped("approval")
    kube.objects[approval.POLICY], kube.bindings = policy, [binding]
    policies = AdmissionPolicies(kube)  # type: ignore[arg-type]

    async def scenario() -> None:
        await policies.refresh()
        assert kube.lists == 1
        assert await policies.confirm() and kube.lists == 2  # the read before does not count: it began earlier
        results = await asyncio.gather(*(policies.confirm() for _ in range(10)))
        assert all(results) and kube.lists <= 4  # ten approvals waiting share the reads
        kube.bindings = []  # the binding deleted since the last read: the next approval finds out
        assert not await policies.confirm()

    asyncio.run(scenario())
