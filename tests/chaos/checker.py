"""The chaos suite's invariants: read the cluster and the apiserver's audit log, count violations.

Every count must be 0 after each scenario. Pure functions over plain objects and audit events,
plus `read` that fetches them from a lab.
"""

from __future__ import annotations

import datetime
import re
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from claimwarden.objects.claims import (
    POD_CLAIM_NAME_ANNOTATION,
    allocated_devices,
    controlling_pod_uid,
    is_allocated,
    is_pod_reservation,
)
from claimwarden.objects.pods import TERMINAL_PHASES, claim_statuses
from tests.integration.auditor import CLAIMWARDEN_USER, repeated_evictions, shared_devices

Object = dict[str, Any]
OWN_NAMESPACE = "claimwarden-system"
RECORD_LABEL = "claimwarden.io/record"

INVARIANTS = (
    "pod claims without exactly one generated claim",
    "orphaned generated claims",
    "reservations of gone or finished pods",
    "devices leaked (allocated, reserved for nobody)",
    "devices in two claims",
    "pods on NoExecute devices not evicted exactly once",
    "pods removed by claimwarden without the Eviction API",
    "quarantine claims beyond one per device",
    "writes by a replica that did not hold the lease",
    "writes by a replica after another replica's first write as leader",
    "evictions beyond the breaker's room within its window",
    "quarantine released while a record of its device remains",
)
QUARANTINE_EFFECTS = ("NoExecute", "NoSchedule")
WRITES = ("create", "update", "patch", "delete")


@dataclass
class Cluster:
    pods: list[Object]
    claims: list[Object]
    records: list[Object]
    events: list[Object] = field(default_factory=list)
    """The audit log's events of the scenario."""


@dataclass(frozen=True)
class Breaker:
    """The breaker the replicas run with, for the invariant that its room is never exceeded."""

    limit: int
    """Evictions allowed per driver within `window` (the scenario's --breaker-max-pods)."""
    window: float
    drivers: Mapping[tuple[str, str], str] = field(default_factory=dict)
    """(namespace, pod) -> the driver of the device it was evicted from; other pods count as one driver."""


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return obj.get("metadata") or {}


def _key(obj: Mapping[str, Any]) -> tuple[str, str]:
    return str(_meta(obj).get("namespace") or ""), str(_meta(obj).get("name") or "")


def _is_quarantine(claim: Mapping[str, Any]) -> bool:
    return _meta(claim).get("namespace") == OWN_NAMESPACE and RECORD_LABEL in (_meta(claim).get("labels") or {})


def _generated(claim: Mapping[str, Any]) -> bool:
    annotations = _meta(claim).get("annotations") or {}
    return bool(annotations.get(POD_CLAIM_NAME_ANNOTATION)) and controlling_pod_uid(dict(claim)) is not None


def claims_per_pod_claim(pods: Iterable[Object], claims: Iterable[Object]) -> list[str]:
    """Live, unfinished pods whose template pod claims do not have exactly one generated claim."""
    by_owner: Counter[tuple[str, str, str]] = Counter()
    for claim in claims:
        if _generated(claim) and not _meta(claim).get("deletionTimestamp"):
            namespace = str(_meta(claim).get("namespace") or "")
            pod_claim = (_meta(claim).get("annotations") or {})[POD_CLAIM_NAME_ANNOTATION]
            by_owner[(namespace, str(controlling_pod_uid(dict(claim))), pod_claim)] += 1
    found = []
    for pod in pods:
        if (pod.get("status") or {}).get("phase") in TERMINAL_PHASES or _meta(pod).get("deletionTimestamp"):
            continue
        namespace, uid = str(_meta(pod).get("namespace")), str(_meta(pod).get("uid"))
        recorded = claim_statuses(pod)
        for entry in (pod.get("spec") or {}).get("resourceClaims") or []:
            if not entry.get("resourceClaimTemplateName"):
                continue
            count = by_owner[(namespace, uid, entry["name"])]
            if count != 1 or not (recorded.get(entry["name"]) or {}).get("resourceClaimName"):
                found.append(f"{namespace}/{_meta(pod).get('name')}:{entry['name']} has {count} claims")
    return found


def orphans(pods: Iterable[Object], claims: Iterable[Object]) -> list[str]:
    """Generated claims whose pod is gone."""
    live = {(str(_meta(p).get("namespace")), str(_meta(p).get("uid"))) for p in pods}
    return [f"{ns}/{name}" for claim in claims if _generated(claim)
            and (str(_meta(claim).get("namespace")), str(controlling_pod_uid(dict(claim)))) not in live
            for ns, name in [_key(claim)]]


