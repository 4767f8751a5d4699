"""Pods that hold a device through their PodGroup's reservation (KEP-5729): pure decisions, no I/O.

A claim reserved for a PodGroup has one ``reservedFor`` entry ``{apiGroup: scheduling.k8s.io,
resource: podgroups, name, uid}`` and no pod entries, however many pods of the group use it. For
eviction such an entry stands for every pod of the claim's namespace whose
``spec.schedulingGroup.podGroupName`` is the entry's name, that uses the claim (one of its
``spec.resourceClaims`` resolves to it, directly or through ``status.resourceClaimStatuses``) and is
not done. The entry's UID is not compared: pods do not know their group's UID (as in
``claims.podgroups.is_reserved_for_group_of``), and a PodGroup replaced under the same name gets its
entry dropped by the reservations controller.

Members are found through an index by (namespace, PodGroup name) (``Cache.pods_in_podgroup``),
never by a scan of all pods per claim.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from claimwarden.claims.podgroups import (
    is_for_group_of,
    is_podgroup_reservation,
    is_reserved_for_group_of,
    podgroup_name_of,
)
from claimwarden.objects.claims import reserved_for
from claimwarden.objects.meta import metadata
from claimwarden.objects.pods import is_pod_done, resolve_claim_names

GroupMembers = Callable[[str, str], Iterable[str]]
"""(namespace, PodGroup name) -> names of the pods whose spec.schedulingGroup names it (an index look-up)."""


def uses_group_claim(pod: dict[str, Any], claim: dict[str, Any]) -> bool:
    """True when one of the pod's spec.resourceClaims resolves to this claim as its group's claim.

    A claim by name counts as it is; a claim resolved from a template entry must be controlled by
    a PodGroup of the pod's group name (generated once per group), not by the pod.
    """
    name = metadata(claim).get("name")
    return bool(name) and any(
        resolved.claim_name == name and (not resolved.from_template or is_for_group_of(claim, pod))
        for resolved in resolve_claim_names(pod))


def holds_through_group(claim: dict[str, Any], pod: dict[str, Any]) -> bool:
    """True when the pod holds the claim through its PodGroup: same namespace, reservedFor names the
    pod's group, the pod uses the claim and is not done."""
    return (metadata(pod).get("namespace") == metadata(claim).get("namespace")
            and is_reserved_for_group_of(claim, pod) and uses_group_claim(pod, claim) and not is_pod_done(pod))


def group_pods(claim: dict[str, Any], pods: Mapping[tuple[str, str], dict[str, Any]],
               members: GroupMembers) -> list[dict[str, Any]]:
    """The pods holding the claim through a PodGroup entry of its reservedFor, sorted by name.

    `members` may be stale or name pods that left the group: each pod is checked again here.
    """
    namespace = str(metadata(claim).get("namespace") or "")
    found: dict[str, dict[str, Any]] = {}
    for entry in reserved_for(claim):
        group = str(entry.get("name") or "")
        if not group or not is_podgroup_reservation(entry):
            continue
        for name in members(namespace, group):
            pod = pods.get((namespace, name))
            if pod is not None and podgroup_name_of(pod) == group and holds_through_group(claim, pod):
                found[name] = pod
    return [found[name] for name in sorted(found)]


def members_of(pods: Iterable[dict[str, Any]]) -> GroupMembers:
    """A GroupMembers look-up over plain pods (the kubectl plugin's snapshot, tests)."""
    by_group: dict[tuple[str, str], list[str]] = {}
    for pod in pods:
        group = podgroup_name_of(pod)
        if group:
            meta = metadata(pod)
            by_group.setdefault((str(meta.get("namespace") or ""), group), []).append(str(meta.get("name") or ""))
    return lambda namespace, group: by_group.get((namespace, group), [])
