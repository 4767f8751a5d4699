"""Keeping new work off a marked device: quarantine claims and, where served, a DeviceTaintRule.

The rules this follows are the quarantine trap's, in the package docstring (rules 1 and 3 here).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from typing import Any

from ..cache import Body, Cache
from ..kube.api import Kube
from ..kube.errors import ApiError, NotServed
from ..objects.claims import allocated_devices, is_allocated
from . import plan, records
from .records import DeviceRef

log = logging.getLogger("claimwarden.health")

TAINT_RULE_VERSIONS = ("v1", "v1beta2", "v1alpha3")
EXPECTATION_SECONDS = 60.0  # how long a write of ours may take to come back through the watch
RULE_TRUST_SECONDS = 300.0  # how long what this process knows of a record's DeviceTaintRule is trusted

class Quarantine:
    """The quarantine claim of each marked device in claimwarden's namespace, and each record's DeviceTaintRule.

    A device has one quarantine claim, whichever and however many records mark it ("one claim per device"
    in health/__init__.py): its claims carry the device's label (``plan.device_label``) and are found by it,
    and by their allocation, so that the claims an older version made per record join them.
    """

    def __init__(self, *, cache: Cache, kube: Kube, namespace: str) -> None:
        self.cache = cache
        self.kube = kube
        self.namespace = namespace
        self._taint_rule_version: str | None = None
        self._taint_rule_checked = False
        # What this process wrote that the watch may not have brought back yet: claims it deleted (uid ->
        # when) and the claim it last created and allocated per device label. Without them a reconcile right
        # after a re-assertion saw the old claim and the new one, took that for a crash mid-reassert and
        # replaced the new claim again (a churn of quarantine claims under watch lag).
        self._deleted: dict[str, float] = {}
        self._created: dict[str, Body] = {}
        # record -> (whether its DeviceTaintRule exists, when that was last known).
        self._rules: dict[str, tuple[bool, float]] = {}

    def claims_of(self, ref: DeviceRef, record_names: Iterable[str] = ()) -> list[Body]:
        """The device's quarantine claims, oldest name first: those with its label, those allocated the device,
        and (claims of an older version, one per record) those labelled for one of `record_names` that hold
        the device or nothing."""
        moment = time.monotonic()
        self._deleted = {uid: at for uid, at in self._deleted.items() if moment - at < EXPECTATION_SECONDS}
        label = plan.device_label(ref)
        found: dict[str, Body] = {}
        for claim in self.cache.claims_for_record(self.namespace, label):
            found[str(claim["metadata"].get("uid"))] = claim
        for name in record_names:
            for claim in self.cache.claims_for_record(self.namespace, records.label_value(name)):
                if not is_allocated(claim) or plan.holds_device(claim, ref):
                    found[str(claim["metadata"].get("uid"))] = claim
        for claim in self.cache.claims_holding((ref.driver, ref.pool, ref.device)):
            if plan.is_quarantine_claim(claim, self.namespace):
                found[str(claim["metadata"].get("uid"))] = claim
        claims = [c for uid, c in found.items() if uid not in self._deleted]
        created = self._created.get(label)
        if created is not None:
            uid = created["metadata"].get("uid")
            same = [c for c in claims if c["metadata"].get("uid") == uid]
            if uid in self._deleted or (same and _version(same[0]) >= _version(created)):
                del self._created[label]  # the cache has caught up (or it is gone again)
            else:  # not in the cache yet, or only as created, before its allocation
                claims = [c for c in claims if c["metadata"].get("uid") != uid] + [created]
        return sorted(claims, key=lambda c: str(c["metadata"].get("name")))

    def claims_labelled(self, label: str) -> list[Body]:
        """The quarantine claims carrying `label` (a device's, or a record's from an older version)."""
        return [c for c in self.cache.claims_for_record(self.namespace, label)
                if str(c["metadata"].get("uid")) not in self._deleted]

    def device_labelled(self, label: str) -> DeviceRef | None:
        """The device the quarantine claims carrying `label` are allocated; None without such allocated claims
        (what a record gone while this process did not know it leaves to go by; an unallocated claim protects
        nothing and is released by its label)."""
        for claim in self.claims_labelled(label):
            for device in allocated_devices(claim):
                return DeviceRef(*device)
        return None

    async def sync(self, ref: DeviceRef, *, needed: bool, held: bool, released: bool,
                   record_names: Iterable[str] = ()) -> list[str]:
        """Keep the device held by exactly one allocated quarantine claim once nothing else holds it; return
        the names of its quarantine claims. The caller holds the device's lock (one sync per device at a time).

        `needed`: a record of the device quarantines it. `held`: other claims hold the device. While they do,
        the scheduler counts it as allocated anyway, and a quarantine claim made now would protect nothing
        (rule 1): it is made when they let go. `released`: another holder let go of the device since the
        quarantine was last asserted, so the scheduler has forgotten it (rule 1): replace the claim by a new
        one. `record_names`: the device's records, whose claims from an older version (one per record) join
        the device's.
        """
        existing = self.claims_of(ref, record_names)
        step = plan.quarantine_step(needed=needed, claims=len(existing), held=held, released=released)
        if step == plan.QuarantineStep.RELEASE:
            await self.release(existing)
            return []
        if step == plan.QuarantineStep.WAIT:
            return []
        if step == plan.QuarantineStep.KEEP:
            if not is_allocated(existing[0]):  # a crash between creating and allocating it
                await self._allocate(existing[0], ref)
            return [existing[0]["metadata"]["name"]]
        # Several claims (a crash mid-reassert, or one per record from an older version) count as a reassert
        # too: deleting any of them makes the scheduler forget the device.
        for claim in existing:
            await self._delete(claim)
        node = plan.slice_node(self.cache.resource_slices_of_pool(ref.driver, ref.pool), ref)
        body = plan.quarantine_claim_body(ref, self.namespace, node)
        try:
            created = await self.kube.create_claim(self.namespace, body)
        except ApiError as exc:
            if not exc.not_found:  # the namespace is missing (e.g. a local run): create it once
                raise
            await self.kube.create_namespace(self.namespace)
            created = await self.kube.create_claim(self.namespace, body)
        self._created[plan.device_label(ref)] = await self._allocate(created, ref, node)
        log.info("device %s quarantined by claim %s/%s", ref, self.namespace, created["metadata"]["name"])
        return [created["metadata"]["name"]]

    async def release(self, claims: list[Body]) -> None:
        """Free the device (rule 3): delete all quarantine claims, deallocating the last one first."""
        for position, claim in enumerate(claims):
            meta = claim["metadata"]
            if position == len(claims) - 1 and is_allocated(claim):
                try:
                    await self.kube.patch_claim_status(self.namespace, meta["name"], [
                        {"op": "remove", "path": "/status/allocation"}])
                except ApiError as exc:
                    if not exc.not_found:
                        raise
            await self._delete(claim)
            log.info("quarantine claim %s/%s released", self.namespace, meta["name"])

    async def _delete(self, claim: Body) -> None:
        await self.kube.delete_claim(self.namespace, claim["metadata"]["name"], claim["metadata"]["uid"])
        self._deleted[claim["metadata"]["uid"]] = time.monotonic()

    async def release_orphans(self) -> None:
        """Quarantine claims of devices no record marks any more (their records deleted while claimwarden was
        down).

        Decided on a live list of the records, not the index: this runs beside the watches and
        must never free a device because an index was not filled yet. A claim is kept while any record
        names its label (a record's, from an older version, or the device's) or marks the device it holds.
        """
        candidates = self.cache.claims_labelled_for_record(self.namespace)
        if not candidates:
            return
        listing = await self.kube.list_cluster_objects(records.API_VERSION, records.PLURAL)
        live = {records.label_value(r["metadata"]["name"]) for r in listing}
        marked = {ref for r in listing if (ref := records.record_ref(r)) is not None}
        live |= {plan.device_label(ref) for ref in marked}
        for label, claims in sorted(candidates.items()):
            held = {DeviceRef(*device) for claim in claims for device in allocated_devices(claim)}
            if label in live or held & marked:
                continue
            await self.release(claims)

    async def _allocate(self, claim: Body, ref: DeviceRef, node: str | None = None) -> Body:
        node = node or plan.slice_node(self.cache.resource_slices_of_pool(ref.driver, ref.pool), ref)
        return await self.kube.patch_claim_status(self.namespace, claim["metadata"]["name"], [
            {"op": "test", "path": "/metadata/resourceVersion", "value": claim["metadata"]["resourceVersion"]},
            {"op": "add", "path": "/status", "value": {"allocation": plan.quarantine_allocation(ref, node)}}])

    async def sync_taint_rule(self, record: Body, *, needed: bool, defer: bool = False) -> str:
        """Where DeviceTaintRule is served, keep a NoSchedule rule in step with the record; return its name
        ("" while there is none).

        `defer`: the record's pods are being evicted now, and the claims they hold keep the device from
        new work meanwhile: the rule comes after the evictions rather than competing with them. What this
        process wrote or read of a rule is trusted for RULE_TRUST_SECONDS (no read per reconcile).
        """
        version = await self.taint_rule_api()
        if not version:
            return ""
        try:
            return await self._sync_taint_rule(version, record, needed=needed, defer=defer)
        except NotServed:
            self.taint_rule_api_gone(version)
            raise

    async def _sync_taint_rule(self, version: str, record: Body, *, needed: bool, defer: bool) -> str:
        api = f"resource.k8s.io/{version}"
        record_name = record["metadata"]["name"]
        rule_name = plan.device_taint_rule_name(record)
        known = self._known_rule(record_name)
        if not needed:
            if known is None:
                known = await self.kube.get_cluster_object(api, "devicetaintrules", rule_name) is not None
            if known:
                await self.kube.delete_cluster_object(api, "devicetaintrules", rule_name)
            self._rules[record_name] = (False, time.monotonic())
            return ""
        if known:
            return rule_name
        if defer:
            return ""
        body: dict[str, Any] = plan.device_taint_rule_body(record, api)
        body["metadata"]["ownerReferences"] = [{
            "apiVersion": records.API_VERSION, "kind": records.KIND, "name": record_name,
            "uid": record["metadata"]["uid"], "controller": True, "blockOwnerDeletion": False}]
        try:
            await self.kube.create_cluster_object(api, "devicetaintrules", body)
        except ApiError as exc:
            if not exc.conflict:
                raise
            # It exists: made before a restart, or by an earlier record of this name (re-created while a
            # watch was down), whose rule the garbage collector is about to delete. That one is replaced.
            existing = await self.kube.get_cluster_object(api, "devicetaintrules", rule_name)
            owners = [ref.get("uid") for ref in ((existing or {}).get("metadata") or {}).get("ownerReferences") or []]
            if record["metadata"]["uid"] not in owners:
                if existing is not None:
                    await self.kube.delete_cluster_object(api, "devicetaintrules", rule_name)
                await self.kube.create_cluster_object(api, "devicetaintrules", body)
        self._rules[record_name] = (True, time.monotonic())
        return rule_name

    def _known_rule(self, record_name: str) -> bool | None:
        """Whether the record's rule exists, as last written or read within RULE_TRUST_SECONDS; else None."""
        known = self._rules.get(record_name)
        if known is None or time.monotonic() - known[1] > RULE_TRUST_SECONDS:
            return None
        return known[0]

    async def drop_taint_rule(self, record_name: str) -> None:
        """The record is gone: delete its rule now. Its ownerReference would have the garbage collector do
        it, but only once the collector watches the records' CRD (it finds new CRDs every 30 s)."""
        self._rules.pop(record_name, None)
        version = await self.taint_rule_api()
        if not version:
            return
        try:
            deleted = await self.kube.delete_cluster_object(
                f"resource.k8s.io/{version}", "devicetaintrules",
                plan.device_taint_rule_name({"metadata": {"name": record_name}}))
        except NotServed:
            self.taint_rule_api_gone(version)
            raise
        if deleted:
            log.info("DeviceTaintRule of record %s deleted", record_name)

    def taint_rules_served(self) -> bool:
        """True once the served DeviceTaintRule version was found (False before it was asked, or where none is)."""
        return self._taint_rule_checked and bool(self._taint_rule_version)

    def taint_rule_api_gone(self, version: str) -> None:
        """The server stopped serving DeviceTaintRule at `version` (an upgrade): nothing is known of the
        rules any more, and the served version is asked again on the next call (the caller retries)."""
        if not self._taint_rule_checked or self._taint_rule_version != version:
            return  # already looked up again
        log.warning("DeviceTaintRule is no longer served as resource.k8s.io/%s; looking for the served version",
                    version)
        self._taint_rule_checked = False
        self._rules.clear()

    async def taint_rule_api(self) -> str | None:
        """The served version of DeviceTaintRule (asked once), or None."""
        if not self._taint_rule_checked:
            self._taint_rule_version = await self.kube.served_version("resource.k8s.io", "devicetaintrules",
                                                                      TAINT_RULE_VERSIONS)
            self._taint_rule_checked = True
            if self._taint_rule_version:
                log.info("DeviceTaintRule served as resource.k8s.io/%s: unhealthy devices also get a NoSchedule "
                         "rule", self._taint_rule_version)
        return self._taint_rule_version


def _version(claim: Body) -> int:
    version = str(claim["metadata"].get("resourceVersion") or "")
    return int(version) if version.isdigit() else 0
