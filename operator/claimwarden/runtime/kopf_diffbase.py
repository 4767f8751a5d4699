"""A diff-base storage that keeps nothing, and the check that nothing needs one.

Kopf builds a diff-base on every watch event of every watched kind: a deep copy of the whole body
(managedFields included), diffed against the last stored one. Only changing handlers
(``on.create``/``update``/``delete``/``resume``/``field``) and spawning handlers (daemons, timers)
read that diff; index and ``on.event`` handlers never do. claimwarden registers only the latter,
so the copy and the diff were pure cost: about a quarter of Kopf's CPU per pod event.
`NullDiffBaseStorage` builds an empty essence and stores nothing.

The storage is one setting for every kind, so a changing or spawning handler added to any kind
would silently see every object as new on every event. `check_registry` refuses to start then.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import kopf

from .kopf_private import diffbase_handlers


class NullDiffBaseStorage(kopf.DiffBaseStorage):
    """Builds ``{}``, fetches nothing, stores nothing: no copy and no diff per event."""

    def build(self, *, body: kopf.Body, extra_fields: Iterable[kopf.FieldSpec] | None = None
              ) -> kopf.BodyEssence:
        return kopf.BodyEssence()

    def fetch(self, *, body: kopf.Body) -> kopf.BodyEssence | None:
        return None

    def store(self, *, body: kopf.Body, patch: kopf.Patch, essence: kopf.BodyEssence) -> None:
        return None


class DiffBaseNeeded(kopf.PermanentError):
    """A handler that needs Kopf's diff-base is registered while the null storage is in use."""


def handlers_needing_diffbase(registry: Any) -> list[str]:
    """Descriptions of the changing and spawning handlers in a Kopf ``OperatorRegistry``, sorted."""
    return sorted(f"{kind} handler {handler.id!r} on {handler.selector}"
                  for kind, handler in diffbase_handlers(registry))


def check_registry(registry: Any) -> None:
    """Refuse to run (`DiffBaseNeeded`) if any handler would read the diff-base the null storage drops."""
    found = handlers_needing_diffbase(registry)
    if found:
        raise DiffBaseNeeded(
            "claimwarden runs Kopf with a null diff-base storage (kopf_diffbase.py), but these handlers need "
            f"Kopf's diff-base: {'; '.join(found)}. Use kopf.index/kopf.on.event instead, or give them a real "
            "diff-base storage.")
