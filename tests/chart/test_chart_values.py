"""The chart's values: every `claimwarden run` flag by name, the image, the policies' groups, the refusals,
`helm lint`, the version it carries, and its generated values reference."""

from __future__ import annotations

import argparse
import re
import tarfile
from pathlib import Path
from typing import Any

import pytest
import yaml

from claimwarden import cli
from claimwarden_lab import chartdocs

from .render import CHART, NAMESPACE, by_key, helm, helm_objects, helm_template, project_version, run

VALUES = yaml.safe_load((CHART / "values.yaml").read_text())

# One valid value per flag, none of them the default, with what argparse makes of it.
SAMPLES: dict[str, tuple[str, Any]] = {
    "kubeconfig": ("/etc/claimwarden/kubeconfig", "/etc/claimwarden/kubeconfig"),
    "controllers": ("claims,health", ("claims", "health")),
    "liveness": ("http://0.0.0.0:8081/livez", "http://0.0.0.0:8081/livez"),
    "readiness": ("http://0.0.0.0:8083/ready", "http://0.0.0.0:8083/ready"),
    "metricsAddress": ("127.0.0.1", "127.0.0.1"),
    "metricsPort": ("9191", 9191),
    "namespace": ("gpu-ops", "gpu-ops"),
    "resyncPeriod": ("120", 120.0),
    "metricsCachePeriod": ("0", 0.0),
    "requestTimeout": ("20", 20.0),
    "kubeApiQps": ("50", 50.0),
    "kubeApiBurst": ("100", 100),
    "workers": ("10", 10),
    "leaderElect": ("false", False),
    "leaderElectLeaseDuration": ("20", 20.0),
    "leaderElectRenewDeadline": ("12", 12.0),
    "leaderElectRetryPeriod": ("3", 3.0),
    "breakerMaxFraction": ("0.5", 0.5),
    "breakerMaxPods": ("100", 100),
    "breakerMinPods": ("4", 4),
    "breakerWindow": ("300", 300.0),
    "evictionQps": ("5", 5.0),
    "evictionBurst": ("10", 10),
    "evictionRetryQps": ("2", 2.0),
    "evictionWorkers": ("8", 8),
    "alertWebhookAddress": ("127.0.0.1", "127.0.0.1"),
    "alertWebhookPort": ("9443", 9443),
    "alertTokenFile": ("/etc/hook/token", "/etc/hook/token"),
    "alertTlsCertFile": ("/etc/hook/tls.crt", "/etc/hook/tls.crt"),
    "alertTlsKeyFile": ("/etc/hook/tls.key", "/etc/hook/tls.key"),
    "alertClientCaFile": ("/etc/hook/ca.crt", "/etc/hook/ca.crt"),
    "alertRate": ("20", 20.0),
    "alertBurst": ("40", 40),
    "nvsentinelHandoff": ("true", True),
    "nvsentinelPollPeriod": ("30", 30.0),
    "verbose": ("true", True),
    "logFormat": ("full", "full"),
}


def _run_parser() -> argparse.ArgumentParser:
    parser = cli._parser(None)
    [subparsers] = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return subparsers.choices["run"]


def _camel(flag: str) -> str:
    head, *rest = flag.removeprefix("--").split("-")
    return head + "".join(word.capitalize() for word in rest)


def _container(objects: dict[Any, Any]) -> dict[str, Any]:
    return objects[("Deployment", "claimwarden")]["spec"]["template"]["spec"]["containers"][0]


def test_values_run_names_every_flag_of_claimwarden_run_and_nothing_else() -> None:
    flags = {option for action in _run_parser()._actions for option in action.option_strings
             if option.startswith("--") and option != "--help"}
    assert set(VALUES["run"]) == {_camel(flag) for flag in flags}
    assert set(SAMPLES) == set(VALUES["run"])


