"""The chart renders the objects manifests/ renders, field for field, so neither can change alone.

For each install shape, `helm template` with the values that select it against `kubectl kustomize` of the
directories that make it. Compared whole, after setting aside only what differs by design:
- the Namespace: Helm's (`--create-namespace`), not the chart's (charts/claimwarden/README.md);
- labels: the chart adds Helm's own; each object keeps every label manifests/ gives it;
- the annotation `helm.sh/resource-policy: keep` on the CRDs (the chart's choice), no other annotation differs;
- the order of the container's args (argparse reads flags in any order; the chart writes them sorted);
- the dashboard ConfigMap's JSON, compared parsed (the chart indents it into YAML);
- blank lines in the policies' CEL: kustomize's YAML library re-folds a `>-` scalar with more-indented lines
  (manifests/marking/policy.yaml) and adds a blank line, which the file does not have and CEL ignores.
Everything else, RBAC rules, args, env, ports, probes, security contexts, policies, CRD schemas, alerts, must be
equal.
"""

from __future__ import annotations

import copy
import json
import re
from typing import Any

import pytest

from .render import NAMESPACE, Key, helm_objects, helm_template, kustomize_objects

KEEP = {"helm.sh/resource-policy": "keep"}

SHAPES = {
    "base": ((), ("base",)),
    "monitoring": (("monitoring.serviceMonitor.enabled=true", "monitoring.prometheusRule.enabled=true",
                    "monitoring.dashboard.enabled=true"), ("monitoring", "monitoring/dashboards")),
    "alerting": (("alerting.webhook.enabled=true",), ("alerting",)),
    "marking": (("marking.enabled=true",), ("base", "marking")),
    "nvsentinel": (("run.nvsentinelHandoff=true",), ("nvsentinel",)),
}


def _comparable(obj: dict[str, Any]) -> dict[str, Any]:
    obj = copy.deepcopy(obj)
    obj["metadata"].pop("labels", None)
    obj["metadata"].pop("annotations", None)
    if obj["kind"] == "Deployment":
        for container in obj["spec"]["template"]["spec"]["containers"]:
            container["args"] = sorted(container.get("args", []))
    if obj["kind"] == "ValidatingAdmissionPolicy":
        for entry in [*obj["spec"].get("variables", []), *obj["spec"].get("validations", [])]:
            for field in ("expression", "messageExpression"):
                if field in entry:
                    entry[field] = re.sub(r"\n\s*\n", "\n", entry[field])
    if obj["kind"] == "ConfigMap" and obj["metadata"]["name"] == "claimwarden-dashboard":
        obj["data"] = {name: json.loads(text) for name, text in obj["data"].items()}
    return obj


def differences(chart: dict[Key, dict[str, Any]], kustomize: dict[Key, dict[str, Any]]) -> list[str]:
    """What the chart renders otherwise than kustomize, one line each; empty when they agree."""
    found = []
    expected = {key: obj for key, obj in kustomize.items() if key[0] != "Namespace"}
    for key in sorted(expected.keys() - chart.keys()):
        found.append(f"{key}: only in manifests/")
    for key in sorted(chart.keys() - expected.keys()):
        found.append(f"{key}: only in the chart")
    for key in sorted(expected.keys() & chart.keys()):
        ours, theirs = chart[key], expected[key]
        if _comparable(ours) != _comparable(theirs):
            found.append(f"{key}: differs\n  chart:     {json.dumps(_comparable(ours), sort_keys=True)[:3000]}\n"
                         f"  manifests: {json.dumps(_comparable(theirs), sort_keys=True)[:3000]}")
        labels = ours["metadata"].get("labels") or {}
        for name, value in (theirs["metadata"].get("labels") or {}).items():
            if labels.get(name) != value:
                found.append(f"{key}: label {name}={value} missing in the chart")
        annotations = dict(ours["metadata"].get("annotations") or {})
        if key[0] == "CustomResourceDefinition" and annotations.items() >= KEEP.items():
            del annotations["helm.sh/resource-policy"]
        if annotations != (theirs["metadata"].get("annotations") or {}):
            found.append(f"{key}: annotations {annotations} != {theirs['metadata'].get('annotations')}")
    return found