def stale_reservations(pods: Iterable[Object], claims: Iterable[Object]) -> list[str]:
    by_key = {_key(p): p for p in pods}
    found = []
    for claim in claims:
        namespace = str(_meta(claim).get("namespace") or "")
        for entry in (claim.get("status") or {}).get("reservedFor") or []:
            if not is_pod_reservation(entry):
                continue
            pod = by_key.get((namespace, str(entry.get("name"))))
            if pod is None or _meta(pod).get("uid") != entry.get("uid") or \
                    (pod.get("status") or {}).get("phase") in TERMINAL_PHASES:
                found.append(f"{namespace}/{_meta(claim).get('name')} -> {entry.get('name')}")
    return found


def leaked(claims: Iterable[Object], records: Iterable[Object]) -> list[str]:
    """Generated claims allocated and reserved for nobody, and quarantine claims of devices no record marks.

    A generated claim on a marked device may keep its allocation until the mark is cleared (rule 4 of the
    quarantine trap, 1.37+ without DeviceTaintRule)."""
    records = list(records)
    live = {_label(str(_meta(r).get("name"))) for r in records} | {_device_label(r) for r in records}
    marked = {tuple(str((r.get("spec") or {}).get(k) or "") for k in ("driver", "pool", "device")) for r in records}
    found = []
    for claim in claims:
        if not is_allocated(claim) or (claim.get("status") or {}).get("reservedFor"):
            continue
        if _is_quarantine(claim):
            if (_meta(claim).get("labels") or {}).get(RECORD_LABEL) not in live:
                found.append(f"quarantine {_meta(claim).get('name')} without its record")
        elif _generated(claim) and not set(allocated_devices(claim)) & marked:
            found.append("/".join(_key(claim)))
    return found


def _label(name: str) -> str:
    from claimwarden.health.records import label_value

    return label_value(name)


def _device_label(record: Object) -> str:
    from claimwarden.health.plan import device_label
    from claimwarden.health.records import DeviceRef

    spec = record.get("spec") or {}
    return device_label(DeviceRef(str(spec.get("driver") or ""), str(spec.get("pool") or ""),
                                  str(spec.get("device") or "")))


def quarantine_beyond_bound(claims: Iterable[Object]) -> list[str]:
    """More than one quarantine claim per label: one per device (the label of the device), whichever records
    mark it."""
    counts = Counter((_meta(c).get("labels") or {}).get(RECORD_LABEL) for c in claims if _is_quarantine(c))
    return [f"device {label}: {n} quarantine claims" for label, n in counts.items() if n > 1]


def eviction_counts(events: Iterable[Object]) -> Counter[tuple[str, str]]:
    """Successful evictions per (namespace, pod)."""
    counts: Counter[tuple[str, str]] = Counter()
    for event in events:
        ref = event.get("objectRef") or {}
        if (event.get("stage") == "ResponseComplete" and event.get("verb") == "create"
                and ref.get("resource") == "pods" and ref.get("subresource") == "eviction"
                and (event.get("responseStatus") or {}).get("code") in (200, 201)):
            counts[(str(ref.get("namespace")), str(ref.get("name")))] += 1
    return counts


def evictions_not_once(events: Iterable[Object], targets: Iterable[tuple[str, str]]) -> list[str]:
    """Target pods evicted zero or several times, and any pod evicted twice."""
    counts = eviction_counts(events)
    found = [f"{ns}/{name} evicted {counts[(ns, name)]} times" for ns, name in targets if counts[(ns, name)] != 1]
    return found + [p for p in repeated_evictions(list(events)) if not any(f"{ns}/{n}" in p for ns, n in targets)]


def direct_pod_deletions(events: Iterable[Object]) -> list[str]:
    return [f"{(e.get('objectRef') or {}).get('namespace')}/{(e.get('objectRef') or {}).get('name')}"
            for e in events if e.get("stage") == "ResponseComplete" and e.get("verb") == "delete"
            and (e.get("objectRef") or {}).get("resource") == "pods" and not (e.get("objectRef") or {}).get(
                "subresource") and (e.get("user") or {}).get("username") == CLAIMWARDEN_USER]


def writes_without_the_lease(events: Iterable[Object]) -> list[str]:
    """Writes by a replica (its user agent) while the Lease's last successful write named another holder.

    Lease writes carry their request body (the lab's audit policy), so the holder over time is known;
    a write counts from the time it was received, a Lease write from the time it completed.
    """
    timeline: list[tuple[str, str, str]] = []  # (time, kind, who)
    for event in events:
        if event.get("stage") != "ResponseComplete" or (event.get("user") or {}).get("username") != CLAIMWARDEN_USER:
            continue
        ref = event.get("objectRef") or {}
        if (event.get("responseStatus") or {}).get("code", 500) >= 300:
            continue
        agent = str(event.get("userAgent") or "")
        if ref.get("resource") == "leases":
            holder = str(((event.get("requestObject") or {}).get("spec") or {}).get("holderIdentity") or "")
            timeline.append((str(event.get("stageTimestamp")), "lease", holder))
        elif event.get("verb") in ("create", "update", "patch", "delete"):
            timeline.append((str(event.get("requestReceivedTimestamp")), "write", agent))
    timeline.sort()
    holder, found = None, []
    for moment, kind, who in timeline:
        if kind == "lease":
            holder = who
        elif holder is not None and f"({holder})" not in who:
            found.append(f"{moment}: {who} wrote while {holder or 'nobody'} held the lease")
    return found


