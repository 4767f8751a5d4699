"""Writing a device's signal record, and reading it back through the lag of the watch.

A record is created once, its status and spec are patched only when they changed (a quiet device costs
no write), and it is deleted with the uid and resourceVersion it was read at (a record changed since is
read again, never deleted blindly). The cache brings each write back a little later: until it does, a
reconcile reads what was written here (``record``, ``status_of``, the spec in ``write``), so that a second
signal meanwhile neither creates the record again (a 409 and a retry per device in a burst) nor writes
the same status twice.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from ..cache import Body, Cache, resource_version
from ..health import records
from ..health.records import DeviceRef
from ..kube.api import Kube
from ..kube.errors import ApiError
from ..runtime.workqueue import Retry
from . import decide
from . import records as signal_records
from .observations import Observation

log = logging.getLogger("claimwarden.signals")

RECORDS_API = f"{records.GROUP}/{records.VERSION}"


class RecordWrites:
    """The signal records' writes, and what was written that the cache does not show yet."""

    def __init__(self, *, cache: Cache, kube: Kube) -> None:
        self.cache = cache
        self.kube = kube
        self._created: dict[str, Body] = {}
        """Record name -> the record as created here, until the cache has it."""
        self._written: dict[str, tuple[int, Body]] = {}
        """Record name -> (resourceVersion our last status write returned, that status), until the cache has it."""
        self._spec_written: dict[str, tuple[int, Body]] = {}

    def record(self, name: str) -> Body | None:
        """The record from the cache, or the one created here that the watch has not brought yet."""
        cached = self.cache.record(name)
        if cached is not None:
            self._created.pop(name, None)
            return cached
        return self._created.get(name)

    def status_of(self, name: str, record: Body | None) -> Body:
        """The record's status, or what we last wrote while the watch has not brought it back."""
        status = dict((record or {}).get("status") or {})
        written = self._written.get(name)
        if record is None:
            self._written.pop(name, None)
            self._spec_written.pop(name, None)
            return status
        if written is not None:
            if resource_version(record) < written[0]:
                return {**status, **written[1]}
            del self._written[name]
        return status

    def forget(self, name: str) -> None:
        """The record is gone (deleted by someone else): what was created here no longer stands for it."""
        self._created.pop(name, None)

    async def create(self, ref: DeviceRef, decision: decide.Decision) -> Body:
        body = signal_records.record_body(ref, signal_records.desired_spec(decision))
        try:
            created = await self.kube.create_cluster_object(RECORDS_API, records.PLURAL, body)
        except ApiError as exc:
            if exc.status == 409:  # made by an earlier reconcile the cache has not brought yet
                raise Retry(f"record {body['metadata']['name']} exists but is not in the cache yet") from exc
            raise
        log.info("device %s: signal record %s created: %s", ref, body["metadata"]["name"], decision.why)
        self._created[body["metadata"]["name"]] = created
        return created

    async def write(self, record: Body, status: Body, merged: Sequence[Observation], decision: decide.Decision,
                    moment: datetime) -> None:
        """The record's status and spec, each patched only when it differs from what the record shows."""
        name = record["metadata"]["name"]
        desired = signal_records.desired_status(merged, decision, status, moment)
        if any(status.get(k) != v for k, v in desired.items()):
            result = await self.kube.merge_patch_cluster_object(
                RECORDS_API, records.PLURAL, name, {"status": status_patch(status, desired)}, subresource="status")
            self._written[name] = (resource_version(result), desired)
        spec = signal_records.desired_spec(decision)
        current = record.get("spec") or {}
        written = self._spec_written.get(name)
        if written is not None and resource_version(record) < written[0]:
            current = {**current, **written[1]}  # the watch has not brought our last spec patch back yet
        if any(current.get(k) != v for k, v in spec.items()):
            result = await self.kube.merge_patch_cluster_object(RECORDS_API, records.PLURAL, name, {"spec": spec})
            self._spec_written[name] = (resource_version(result), spec)
            log.info("signal record %s: effect %s (%s)", name, decision.effect, decision.why)

    async def delete(self, record: Body) -> bool:
        """Deletes the record as it was read: False when it was gone already; Retry when it changed since."""
        meta = record["metadata"]
        try:
            await self.kube.delete_cluster_object(RECORDS_API, records.PLURAL, meta["name"], uid=meta.get("uid"),
                                                  resource_version=meta.get("resourceVersion"))
        except ApiError as exc:
            if exc.status == 404:
                return False
            if not exc.conflict:
                raise
            raise Retry(f"record {meta['name']} changed since it was read") from exc
        self._created.pop(meta["name"], None)
        return True


def status_patch(current: Mapping[str, Any], desired: Mapping[str, Any]) -> dict[str, Any]:
    """A merge patch from `current` to `desired`: a merge patch merges nested objects, so a field that the desired
    status.recovery or status.decision lacks (markedSince once a mark recovered) is removed with an explicit null."""
    patch: dict[str, Any] = {}
    for key, value in desired.items():
        before = current.get(key)
        if isinstance(value, Mapping) and isinstance(before, Mapping):
            value = {**{k: None for k in before if k not in value}, **value}
        patch[key] = value
    return patch
