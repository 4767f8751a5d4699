"""The chaos suite's invariants: read the cluster and the apiserver's audit log, count violations.

Every count must be 0 after each scenario. Pure functions over plain objects and audit events,
plus `read` that fetches them from a lab.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from claimwarden.podclaims import (
    POD_CLAIM_NAME_ANNOTATION,
    TERMINAL_PHASES,
    allocated_devices,
    claim_statuses,
    controlling_pod_uid,
    is_allocated,
    is_pod_reservation,
)
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
    "quarantine claims beyond one per record",
    "writes by a replica that did not hold the lease",
)


@dataclass
class Cluster:
    pods: list[Object]
    claims: list[Object]
    records: list[Object]
    events: list[Object] = field(default_factory=list)
    """The audit log's events of the scenario."""


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


def check(cluster: Cluster, targets: Iterable[tuple[str, str]] = ()) -> dict[str, list[str]]:
    """Every invariant's violations (empty lists when all hold)."""
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
    ), strict=True))