def _identity(user_agent: str) -> str:
    """The replica's identity in claimwarden's user agent, `claimwarden/VERSION (IDENTITY)`."""
    found = re.search(r"\(([^()]*)\)\s*$", user_agent)
    return found.group(1) if found else user_agent


def _succeeded(event: Mapping[str, Any]) -> bool:
    return bool(event.get("stage") == "ResponseComplete" and (event.get("user") or {}).get("username")
                == CLAIMWARDEN_USER and (event.get("responseStatus") or {}).get("code", 500) < 300)


def _is_lease(event: Mapping[str, Any]) -> bool:
    return (event.get("objectRef") or {}).get("resource") == "leases"


def writes_after_a_successor(events: Iterable[Object]) -> list[str]:
    """Writes by a replica that completed after another replica, leading since later, made its first write.

    A term starts when a Lease write names a new holder; its first write is the holder's first write
    received after that. Any write of an older term (its writer took the lease before that term began)
    that completed at or after that moment is a violation: the old leader's write landed after its
    successor had started acting. Unlike `writes_without_the_lease`, this needs no assumption about when a
    write "counts": the old write's completion is compared with the new leader's first arrival, so a write
    held up on its way (a slow link, a healed partition) is caught.
    """
    events = list(events)
    terms: list[tuple[str, str]] = []  # (when the Lease named a new holder, the holder)
    holder = None
    for event in sorted((e for e in events if _succeeded(e) and _is_lease(e)),
                        key=lambda e: str(e.get("stageTimestamp"))):
        who = str(((event.get("requestObject") or {}).get("spec") or {}).get("holderIdentity") or "")
        if who != holder:
            holder = who
            if who:
                terms.append((str(event.get("stageTimestamp")), who))
    writes = sorted(((str(e.get("requestReceivedTimestamp")), str(e.get("stageTimestamp")),
                      _identity(str(e.get("userAgent") or "")), e) for e in events
                     if _succeeded(e) and not _is_lease(e) and e.get("verb") in WRITES),
                    key=lambda w: w[0])

    def term_of(who: str, received: str) -> str:
        """When `who` last took the lease before `received` ("" if never)."""
        return max((began for began, holder in terms if holder == who and began <= received), default="")

    found = []
    for began, leader in terms:
        first = next((w for w in writes if w[2] == leader and w[0] >= began), None)
        if first is None:
            continue
        for received, completed, who, event in writes:
            if who != leader and completed >= first[0] and term_of(who, received) < began:
                ref = event.get("objectRef") or {}
                found.append(f"{who}: {event.get('verb')} {ref.get('resource')} {ref.get('namespace') or ''}/"
                             f"{ref.get('name') or ''} completed {completed}, after {leader}'s first write as "
                             f"leader ({first[0]})")
    return found


def _moment(stamp: str) -> datetime.datetime:
    return datetime.datetime.fromisoformat(stamp.replace("Z", "+00:00"))


def breaker_room_exceeded(events: Iterable[Object], breaker: Breaker | None) -> list[str]:
    """Drivers whose pods claimwarden evicted more than the breaker's limit within one window, replicas
    and failovers together (the window is kept in the records, so a new leader inherits it)."""
    if breaker is None:
        return []
    evicted: dict[str, list[tuple[datetime.datetime, str]]] = defaultdict(list)
    for event in events:
        ref = event.get("objectRef") or {}
        if (_succeeded(event) and event.get("verb") == "create" and ref.get("resource") == "pods"
                and ref.get("subresource") == "eviction"):
            pod = (str(ref.get("namespace")), str(ref.get("name")))
            evicted[breaker.drivers.get(pod, "")].append((_moment(str(event.get("stageTimestamp"))),
                                                          f"{pod[0]}/{pod[1]}"))
    found = []
    window = datetime.timedelta(seconds=breaker.window)
    for driver, moments in sorted(evicted.items()):
        moments.sort()
        most, at = 0, 0
        for i, (moment, _) in enumerate(moments):
            inside = sum(1 for earlier, _ in moments[: i + 1] if moment - earlier < window)
            if inside > most:
                most, at = inside, i
        if most > breaker.limit:
            found.append(f"driver {driver or '(the lab driver)'}: {most} evictions within {breaker.window:g} s "
                         f"(limit {breaker.limit}), the last {moments[at][1]} at {moments[at][0].isoformat()}")
    return found


