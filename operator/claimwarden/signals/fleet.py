"""The fleet view: which devices saw which Unhealthy signal, and when they last saw it (workload faults).

A rule with ``workloadFault`` asks how many different devices saw the same (source, signal, value)
within its window (``fires.Fleet``); at ``devices`` or more it is the workload's fault, not the
hardware's. Scanning every record's observations for each decision was quadratic at 10,000 devices,
so the view is kept by signal: each reconcile replaces its device's entries with the Unhealthy
observations its record holds, and the view is seeded once from the records in the cache (after a
restart, the devices not reconciled yet still count).
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

from ..cache import Body
from ..health import records
from ..health.records import DeviceRef
from . import records as signal_records
from .observations import UNHEALTHY, Observation

Signal = tuple[str, str, str]
"""(source, signal, value)."""


class FleetView:
    """Device -> its newest Unhealthy observation, by signal; kept in memory by the signals' reconciles."""

    def __init__(self) -> None:
        self._devices_by_signal: dict[Signal, dict[DeviceRef, datetime]] = {}
        self._signals_by_device: dict[DeviceRef, set[Signal]] = {}
        self.seeded = False

    def seed(self, signal_records_in_cache: Iterable[Body]) -> None:
        """The Unhealthy observations of every signal record (once: the reconciles keep the view then)."""
        self.seeded = True
        for record in signal_records_in_cache:
            if signal_records.is_signal_record(record) and (ref := records.record_ref(record)) is not None:
                self.replace(ref, [o for o in signal_records.record_observations(record) if o.state == UNHEALTHY])

    def replace(self, ref: DeviceRef, faults: Iterable[Observation]) -> None:
        """The device's Unhealthy observations in the view, in place of what it had there."""
        newest: dict[Signal, datetime] = {}
        for o in faults:
            signal = (o.source, o.signal, o.value)
            newest[signal] = max(o.at, newest.get(signal, o.at))
        for signal in self._signals_by_device.pop(ref, set()) - set(newest):
            devices = self._devices_by_signal.get(signal, {})
            devices.pop(ref, None)
            if not devices:
                self._devices_by_signal.pop(signal, None)
        for signal, at in newest.items():
            self._devices_by_signal.setdefault(signal, {})[ref] = at
        if newest:
            self._signals_by_device[ref] = set(newest)

    def count(self, source: str, signal: str, value: str, since: datetime) -> int:
        """How many devices saw (source, signal, value) at or after `since`: a ``fires.Fleet``."""
        return sum(1 for at in self._devices_by_signal.get((source, signal, value), {}).values() if at >= since)

    def devices(self, source: str, signal: str) -> list[DeviceRef]:
        """The devices that saw the signal, whatever its value."""
        return sorted({ref for (s, g, _), devices in self._devices_by_signal.items() if (s, g) == (source, signal)
                       for ref in devices}, key=str)