def test_every_run_value_becomes_its_flag_as_claimwarden_run_parses_it() -> None:
    run_values = {key: yaml.safe_load(text) for key, (text, _) in SAMPLES.items()}
    # leaderElect false (a sample) takes one replica and no budget.
    objects = helm_objects(namespace="gpu-ops", values={"run": run_values, "replicaCount": 1,
                                                        "podDisruptionBudget": {"enabled": False}})
    container = _container(objects)
    parsed = _run_parser().parse_args(container["args"])
    for key, (_, expected) in SAMPLES.items():
        attribute = re.sub(r"(?<!^)([A-Z])", r"_\1", key).lower()
        assert getattr(parsed, attribute) == expected, key
    # The ports and the probe follow the flags.
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"health": 8081, "ready": 8083, "metrics": 9191}
    assert container["livenessProbe"]["httpGet"] == {"path": "/livez", "port": "health"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/ready", "port": "ready"}


def test_no_readiness_url_leaves_the_probe_and_its_port_out() -> None:
    container = _container(helm_objects("run.readiness="))
    assert "readinessProbe" not in container and [p["name"] for p in container["ports"]] == ["health", "metrics"]
    assert not [a for a in container["args"] if a.startswith("--readiness")]


def test_the_priority_class_and_the_network_policy_follow_their_values() -> None:
    objects = helm_objects("priorityClass.create=false", "priorityClassName=system-cluster-critical",
                           "networkPolicy.metricsNamespaceSelector.matchLabels.team=observability")
    assert ("PriorityClass", "claimwarden") not in objects
    assert objects[("Deployment", "claimwarden")]["spec"]["template"]["spec"]["priorityClassName"] == (
        "system-cluster-critical")
    [rule] = objects[("NetworkPolicy", "claimwarden-metrics")]["spec"]["ingress"]
    assert rule["from"] == [{"namespaceSelector": {"matchLabels": {"metrics": "enabled", "team": "observability"}}}]
    assert helm_objects("priorityClass.value=5000")[("PriorityClass", "claimwarden")]["value"] == 5000
    assert not [k for k in helm_objects("networkPolicy.enabled=false") if k[0] == "NetworkPolicy"]


def test_null_values_leave_their_flags_out() -> None:
    args = _container(helm_objects())["args"]
    assert sorted(args) == ["--liveness=http://0.0.0.0:8080/healthz", "--log-format=json", "--metrics-port=9090",
                            "--readiness=http://0.0.0.0:8082/readyz"]


@pytest.mark.parametrize(("sets", "message"), [
    (("run.namespace=elsewhere",), 'run.namespace is "elsewhere" but the release is in "claimwarden-system"'),
    (("alerting.webhook.enabled=true", "run.alertTokenFile=/x"), "leave run.alertTokenFile"),
    (("run.liveness=http://0.0.0.0/healthz",), "names no port"),
    (("run.leaderElect=false",), "run.leaderElect is false with replicaCount 2: every replica would run"),
    (("replicaCount=1",), "podDisruptionBudget.minAvailable 1 with replicaCount 1 allows no disruption"),
    (("alerting.webhook.enabled=true", "run.alertWebhookPort=0"), "its Service would lead nowhere"),
    ((r"podLabels.app\.kubernetes\.io/name=other",), "podLabels sets app.kubernetes.io/name"),
])
def test_contradicting_values_are_refused_with_the_reason(sets: tuple[str, ...], message: str) -> None:
    result = helm_template(*sets, check=False)
    assert result.returncode != 0 and message in result.stderr, result.stderr


def test_one_replica_without_leader_election_is_replaced_not_surged() -> None:
    deployment = helm_objects("run.leaderElect=false", "replicaCount=1", "podDisruptionBudget.enabled=false")[
        ("Deployment", "claimwarden")]
    assert deployment["spec"]["replicas"] == 1 and deployment["spec"]["strategy"] == {"type": "Recreate"}
    assert "--leader-elect=false" in _container({("Deployment", "claimwarden"): deployment})["args"]
    budget = helm_objects("replicaCount=3", "podDisruptionBudget.minAvailable=2")
    assert budget[("PodDisruptionBudget", "claimwarden")]["spec"]["minAvailable"] == 2
    assert helm_objects("replicaCount=1", "podDisruptionBudget.minAvailable=50%")[
        ("PodDisruptionBudget", "claimwarden")]["spec"]["minAvailable"] == "50%"


def test_the_image_by_tag_by_default_else_by_digest() -> None:
    assert _container(helm_objects())["image"] == f"claimwarden:{project_version()}"
    assert _container(helm_objects("image.repository=r.example/cw", "image.tag=1.2.3"))["image"] == "r.example/cw:1.2.3"
    digest = "sha256:" + "a" * 64
    pinned = _container(helm_objects("image.repository=r.example/cw", "image.tag=1.2.3", f"image.digest={digest}"))
    assert pinned["image"] == f"r.example/cw@{digest}" and "imagePullPolicy" not in pinned


def test_the_policies_take_their_groups_from_values() -> None:
    objects = helm_objects("approval.approverGroups={oncall,platform}", "marking.enabled=true",
                           "marking.operatorUsers={system:serviceaccount:health:checker}")
    approval = {v["name"]: v["expression"]
                for v in objects[("ValidatingAdmissionPolicy", "claimwarden-approval")]["spec"]["variables"]}
    marking = {v["name"]: v["expression"]
               for v in objects[("ValidatingAdmissionPolicy", "claimwarden-marking")]["spec"]["variables"]}
    assert approval["approverGroups"] == "['oncall', 'platform']"
    assert marking["operatorGroups"] == "['claimwarden:operators']"
    assert marking["operatorUsers"] == "['system:serviceaccount:health:checker']"
    assert ("ValidatingAdmissionPolicy", "claimwarden-approval") not in helm_objects("approval.enabled=false")


def test_the_chart_carries_the_project_version() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["version"] == chart["appVersion"] == project_version()


EVERYTHING_ON = ("monitoring.serviceMonitor.enabled=true", "monitoring.prometheusRule.enabled=true",
                 "monitoring.dashboard.enabled=true", "alerting.webhook.enabled=true", "marking.enabled=true")


@pytest.mark.parametrize("sets", [(), EVERYTHING_ON])
def test_helm_lint_passes_strict(sets: tuple[str, ...]) -> None:
    options = [item for s in sets for item in ("--set", s)]
    result = run(helm(), "lint", "--strict", CHART, *options)
    assert "1 chart(s) linted, 0 chart(s) failed" in result.stdout and "[WARNING]" not in result.stdout


def test_the_values_reference_is_current() -> None:
    readme = (CHART / "README.md").read_text()
    assert readme == chartdocs.render(readme, (CHART / "values.yaml").read_text()), "run 'make chart-docs'"
    assert "| `run.kubeApiQps` | `null` | `--kube-api-qps`:" in readme


def test_a_value_without_a_description_is_refused() -> None:
    with pytest.raises(chartdocs.ValuesDocError, match=r"image\.tag has no"):
        chartdocs.values("image:\n  # -- the repository\n  repository: x\n  tag: ''\n")
    with pytest.raises(chartdocs.ValuesDocError, match="line 2"):
        chartdocs.documented_keys("# -- dangling\n- item\n")
    assert [v.path for v in chartdocs.values("# -- all of it\nresources:\n  limits: {}\n")] == ["resources"]


def test_the_packaged_chart_holds_the_linked_files_and_takes_the_release_version(tmp_path: Path) -> None:
    """What `make release` does: `helm package --version V --app-version V`; the .tgz has no links (helm stores
    the files' contents) and renders as the directory does, with the image tag following V."""
    run(helm(), "package", CHART, "--version", "9.8.7", "--app-version", "9.8.7", "-d", tmp_path)
    package = tmp_path / "claimwarden-9.8.7.tgz"
    with tarfile.open(package) as archive:
        members = {m.name: m for m in archive.getmembers()}
    assert all(m.isfile() or m.isdir() for m in members.values())
    linked = {"claimwarden/files/rbac.yaml", "claimwarden/files/crds/unhealthydevices.claimwarden.io.yaml"}
    assert linked <= set(members)
    rendered = by_key(run(helm(), "template", "claimwarden", package, "--namespace", NAMESPACE).stdout)
    container = _container(rendered)
    assert container["image"] == "claimwarden:9.8.7"
    directory = helm_objects("image.tag=9.8.7")
    for objects in (rendered, directory):
        for obj in objects.values():
            obj["metadata"].get("labels", {}).pop("helm.sh/chart", None)
            obj["metadata"].get("labels", {}).pop("app.kubernetes.io/version", None)
    assert rendered == directory
