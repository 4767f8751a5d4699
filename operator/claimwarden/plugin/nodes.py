"""Which nodes a pod may run on, and which nodes a slice or device reaches: label and field
selectors, node affinity and node taints with the scheduler's rules. Pure functions over dicts."""

from __future__ import annotations

from typing import Any

from .snapshot import Obj, name_of

UNSCHEDULABLE_TAINT = {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}


def _requirement_matches(requirement: Obj, values_of: dict[str, str]) -> bool:
    key, operator = requirement.get("key", ""), requirement.get("operator", "")
    values = [str(v) for v in requirement.get("values") or []]
    present = key in values_of
    value = values_of.get(key)
    if operator == "In":
        return present and value in values
    if operator == "NotIn":
        return not present or value not in values
    if operator == "Exists":
        return present
    if operator == "DoesNotExist":
        return not present
    if operator in ("Gt", "Lt") and present and values:
        try:
            left, right = int(str(value)), int(values[0])
        except ValueError:
            return False
        return left > right if operator == "Gt" else left < right
    return False


def term_matches(term: Obj, node: Obj) -> bool:
    """One NodeSelectorTerm: all matchExpressions (labels) and matchFields (metadata.name) hold."""
    labels = {str(k): str(v) for k, v in ((node.get("metadata") or {}).get("labels") or {}).items()}
    fields = {"metadata.name": name_of(node)}
    expressions = term.get("matchExpressions") or []
    field_reqs = term.get("matchFields") or []
    if not expressions and not field_reqs:
        return False  # an empty term matches nothing
    return (all(_requirement_matches(r, labels) for r in expressions)
            and all(_requirement_matches(r, fields) for r in field_reqs))


def selector_matches(selector: Obj | None, node: Obj) -> bool:
    """A NodeSelector: the terms are ORed."""
    if not selector:
        return True
    return any(term_matches(term, node) for term in selector.get("nodeSelectorTerms") or [])


def reaches(node_spec: Obj, node: Obj) -> bool:
    """Whether a slice's (or device's) nodeName / nodeSelector / allNodes reaches the node."""
    if node_spec.get("nodeName") is not None:
        return bool(node_spec["nodeName"] == name_of(node))
    if node_spec.get("allNodes"):
        return True
    if node_spec.get("nodeSelector") is not None:
        return selector_matches(node_spec["nodeSelector"], node)
    return False


def pod_tolerates(tolerations: list[Obj], taint: Obj) -> bool:
    """Pod toleration semantics (v1.Toleration.ToleratesTaint)."""
    for toleration in tolerations:
        effect = toleration.get("effect") or ""
        if effect and effect != taint.get("effect"):
            continue
        key, operator = toleration.get("key") or "", toleration.get("operator") or "Equal"
        if key and key != taint.get("key"):
            continue
        same_value = (toleration.get("value") or "") == (taint.get("value") or "")
        if operator == "Exists" or (operator == "Equal" and same_value):
            return True
    return False


def why_not(pod: Obj | None, node: Obj, allocated_selectors: list[Obj]) -> str | None:
    """Why the pod cannot run on the node for reasons other than its claims' devices, or None."""
    if pod is not None:
        spec = pod.get("spec") or {}
        if spec.get("nodeName") and spec["nodeName"] != name_of(node):
            return "the pod is bound to another node"
        labels = (node.get("metadata") or {}).get("labels") or {}
        for key, value in (spec.get("nodeSelector") or {}).items():
            if labels.get(key) != value:
                return f"nodeSelector {key}={value}"
        required = (((spec.get("affinity") or {}).get("nodeAffinity") or {})
                    .get("requiredDuringSchedulingIgnoredDuringExecution"))
        if required and not selector_matches(required, node):
            return "node affinity"
        tolerations = spec.get("tolerations") or []
        taints: list[Any] = list((node.get("spec") or {}).get("taints") or [])
        if (node.get("spec") or {}).get("unschedulable"):
            taints.append(UNSCHEDULABLE_TAINT)
        for taint in taints:
            if taint.get("effect") in ("NoSchedule", "NoExecute") and not pod_tolerates(tolerations, taint):
                return f"node taint {taint.get('key')}:{taint.get('effect')}"
    for selector in allocated_selectors:
        if not selector_matches(selector, node):
            return "an allocated claim of the pod is tied to other nodes"
    return None