@pytest.mark.parametrize("shape", SHAPES)
def test_the_chart_renders_what_manifests_render(shape: str) -> None:
    sets, directories = SHAPES[shape]
    chart, kustomize = helm_objects(*sets), kustomize_objects(*directories)
    assert not differences(chart, kustomize), "\n".join(differences(chart, kustomize))
    # Not vacuous: the shape's own objects are there.
    assert ("Deployment", "claimwarden") in chart and ("ClusterRole", "claimwarden") in chart


def test_a_change_on_either_side_alone_is_a_difference() -> None:
    chart, kustomize = helm_objects(), kustomize_objects("base")
    role = kustomize[("ClusterRole", "claimwarden")]
    role["rules"][0]["verbs"].append("delete")
    assert [line.split("\n")[0] for line in differences(chart, kustomize)] == [
        "('ClusterRole', 'claimwarden'): differs"]
    role["rules"][0]["verbs"].pop()
    chart[("Deployment", "claimwarden")]["spec"]["template"]["spec"]["containers"][0]["env"].pop()
    assert [line.split("\n")[0] for line in differences(chart, kustomize)] == [
        "('Deployment', 'claimwarden'): differs"]
    del chart[("Service", "claimwarden-metrics")]
    assert "('Service', 'claimwarden-metrics'): only in manifests/" in differences(chart, kustomize)


def test_the_crds_are_kept_at_uninstall_unless_told_not_to() -> None:
    crds = [o for (kind, _), o in helm_objects().items() if kind == "CustomResourceDefinition"]
    assert sorted(o["metadata"]["name"] for o in crds) == ["healthpolicies.claimwarden.io",
                                                           "unhealthydevices.claimwarden.io"]
    assert all(o["metadata"]["annotations"].items() >= KEEP.items() for o in crds)
    unkept = [o for (kind, _), o in helm_objects("crds.keep=false").items() if kind == "CustomResourceDefinition"]
    assert len(unkept) == 2 and all("helm.sh/resource-policy" not in (o["metadata"].get("annotations") or {})
                                    for o in unkept)
    assert not [k for k in helm_objects("crds.install=false") if k[0] == "CustomResourceDefinition"]


def test_another_namespace_moves_every_object_and_reference() -> None:
    text = helm_template("monitoring.serviceMonitor.enabled=true", "monitoring.prometheusRule.enabled=true",
                         "monitoring.dashboard.enabled=true", "alerting.webhook.enabled=true", "marking.enabled=true",
                         namespace="gpu-ops").stdout
    assert NAMESPACE not in text
    objects = helm_objects("monitoring.serviceMonitor.enabled=true", namespace="gpu-ops")
    cluster_scoped = {"CustomResourceDefinition", "ClusterRole", "ClusterRoleBinding", "ValidatingAdmissionPolicy",
                      "ValidatingAdmissionPolicyBinding", "PriorityClass"}
    for (kind, name), obj in objects.items():
        assert obj["metadata"].get("namespace") == (None if kind in cluster_scoped else "gpu-ops"), (kind, name)
    for kind, name in (("ClusterRoleBinding", "claimwarden"), ("RoleBinding", "claimwarden-leader-election")):
        assert objects[(kind, name)]["subjects"] == [
            {"kind": "ServiceAccount", "name": "claimwarden", "namespace": "gpu-ops"}]
    assert objects[("ServiceMonitor", "claimwarden")]["spec"]["namespaceSelector"] == {"matchNames": ["gpu-ops"]}


PEOPLE_ROLES = ["claimwarden-aggregate-to-view", "claimwarden-approver", "claimwarden-edit",
                "claimwarden-health-reporter", "claimwarden-view"]


def test_the_roles_for_people_come_with_base_unless_turned_off() -> None:
    def people_roles(*sets: str) -> list[str]:
        return sorted(name for kind, name in helm_objects(*sets) if kind == "ClusterRole" and name != "claimwarden")

    assert people_roles() == PEOPLE_ROLES
    assert people_roles("roles.enabled=false") == []
    assert not [key for key in helm_objects() if key[0] == "ClusterRoleBinding" and key[1] != "claimwarden"]