Device = tuple[str, str, str]
Released = tuple[str, str]
"""(when, claim name)"""


def _allocated_device(request: Any) -> Device | None:
    """The device a quarantine claim's status write allocates (a JSON patch or a whole status), if any."""
    values = [op.get("value") for op in request if isinstance(op, dict) and op.get("op") in ("add", "replace")] \
        if isinstance(request, list) else [(request or {}).get("status")]
    for value in values:
        results = (((value or {}).get("allocation") or {}).get("devices") or {}).get("results") or [] \
            if isinstance(value, dict) else []
        for result in results:
            return str(result.get("driver")), str(result.get("pool")), str(result.get("device"))
    return None


def _deallocates(request: Any) -> bool:
    return isinstance(request, list) and any(isinstance(op, dict) and op.get("op") == "remove"
                                             and op.get("path") in ("/status/allocation", "/status") for op in request)


def _quarantine_history(events: Iterable[Object]) -> tuple[dict[Device, list[str]], dict[Device, list[Released]]]:
    """When a quarantine claim of each device was allocated, and when (and which) one was released.

    From the audit log's bodies of claimwarden's writes to its quarantine claims (the lab's audit policy
    records them): the status write that allocates a claim names its device; a later deletion or
    deallocation of that claim is a release.
    """
    device_of: dict[str, Device] = {}
    asserted: dict[Device, list[str]] = defaultdict(list)
    released: dict[Device, list[Released]] = defaultdict(list)
    for event in sorted((e for e in events if _succeeded(e)), key=lambda e: str(e.get("stageTimestamp"))):
        ref = event.get("objectRef") or {}
        if ref.get("resource") != "resourceclaims" or ref.get("namespace") != OWN_NAMESPACE:
            continue
        name, at = str(ref.get("name")), str(event.get("stageTimestamp"))
        request = event.get("requestObject")
        if ref.get("subresource") == "status" and event.get("verb") in ("patch", "update"):
            device = _allocated_device(request)
            if device is not None:
                device_of[name] = device
                asserted[device].append(at)
            elif _deallocates(request) and name in device_of:
                released[device_of[name]].append((at, name))
        elif event.get("verb") == "delete" and name in device_of:
            released[device_of.pop(name)].append((at, name))
    return asserted, released


def quarantined_devices(events: Iterable[Object]) -> set[Device]:
    """(driver, pool, device) of every quarantine claim allocated in `events`: that the checker sees them."""
    return set(_quarantine_history(events)[0])


def quarantine_released_under_a_record(events: Iterable[Object], records: Iterable[Object]) -> list[str]:
    """Devices whose quarantine claim was deallocated or deleted while a record marking them remained, and
    whose quarantine was not asserted again after that (health/__init__.py, the quarantine trap: a release
    makes the scheduler forget the device whatever other claims still hold it).

    A record that exists now, of a NoExecute or NoSchedule device, created before a release of its device,
    needs an allocation of a quarantine claim of that device after it.
    """
    asserted, released = _quarantine_history(events)
    found = []
    for record in records:
        body = record.get("spec") or {}
        if str(body.get("effect") or "NoExecute") not in QUARANTINE_EFFECTS or _meta(record).get("deletionTimestamp"):
            continue
        device = (str(body.get("driver")), str(body.get("pool")), str(body.get("device")))
        created = _moment(str(_meta(record).get("creationTimestamp")))
        for at, claim in released.get(device, []):
            # creationTimestamp has whole seconds: a release in the second the record was made counts.
            if _moment(at) >= created and not any(later > at for later in asserted[device]):
                found.append(f"{'/'.join(device)}: quarantine claim {claim} released at {at} while record "
                             f"{_meta(record).get('name')} remained, and not asserted again")
    return found


def check(cluster: Cluster, targets: Iterable[tuple[str, str]] = (),
          breaker: Breaker | None = None) -> dict[str, list[str]]:
    """Every invariant's violations (empty lists when all hold); the breaker's only with `breaker`."""
    return dict(zip(INVARIANTS, (
        claims_per_pod_claim(cluster.pods, cluster.claims),
        orphans(cluster.pods, cluster.claims),
        stale_reservations(cluster.pods, cluster.claims),
        leaked(cluster.claims, cluster.records),
        shared_devices(cluster.claims),
        evictions_not_once(cluster.events, list(targets)),
        direct_pod_deletions(cluster.events),
        quarantine_beyond_bound(cluster.claims),
        writes_without_the_lease(cluster.events),
        writes_after_a_successor(cluster.events),
        breaker_room_exceeded(cluster.events, breaker),
        quarantine_released_under_a_record(cluster.events, cluster.records),
    ), strict=True))
