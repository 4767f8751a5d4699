"""A pod deleted before its claims are recorded in its status: the 404 of the apply ends the reconcile.

Found by the soak (tests/chaos/test_soak.py): at 20 pods a second, churn deletes pods while their keys wait,
and the apply of `resourceClaimStatuses` to a pod that is gone answered 404 and was retried with back-off (up
to 300 s) for as long as the pod stayed in the cache: 97 % of claimwarden's pod writes in a 5-minute slice.
"""

from __future__ import annotations

import asyncio
from typing import Any

from claimwarden.cache import Cache, index_views
from claimwarden.claims.controller import ClaimsController
from claimwarden.kube.errors import ApiError
from tests.unit.test_prechecks import NS, Indices, claim, pod


class GoneKube:
    """The apiserver after the pod's deletion: its status answers 404 naming it."""

    def __init__(self) -> None:
        self.applies: list[tuple[str, str]] = []

    async def apply_pod_claim_statuses(self, namespace: str, name: str, entries: list[dict[str, str]]) -> Any:
        self.applies.append((namespace, name))
        raise ApiError(404, "NotFound", f'pods "{name}" not found')


def test_a_pod_gone_before_its_claims_are_recorded_is_not_retried() -> None:
    indices = Indices()
    indices.pod(pod())  # still in the cache: its DELETED event has not come yet
    indices.claim(claim("c1"))  # created from its template, not recorded in its status yet
    kube = GoneKube()
    controller = ClaimsController(Cache(index_views({"pods": indices.pods, "claims": indices.claims,
                                                      "templates_by_name": {}})), kube)  # type: ignore[arg-type]
    asyncio.run(controller.reconcile((NS, "p")))  # returns: nothing to retry
    assert kube.applies == [(NS, "p")]


def test_other_failures_of_the_apply_are_still_retried() -> None:
    class Refusing(GoneKube):
        async def apply_pod_claim_statuses(self, namespace: str, name: str, entries: list[dict[str, str]]) -> Any:
            raise ApiError(500, "InternalError", "etcd is away")

    indices = Indices()
    indices.pod(pod())
    indices.claim(claim("c1"))
    controller = ClaimsController(Cache(index_views({"pods": indices.pods, "claims": indices.claims,
                                                      "templates_by_name": {}})), Refusing())  # type: ignore[arg-type]
    try:
        asyncio.run(controller.reconcile((NS, "p")))
    except ApiError as exc:
        assert exc.status == 500
    else:
        raise AssertionError("a 500 from the apply must be retried (the reconcile raises)")
