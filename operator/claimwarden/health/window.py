"""The breaker's window kept in the records, written ahead of each eviction. Pure: no I/O.

The breaker (breaker.py) counts a driver's evictions of the last `window` from each record's
``status.recentEvictions`` ({pod, at}). Kept only in memory and written with the record's other
status later, a crash, a lost lease or a failover between an eviction and that write let the next
leader allow another full limit (issue 20, finding 3). So, while the breaker is on, an eviction's
entry (and ``podsEvicted``) is stored **before** the Eviction call, in a status patch of its own
guarded by the record's resourceVersion (ahead.py), apart from the quarantine and the DeviceTaintRule.

Before, not right after: before never under-counts. Any eviction that reached the apiserver is in
the record, whatever happens to the process. It may over-count: an entry whose Eviction call then
fails (a PodDisruptionBudget refuses, the pod is gone) stays, and the breaker counts that pod from
its first attempt. A retry of the same pod within the window needs no new room and no new write
(``counted``). Right after would lose, at a SIGKILL, every eviction whose write was still on its
way (up to the whole limit in a burst), and the next leader would allow that many again: the
overshoot the breaker exists to prevent. The price of before is one round trip before a record's
first eviction of a burst, and one write per attempt refused by a PodDisruptionBudget once the
pod's entry has left the window.

Only while the breaker is on (``Settings.enabled``): with it off nothing reads the window, and the
counts keep their paced write with the rest of the status (counts.py), the cheaper path.

Merging: a write never drops an entry the record holds. The new list is the union by (pod, at)
of what the record holds at the resourceVersion the write is guarded by and the entries added,
trimmed to the window (and to RECENT_MAX). ``podsEvicted`` is the record's count plus the entries
that were new to it, so it never goes backwards. A new leader starts from one live LIST of the records
(``seed``), not from its watch cache, which may not yet hold the old leader's last writes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta
from typing import Any

from .breaker import Recent, format_recent, in_window, parse_recent


def entry(pod: str, moment: datetime) -> Recent:
    """An eviction's entry as the record will hold it (status times have whole seconds), so that an entry
    read back equals the one kept in memory."""
    return Recent(pod, moment.replace(microsecond=0))


def union(*sources: Iterable[Recent]) -> list[Recent]:
    """Every entry of the sources once (by pod and time), oldest first."""
    return sorted(set().union(*sources), key=lambda r: (r.at, r.pod))


def ahead_status(held: Mapping[str, Any], adding: Iterable[Recent], now: datetime,
                 window: timedelta) -> dict[str, Any]:
    """The status patch that adds `adding` to what the record holds (`held`: its status at the
    resourceVersion the patch is guarded by): podsEvicted and recentEvictions."""
    kept = parse_recent(held)
    new = set(adding) - set(kept)
    return {"podsEvicted": pods_evicted(held) + len(new),
            "recentEvictions": format_recent(union(kept, new), now, window)}


def pods_evicted(status: Mapping[str, Any]) -> int:
    try:
        return max(int(status.get("podsEvicted") or 0), 0)
    except (TypeError, ValueError):
        return 0


def counted(recent: Iterable[Recent], pod: str, now: datetime, window: timedelta) -> bool:
    """True when the pod has an entry in the window: an earlier attempt counts it already."""
    return any(r.pod == pod for r in in_window(recent, now, window))


def seed(listed: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """name -> status (podsEvicted and recentEvictions only) of every record in a live LIST."""
    found: dict[str, dict[str, Any]] = {}
    for record in listed:
        name = (record.get("metadata") or {}).get("name")
        if name:
            status = record.get("status") or {}
            found[str(name)] = {"podsEvicted": pods_evicted(status),
                                "recentEvictions": status.get("recentEvictions") or []}
    return found


def start(live: Mapping[str, Any] | None, cached: Mapping[str, Any]) -> tuple[int, list[Recent]]:
    """What a record's counts start from in this process: the live LIST's and the cache's (which may be newer
    for a record changed since the LIST) together. podsEvicted: the higher; the window: both."""
    sources = [cached] if live is None else [live, cached]
    return (max(pods_evicted(s) for s in sources), union(*(parse_recent(s) for s in sources)))
