"""Device tolerations and eviction times, with upstream's rules for NoExecute device taints.

Tolerations are the copies the scheduler made at allocation time, in
`status.allocation.devices.results[].tolerations`, as upstream's eviction controller reads them;
the claim's spec is read only on servers that never make those copies (see `result_tolerations`).
Taints and tolerations are plain dicts (`{"key", "value", "effect"}` and `{"key", "operator",
"value", "effect", "tolerationSeconds"}`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta
from typing import Any

from claimwarden.health.records import DeviceRef
from claimwarden.objects.meta import status

NO_EXECUTE = "NoExecute"
OPERATOR_EXISTS = "Exists"
OPERATOR_EQUAL = "Equal"


def tolerates(toleration: dict[str, Any], taint: dict[str, Any]) -> bool:
    """True when the toleration tolerates the taint (for scheduling: an empty effect matches all).

    The keys must be equal, unless the toleration's key is empty and its operator is Exists (that
    tolerates every key). Exists matches any value; Equal (the default) needs equal values. An
    unknown operator tolerates nothing.
    """
    effect = toleration.get("effect") or ""
    if effect and effect != (taint.get("effect") or ""):
        return False
    operator = toleration.get("operator") or OPERATOR_EQUAL
    key = toleration.get("key") or ""
    if key != (taint.get("key") or "") and not (key == "" and operator == OPERATOR_EXISTS):
        return False
    if operator == OPERATOR_EXISTS:
        return True
    if operator == OPERATOR_EQUAL:
        return (toleration.get("value") or "") == (taint.get("value") or "")
    return False


def toleration_seconds(toleration: dict[str, Any]) -> int | None:
    """The toleration's tolerationSeconds (negative counts as 0), or None when unset (forever)."""
    seconds = toleration.get("tolerationSeconds")
    if seconds is None:
        return None
    return max(0, int(seconds))


def protects_from_eviction(toleration: dict[str, Any], taint: dict[str, Any]) -> bool:
    """True when the toleration counts against a NoExecute taint: effect exactly NoExecute and tolerating it.

    An empty-effect toleration tolerates the taint for scheduling but does not delay eviction.
    """
    return toleration.get("effect") == NO_EXECUTE and tolerates(toleration, taint)


def eviction_time(taint: dict[str, Any], tolerations: Sequence[dict[str, Any]],
                  time_added: datetime) -> datetime | None:
    """When a device's taint evicts its user, or None when it never does.

    Only NoExecute taints evict. Without a protecting toleration that is `time_added`; with one
    that has no tolerationSeconds, never; otherwise `time_added` plus the smallest tolerationSeconds.
    """
    if taint.get("effect") != NO_EXECUTE:
        return None
    protecting = [t for t in tolerations if protects_from_eviction(t, taint)]
    if not protecting:
        return time_added
    seconds = [toleration_seconds(t) for t in protecting]
    if any(s is None for s in seconds):
        return None
    return time_added + timedelta(seconds=min(s for s in seconds if s is not None))


def names_device(result: dict[str, Any], ref: DeviceRef) -> bool:
    """True when an allocation result is for this device."""
    return (result.get("driver"), result.get("pool"), result.get("device")) == (ref.driver, ref.pool, ref.device)


def allocation_results(claim: dict[str, Any]) -> list[dict[str, Any]]:
    """The claim's status.allocation.devices.results (empty when not allocated)."""
    allocation = status(claim).get("allocation") or {}
    return list((allocation.get("devices") or {}).get("results") or [])


def copies_tolerations(claims: Iterable[dict[str, Any]]) -> bool:
    """True when some allocation result carries tolerations: proof that this server's allocator copies them.

    Only an allocator that copies writes `results[].tolerations` (the field is in the schema of
    every version from 1.34 on, so the served schema cannot tell; 1.34's allocator and 1.35's
    stable one never fill it, 1.35 with DRADeviceTaints on and 1.36+ always do).
    """
    return any(result.get("tolerations") for claim in claims for result in allocation_results(claim))


def result_tolerations(claim: dict[str, Any], result: dict[str, Any], *, server_copies: bool) -> list[dict[str, Any]]:
    """The tolerations that apply to one allocation result.

    The rule, decided by what the server does rather than by its version:
    - a result that carries tolerations: exactly those (the allocator copied them; upstream's
      eviction controller reads nothing else);
    - a result without, on a server that copies (`server_copies`, see `copies_tolerations`): none.
      The allocator copies every toleration of the request, so the request had none or the claim
      was allocated elsewhere (another allocator, or before an upgrade), and upstream would not
      honour the request's tolerations either;
    - a result without, on a server not known to copy (1.34): the tolerations of the request in
      the claim spec (`<request>` or `<request>/<subrequest>`), which that allocator honoured for
      scheduling but never copied.
    """
    if result.get("tolerations"):
        return list(result["tolerations"])
    if server_copies:
        return []
    request, _, subrequest = str(result.get("request") or "").partition("/")
    for entry in ((claim.get("spec") or {}).get("devices") or {}).get("requests") or []:
        if entry.get("name") != request:
            continue
        if not subrequest:
            return list((entry.get("exactly") or {}).get("tolerations") or [])
        for sub in entry.get("firstAvailable") or []:
            if sub.get("name") == subrequest:
                return list(sub.get("tolerations") or [])
    return []


def claim_eviction_time(claim: dict[str, Any], ref: DeviceRef, taint: dict[str, Any],
                        time_added: datetime, *, server_copies: bool = False) -> datetime | None:
    """The earliest eviction time over the claim's allocation results for this device.

    Each result is judged with its own tolerations (`result_tolerations`). None when no result
    names the device or every one that does tolerates the taint forever.
    """
    times = [
        evict_at
        for result in allocation_results(claim)
        if names_device(result, ref)
        and (evict_at := eviction_time(taint, result_tolerations(claim, result, server_copies=server_copies),
                                             time_added)) is not None
    ]
    return min(times, default=None)
