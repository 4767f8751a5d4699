"""The null diff-base storage, and the start-up check that no registered handler needs a diff-base."""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from typing import Any

import kopf
import pytest
from kopf._cogs.structs import bodies
from kopf._core.intents import registries

from claimwarden import app
from claimwarden.runtime.kopf_diffbase import (
    DiffBaseNeeded,
    NullDiffBaseStorage,
    check_registry,
    handlers_needing_diffbase,
)


@pytest.fixture
def registry() -> Iterator[registries.OperatorRegistry]:
    """claimwarden's handlers as `claimwarden run` registers them, in a registry of their own."""
    default = kopf.get_default_registry()
    fresh = registries.SmartOperatorRegistry()
    kopf.set_default_registry(fresh)
    try:
        importlib.reload(app)
        app.register_health_handlers()
        app.register_podgroup_handlers("v1beta1")
        yield fresh
    finally:
        kopf.set_default_registry(default)


def test_the_storage_keeps_nothing() -> None:
    storage = NullDiffBaseStorage()
    body = bodies.Body({"metadata": {"name": "p"}, "spec": {"containers": []}})
    assert storage.build(body=body) == {}
    assert storage.fetch(body=body) is None
    storage.store(body=body, patch=kopf.Patch(), essence=bodies.BodyEssence())


def test_claimwarden_registers_no_handler_that_needs_a_diff_base(registry: registries.OperatorRegistry) -> None:
    assert handlers_needing_diffbase(registry) == []
    check_registry(registry)


@pytest.mark.parametrize("decorate", [
    lambda reg: kopf.on.create("v1", "pods", registry=reg),
    lambda reg: kopf.on.update("resource.k8s.io", "v1", "resourceclaims", registry=reg),
    lambda reg: kopf.on.delete("v1", "pods", registry=reg),
    lambda reg: kopf.on.resume("v1", "pods", registry=reg),
    lambda reg: kopf.on.field("v1", "pods", field="spec.nodeName", registry=reg),
    lambda reg: kopf.daemon("resource.k8s.io", "v1", "resourceslices", registry=reg),
    lambda reg: kopf.timer("v1", "pods", interval=60, registry=reg),
], ids=["create", "update", "delete", "resume", "field", "daemon", "timer"])
def test_start_up_fails_with_a_clear_message_when_a_handler_needs_a_diff_base(
        registry: registries.OperatorRegistry, decorate: Any) -> None:
    async def careless(**_: Any) -> None:
        return None

    decorate(registry)(careless)
    with pytest.raises(DiffBaseNeeded, match=r"need Kopf's diff-base: .*careless[^ ]*' on ") as raised:
        check_registry(registry)
    assert isinstance(raised.value, kopf.PermanentError)  # Kopf stops instead of retrying the start-up

