"""A record gone: its device's quarantine claim is released even when the first try fails, and even when this
process never synced the record (health/controller.py `_record_gone`). Before, a failed release lost which
device the record marked, and the retry released nothing: the claim stayed until the next resync (CI saw a
quarantine claim left 30 s after its record in the real-node test). A fake API records every call; the cache
is the real `Cache`."""

from __future__ import annotations

import asyncio
from typing import Any

from claimwarden.health.controller import HealthController
from claimwarden.health.plan import device_label
from claimwarden.kube.errors import ApiError
from tests.unit.test_health_quarantine_device import NS, REF, FakeKube, _claim, _quarantine


class GoneKube(FakeKube):
    """The record is gone live; the first deallocation of a claim fails (an apiserver hiccup)."""

    def __init__(self, fail_first: bool) -> None:
        super().__init__(records=[])
        self.fail_first = fail_first

    async def get_cluster_object(self, group_version: str, plural: str, name: str) -> dict[str, Any] | None:
        return None

    async def served_version(self, group: str, plural: str, versions: tuple[str, ...]) -> str | None:
        return None  # no DeviceTaintRule served

    async def patch_claim_status(self, namespace: str, name: str, ops: list[dict[str, Any]]) -> dict[str, Any]:
        if self.fail_first:
            self.fail_first = False
            raise ApiError(500, "InternalError", "etcd is away")
        return await super().patch_claim_status(namespace, name, ops)


def _controller(kube: GoneKube) -> HealthController:
    cache = _quarantine([_claim("held", device_label(REF), REF)], kube).cache
    return HealthController(cache, kube, NS)  # type: ignore[arg-type]


def test_a_release_that_failed_is_retried_for_the_same_device() -> None:
    kube = GoneKube(fail_first=True)
    health = _controller(kube)
    health._record_devices["rec"] = REF  # synced while it existed
    try:
        asyncio.run(health.reconcile_record("rec"))
    except ApiError:
        pass
    else:
        raise AssertionError("the failed deallocation must make the reconcile fail (the queue retries it)")
    asyncio.run(health.reconcile_record("rec"))  # the queue's retry
    assert kube.calls == [("deallocate", "held"), ("delete", "held")]
    assert "rec" not in health._record_devices  # forgotten once dealt with


def test_a_record_never_synced_here_releases_the_claims_no_live_record_accounts_for() -> None:
    kube = GoneKube(fail_first=False)
    health = _controller(kube)
    asyncio.run(health.reconcile_record("rec"))
    assert kube.calls == [("deallocate", "held"), ("delete", "held")]
