"""Which claims held each record's device: a claim that lets go wakes the records whose device it held.

A record's reconcile sees the claims holding its device (its plan's holders). They are kept here both
ways, claim -> records and record -> claims, so that a claim event (its release, its deletion) queues
exactly the records it concerns, and a record gone drops its links. ``seen`` is what the record's last
reconcile saw, seeded from status.deviceHolders after a restart.
"""

from __future__ import annotations

from ..cache import Body

ClaimKey = tuple[str, str]  # (namespace, name)


class HolderIndex:
    """claim -> records whose device it held, and the same from the record's side."""

    def __init__(self) -> None:
        self._seen: dict[str, set[str]] = {}  # record -> the holders ("namespace/name") its last reconcile saw
        self._claim_records: dict[ClaimKey, set[str]] = {}
        self._record_claims: dict[str, set[ClaimKey]] = {}

    def records_of(self, key: ClaimKey) -> set[str]:
        """The records whose device the claim holds or held (a copy)."""
        return set(self._claim_records.get(key, set()))

    def seen(self, record: Body) -> set[str]:
        """The holders the record's last reconcile saw; after a restart its status.deviceHolders."""
        name = record["metadata"]["name"]
        if name not in self._seen:
            self._seen[name] = set((record.get("status") or {}).get("deviceHolders") or [])
        return self._seen[name]

    def link(self, record_name: str, holders: set[str], before: set[str]) -> None:
        """The record's device is held by `holders` now, by `before` at its last reconcile."""
        claims = self._record_claims.setdefault(record_name, set())
        for holder in holders:
            namespace, claim = holder.split("/", 1)
            self._claim_records.setdefault((namespace, claim), set()).add(record_name)
            claims.add((namespace, claim))
        for holder in before - holders:
            namespace, claim = holder.split("/", 1)
            self._unlink((namespace, claim), record_name)

    def remember(self, record_name: str, holders: set[str]) -> None:
        """What the record's reconcile saw, once its device's quarantine is synced on it."""
        self._seen[record_name] = holders

    def forget(self, record_name: str) -> None:
        self._seen.pop(record_name, None)
        for key in list(self._record_claims.get(record_name, ())):
            self._unlink(key, record_name)

    def _unlink(self, key: ClaimKey, record_name: str) -> None:
        names = self._claim_records.get(key, set())
        names.discard(record_name)
        if not names:
            self._claim_records.pop(key, None)
        claims = self._record_claims.get(record_name, set())
        claims.discard(key)
        if not claims:
            self._record_claims.pop(record_name, None)
