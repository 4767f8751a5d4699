"""The device's one quarantine claim, synced by whichever of its records asks, one sync at a time.

Rule 1 of the quarantine trap (health/__init__.py) is the device's, not a record's: the holders seen at
the device's last sync decide whether one let go since, so that of two records seeing the same release
only the first replaces the claim. So each device has a memory (``DeviceMemory``, seeded from its
records' status.deviceHolders after a restart) and a lock; a record gone leaves the claim to the
device's other records, or releases it once a live read confirms the record is gone.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from ..cache import Body, Cache
from ..kube.api import Kube
from . import plan, records
from .quarantine import Quarantine
from .records import DeviceRef

log = logging.getLogger("claimwarden.health")

QUARANTINE_EFFECTS = ("NoExecute", "NoSchedule")


@dataclass
class DeviceMemory:
    """What is known of a device between syncs of its quarantine, seeded from its records' status after a restart."""

    holders: set[str] = field(default_factory=set)
    """The other claims allocated the device when its quarantine was last synced."""
    exclusive: set[str] | None = None
    """Those of them that kube-scheduler counted as allocating it (None after a restart: the status does
    not say, and all holders count then)."""
    planned: float = float("-inf")
    """When (monotonic) the plan the device's last quarantine sync used was made."""


class DeviceSync:
    """Each device's quarantine memory and lock."""

    def __init__(self, *, cache: Cache, kube: Kube, quarantine: Quarantine,
                 look_again: Callable[[str], None]) -> None:
        """`look_again(record)`: queue the record's reconcile."""
        self.cache = cache
        self.kube = kube
        self.quarantine = quarantine
        self._look_again = look_again
        self._memory: dict[DeviceRef, DeviceMemory] = {}
        self._locks: dict[DeviceRef, asyncio.Lock] = {}

    def records_for(self, ref: DeviceRef) -> list[Body]:
        """Records about the device, whatever their names (admins may name their own)."""
        return self.cache.records_marking((ref.driver, ref.pool, ref.device))

    async def sync(self, record: Body, ref: DeviceRef, record_plan: plan.RecordPlan, planned: float) -> list[str]:
        """Sync the device's one quarantine claim (whichever of its records asks); return its names for the
        record's status ([] for a record whose effect does not quarantine).

        A plan made (`planned`, monotonic) before the one the device's last sync used is stale: another record
        saw the holders later, and this one's older view would put back a holder gone since and replace the
        claim again for nothing. The record is looked at again instead.
        """
        siblings = self.records_for(ref)
        quarantining = [r for r in siblings if records.record_effect(r) in QUARANTINE_EFFECTS]
        if not record_plan.quarantine_needed and quarantining:
            return []  # another record of the device keeps it from new work
        names = sorted({record["metadata"]["name"], *(r["metadata"]["name"] for r in siblings)})
        async with self._locks.setdefault(ref, asyncio.Lock()):
            device = self._memory_of(ref, siblings)
            if planned < device.planned:
                self._look_again(record["metadata"]["name"])
                return list((record.get("status") or {}).get("quarantineClaims") or [])
            device.planned = planned
            # Only a claim that kept the device allocated in kube-scheduler's eyes makes the quarantine claim be
            # asserted again when it goes: an admin-access holder (a diagnostics pod) was never counted.
            exclusive = set(record_plan.exclusive_holders)
            released = (device.exclusive if device.exclusive is not None else device.holders) - exclusive
            quarantine = await self.quarantine.sync(ref, needed=record_plan.quarantine_needed,
                                                    held=bool(exclusive), released=bool(released),
                                                    record_names=names)
            device.holders, device.exclusive = set(record_plan.holders), exclusive
        return quarantine

    async def record_gone(self, name: str, ref: DeviceRef | None) -> None:
        """The record is gone. Its device's quarantine claim stays while another record marks the device
        (that one keeps it: releasing it would make the scheduler forget the device, the trap in
        health/__init__.py); else it is released, once a live read confirms the record is gone."""
        siblings = self.records_for(ref) if ref is not None else []
        if ref is not None and not siblings:
            self._memory.pop(ref, None)  # (its lock stays: a record of the device may be syncing now)
        # Freeing a device is destructive: confirm the record is really gone first.
        if await self.kube.get_cluster_object(records.API_VERSION, records.PLURAL, name) is not None:
            return
        if siblings:
            for sibling in siblings:
                self._look_again(sibling["metadata"]["name"])
            log.info("record %s is gone; %s still mark%s device %s, which stays quarantined", name,
                     ", ".join(r["metadata"]["name"] for r in siblings), "s" if len(siblings) == 1 else "", ref)
        elif ref is None:
            # A record this process never synced (gone before its first reconcile here): which device it
            # marked is not known, so every quarantine claim no live record accounts for is released now,
            # rather than at the next resync.
            await self.quarantine.release_orphans()
        else:
            claims = self.quarantine.claims_of(ref, [name])
            if claims:
                await self.quarantine.release(claims)
        await self.quarantine.drop_taint_rule(name)

    def _memory_of(self, ref: DeviceRef, siblings: list[Body]) -> DeviceMemory:
        """The device's memory; after a restart it starts from its records' status.deviceHolders (rule 1 across
        restarts)."""
        if ref not in self._memory:
            holders: set[str] = set()
            for sibling in siblings:
                holders.update((sibling.get("status") or {}).get("deviceHolders") or [])
            self._memory[ref] = DeviceMemory(holders=holders)
        return self._memory[ref]
