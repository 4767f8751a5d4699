"""doctor: what is wrong with the cluster's claims and devices. Pure checks over a `Snapshot`.

Each finding has a severity (`error` makes `doctor` exit 1; `warning` does not), the objects
involved, what is wrong and the fix. The checks, in order:

leaked-device, stale-reservation, stuck-deletion, orphaned-claim, pending-pod, taint-rule-selects-all,
marked-device-has-pods, record-without-device, reservation-limit.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import datetime, timedelta

from claimwarden.objects.claims import RESERVED_FOR_MAX, controlling_pod_ref, is_allocated, reserved_for
from claimwarden.objects.pods import TERMINAL_PHASES
from claimwarden.timestamps import parse_rfc3339

from .snapshot import Obj, Snapshot, name_of, namespace_of, ref_of

ERROR = "error"
WARNING = "warning"
NEAR_LIMIT = int(RESERVED_FOR_MAX * 0.9)


@dataclass(frozen=True)
class Finding:
    severity: str
    check: str
    objects: tuple[str, ...]
    message: str
    fix: str

    def as_dict(self) -> dict[str, object]:
        return {**asdict(self), "objects": list(self.objects)}


@dataclass(frozen=True)
class Thresholds:
    pending: timedelta = timedelta(minutes=5)
    """A pod Pending on claims for longer is reported."""
    deletion: timedelta = timedelta(minutes=1)
    """A claim in deletion for longer is 'stuck'."""


def _age(obj: Obj, now: datetime, field: str = "creationTimestamp") -> timedelta:
    stamp = parse_rfc3339((obj.get("metadata") or {}).get(field))
    return now - stamp if stamp else timedelta(0)


def check(snapshot: Snapshot, *, thresholds: Thresholds = Thresholds(),
          explain_reason: Callable[[Obj], str] | None = None) -> list[Finding]:
    """Every finding, errors first; `explain_reason` gives explain's one-line reason for a pod."""
    findings: list[Finding] = []
    now = snapshot.now
    pods_by_name = snapshot.pod_index
    pods_by_uid = snapshot.pod_uids
    for claim in snapshot.claims:
        ref = f"resourceclaim/{ref_of(claim)}"
        quarantine = snapshot.is_quarantine_claim(claim)
        owner = controlling_pod_ref(claim)
        entries = reserved_for(claim)
        if is_allocated(claim) and not entries and owner is not None and not quarantine:
            devices = ", ".join(f"{r.get('pool')}/{r.get('device')}" for r in
                                ((claim.get("status") or {}).get("allocation") or {}).get("devices", {})
                                .get("results") or [])
            findings.append(Finding(ERROR, "leaked-device", (ref,),
                                    f"generated claim allocated ({devices}) but reserved for no pod: nobody uses "
                                    "these devices and nobody else can get them",
                                    f"kubectl delete resourceclaim -n {namespace_of(claim)} {name_of(claim)} "
                                    "(its pod gets a new one); claimwarden's reservations controller releases "
                                    "such claims"))
        stale = []
        for entry in entries:
            if entry.get("resource") != "pods":
                continue
            pod = pods_by_name.get((namespace_of(claim), str(entry.get("name"))))
            if pod is None or (pod.get("metadata") or {}).get("uid") != entry.get("uid"):
                stale.append(f"{entry.get('name')} (gone)")
            elif (pod.get("status") or {}).get("phase") in TERMINAL_PHASES:
                stale.append(f"{entry.get('name')} ({pod['status']['phase']})")
        if stale:
            shown = ", ".join(stale[:5]) + (f" and {len(stale) - 5} more" if len(stale) > 5 else "")
            findings.append(Finding(WARNING, "stale-reservation",
                                    (ref, *(f"pod/{namespace_of(claim)}/{p.split(' ')[0]}" for p in stale[:5])),
                                    f"reservedFor names {len(stale)} pod(s) that are gone or finished: {shown}; "
                                    "the devices stay held",
                                    "run claimwarden's reservations controller (or kube-controller-manager's "
                                    "resourceclaim controller), which drops such entries"))
        if (claim.get("metadata") or {}).get("deletionTimestamp") and (claim.get("metadata") or {}).get("finalizers"):
            age = _age(claim, now, "deletionTimestamp")
            if age >= thresholds.deletion:
                finalizers = ", ".join((claim.get("metadata") or {}).get("finalizers") or [])
                findings.append(Finding(ERROR, "stuck-deletion", (ref,),
                                        f"being deleted for {_human(age)}, held by finalizer(s) {finalizers}"
                                        + (f" while reserved for {len(entries)} pod(s)" if entries else ""),
                                        "find the controller that owns the finalizer and why it does not finish "
                                        "(for resource.kubernetes.io/delete-protection: the claim's pods must end); "
                                        "as a last resort remove the finalizer with kubectl patch"))
        if owner is not None and not quarantine:
            owner_pod = pods_by_uid.get(str(owner.get("uid")))
            if owner_pod is None:
                pod_ref = f"pod/{namespace_of(claim)}/{owner.get('name')}"
                findings.append(Finding(WARNING, "orphaned-claim", (ref, pod_ref),
                                        f"generated for pod {owner.get('name')}, which is gone",
                                        "the garbage collector deletes it once kube-controller-manager runs; "
                                        f"else kubectl delete resourceclaim -n {namespace_of(claim)} {name_of(claim)}"))
        count = len(entries)
        if count >= NEAR_LIMIT:
            findings.append(Finding(ERROR if count >= RESERVED_FOR_MAX else WARNING, "reservation-limit", (ref,),
                                    f"reserved for {count} of at most {RESERVED_FOR_MAX} consumers; the next pods "
                                    "cannot use it",
                                    "split the consumers over several claims (or, on 1.36+, reserve for a PodGroup)"))
    for pod in snapshot.pods:
        spec, status = pod.get("spec") or {}, pod.get("status") or {}
        if not spec.get("resourceClaims") or spec.get("nodeName") or status.get("phase") not in (None, "Pending"):
            continue
        age = _age(pod, now)
        if age < thresholds.pending:
            continue
        reason = explain_reason(pod) if explain_reason else "see kubectl claimwarden explain"
        findings.append(Finding(WARNING, "pending-pod", (f"pod/{ref_of(pod)}",),
                                f"Pending on its claims for {_human(age)}: {reason}",
                                f"kubectl claimwarden explain pod/{name_of(pod)} -n {namespace_of(pod)}"))
    for rule in snapshot.taint_rules or []:
        selector = (rule.get("spec") or {}).get("deviceSelector") or {}
        if not any(selector.get(k) for k in ("deviceClassName", "driver", "pool", "device", "selectors")):
            effect = ((rule.get("spec") or {}).get("taint") or {}).get("effect", "")
            how = "empty" if "deviceSelector" in (rule.get("spec") or {}) else "omitted"
            what = "evicts every pod using a device" if effect == "NoExecute" else "keeps new pods off every device"
            findings.append(Finding(ERROR, "taint-rule-selects-all", (f"devicetaintrule/{name_of(rule)}",),
                                    f"its deviceSelector is {how}, "
                                    f"so it taints every device in the cluster ({effect}: {what}; "
                                    "kubernetes/kubernetes#141620, #141422)",
                                    "give it a deviceSelector (driver, pool, device) or delete it: "
                                    f"kubectl delete devicetaintrule {name_of(rule)}"))
    for record in snapshot.records:
        spec = record.get("spec") or {}
        device_id = (str(spec.get("driver", "")), str(spec.get("pool", "")), str(spec.get("device", "")))
        rec = f"unhealthydevice/{name_of(record)}"
        if device_id not in snapshot.device_index:
            findings.append(Finding(WARNING, "record-without-device", (rec,),
                                    f"names {'/'.join(device_id)}, which no ResourceSlice publishes (the slice or the "
                                    "device is gone)",
                                    f"if the device is gone for good: kubectl claimwarden clear {'/'.join(device_id)}"))
        effect = str(spec.get("effect") or "NoExecute")
        if effect == "None":
            continue
        users = [h for h in snapshot.holders.get(device_id, []) if not h.quarantine and h.pods]
        if users:
            pods = [p for h in users for p in h.pods]
            findings.append(Finding(ERROR if effect == "NoExecute" else WARNING, "marked-device-has-pods",
                                    (rec, *(f"pod/{p}" for p in pods)),
                                    f"device {'/'.join(device_id)} is marked {effect} ({spec.get('reason', '')}) "
                                    f"and still holds pod(s) {', '.join(pods)}",
                                    "NoExecute: is claimwarden running, or does a PodDisruptionBudget block the "
                                    "eviction (kubectl get events)? NoSchedule keeps running pods by design: drain "
                                    "them, or mark NoExecute"))
    findings.sort(key=lambda f: (f.severity != ERROR, f.check))
    return findings


def _human(delta: timedelta) -> str:
    seconds = int(delta.total_seconds())
    if seconds < 120:
        return f"{seconds}s"
    if seconds < 7200:
        return f"{seconds // 60}m"
    return f"{seconds // 3600}h"
