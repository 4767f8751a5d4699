"""-o json|yaml|name on every read verb (explain, doctor, devices, uninstall, drain --dry-run), flags that would be
ignored refused, and completion through kubectl (kubectl_complete-claimwarden): the handlers driven with a
snapshot in place of a cluster."""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml

from claimwarden.health.records import RECORD_LABEL
from claimwarden.plugin import cli, complete, read_verbs, write_verbs
from claimwarden.plugin.errors import EXIT_BAD, EXIT_INPUT, EXIT_OK, InputError
from claimwarden.plugin.snapshot import Snapshot

from .plugin_fixtures import DRIVER, claim, cluster, pod, request, slice_

Obj = dict[str, Any]
NODE = "node-a"


class FakeCluster:
    """What the handlers read: one snapshot, and for drain the node, its pods and the claims by path."""

    default_namespace = "ns"

    def __init__(self, snapshot: Snapshot | None = None, paths: dict[str, Any] | None = None) -> None:
        self._snapshot = snapshot or Snapshot()
        self._paths = paths or {}

    def snapshot(self, **_: Any) -> Snapshot:
        return self._snapshot

    def get(self, path: str) -> Any:
        return self._paths.get(path)

    def list(self, path: str) -> Any:
        return next((items for prefix, items in self._paths.items() if path.startswith(prefix)), [])


def _run(handler: Any, fake: FakeCluster, argv: list[str]) -> int:
    return int(handler(fake, cli.parser().parse_args(argv)))


def _pending() -> Snapshot:
    snapshot = cluster()
    snapshot.claims = [claim("gpu-claim", [request()])]
    snapshot.pods = [pod("trainer", ["gpu-claim"])]
    return snapshot


def test_explain_prints_one_document_for_json_and_yaml_and_the_claims_for_name(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert _run(read_verbs.explain, FakeCluster(_pending()), ["explain", "pod/trainer", "-o", "json"]) == EXIT_OK
    document = json.loads(capsys.readouterr().out)
    assert document["target"].startswith("pod ns/trainer") and document["verdict"]["allocatable"] is True
    assert [c["claim"] for c in document["claims"]] == ["ns/gpu-claim"]
    assert _run(read_verbs.explain, FakeCluster(_pending()), ["explain", "pod/trainer", "-o", "yaml"]) == EXIT_OK
    assert yaml.safe_load(capsys.readouterr().out) == document
    assert _run(read_verbs.explain, FakeCluster(_pending()), ["explain", "pod/trainer", "-o", "name"]) == EXIT_OK
    assert capsys.readouterr().out == "resourceclaim/ns/gpu-claim\n"


def _marked() -> Snapshot:
    record = {"metadata": {"name": "r0", "uid": "uid-r0"},
              "spec": {"driver": DRIVER, "pool": "n0", "device": "gpu-1", "effect": "NoExecute", "reason": "XID 79"}}
    quarantine = claim("q0", [request()], namespace="claimwarden-system", allocated=[("n0", "gpu-1")],
                       labels={RECORD_LABEL: "x-gpu-1"})
    return Snapshot(slices=[slice_("n0", "H100", "80Gi", count=4)], records=[record], claims=[quarantine],
                    taint_rules=[])


def test_uninstall_check_names_the_devices_it_would_free_as_mark_takes_them(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert _run(write_verbs.uninstall, FakeCluster(_marked()), ["uninstall", "--check", "-o", "name"]) == EXIT_BAD
    assert capsys.readouterr().out == f"{DRIVER}/n0/gpu-1\n"
    assert _run(write_verbs.uninstall, FakeCluster(_marked()), ["uninstall", "--check", "-o", "json"]) == EXIT_BAD
    assert json.loads(capsys.readouterr().out)["wouldRelease"] == 1


def test_devices_and_doctor_keep_their_name_output(capsys: pytest.CaptureFixture[str]) -> None:
    assert _run(read_verbs.devices, FakeCluster(cluster(nodes=1, devices=2)), ["devices", "-o", "name"]) == EXIT_OK
    assert capsys.readouterr().out.splitlines() == [f"{DRIVER}/node-0/gpu-0", f"{DRIVER}/node-0/gpu-1"]
    assert _run(read_verbs.doctor, FakeCluster(cluster(nodes=1)), ["doctor", "-o", "yaml"]) == EXIT_OK
    assert yaml.safe_load(capsys.readouterr().out) == {"findings": [], "errors": 0, "warnings": 0}


def _node_with_a_consumer() -> FakeCluster:
    owner = [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs", "uid": "rs-1", "controller": True}]
    consumer = {"metadata": {"name": "web", "namespace": "ns", "uid": "uid-web", "ownerReferences": owner},
                "spec": {"nodeName": NODE, "resourceClaims": [{"name": "c0", "resourceClaimName": "held"}],
                         "terminationGracePeriodSeconds": 10}, "status": {"phase": "Running"}}
    held = {"metadata": {"name": "held", "namespace": "ns", "uid": "claim-held"},
            "status": {"allocation": {"devices": {"results": [{"driver": "d", "pool": NODE, "device": "gpu-0"}]}},
                       "reservedFor": [{"resource": "pods", "name": "web", "uid": "uid-web"}]}}
    return FakeCluster(paths={f"/api/v1/nodes/{NODE}": {"metadata": {"name": NODE}, "spec": {}},
                              "/api/v1/pods": [consumer], "/apis/resource.k8s.io/v1/": [held]})


def test_drain_dry_run_prints_its_plan_as_a_document_or_the_objects_it_would_act_on(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert _run(write_verbs.drain, _node_with_a_consumer(), ["drain", NODE, "--dry-run", "-o", "json"]) == EXIT_OK
    document = json.loads(capsys.readouterr().out)
    assert document["node"] == NODE and document["cordon"] is True
    assert document["consumers"] == [{"pod": "ns/web", "claims": ["ns/held"], "terminating": False}]
    assert [c["claim"] for c in document["claims"]] == ["ns/held"]
    assert _run(write_verbs.drain, _node_with_a_consumer(), ["drain", NODE, "--dry-run", "-o", "name"]) == EXIT_OK
    assert capsys.readouterr().out.splitlines() == [f"node/{NODE}", "pod/ns/web", "resourceclaim/ns/held"]


@pytest.mark.parametrize("argv", [["drain", NODE, "--dry-run", "--timeout", "5m"],
                                  ["drain", NODE, "--dry-run", "--force-after", "1m"]])
def test_drain_dry_run_refuses_the_flags_it_would_ignore(argv: list[str]) -> None:
    with pytest.raises(InputError):
        _run(write_verbs.drain, _node_with_a_consumer(), argv)


def test_drain_reads_output_only_with_dry_run(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        cli.parser().parse_args(["drain", NODE, "-o", "yaml"])
    assert exited.value.code == 2
    assert "unrecognized arguments: --output=yaml (only with --dry-run)" in capsys.readouterr().err
    assert cli.parser().parse_args(["drain", NODE, "--dry-run", "-o", "yaml"]).output == "yaml"


def test_version_client_refuses_the_cluster_flags_it_would_ignore(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["version", "--client", "--context", "prod"]) == EXIT_INPUT
    assert "--client reads nothing" in capsys.readouterr().err


@pytest.mark.parametrize("verb", ["explain", "doctor", "devices", "uninstall", "drain"])
def test_every_read_verb_offers_json_yaml_and_name(verb: str) -> None:
    [spec] = [s for s in complete.verb_specs(cli.parser()) if s.name == verb]
    assert {"json", "yaml", "name"} <= set(spec.choices["-o"])


def test_kubectl_complete_prints_candidates_then_cobras_directive(capsys: pytest.CaptureFixture[str]) -> None:
    assert complete.main(["d"]) == 0
    assert capsys.readouterr().out == "doctor\ndevices\ndrain\n:4\n"
    complete.main(["mark", "gpu-0", "--effect", "NoS"])
    assert capsys.readouterr().out == "NoSchedule\n:4\n"
    complete.main(["devices", "-o", ""])
    assert capsys.readouterr().out == "wide\njson\nyaml\nname\n:4\n"
    complete.main(["devices", "--output=n"])
    assert capsys.readouterr().out == "--output=name\n:4\n"
    complete.main(["drain", "node-0", "--for"])
    assert capsys.readouterr().out == "--force-after\n--force\n:4\n"
    complete.main(["explain", "--kubeconfig", ""])
    assert capsys.readouterr().out == ":0\n"  # file names, from the shell


def test_kubectl_complete_is_a_console_script_named_as_kubectl_looks_for_it() -> None:
    import tomllib
    from pathlib import Path

    scripts = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["kubectl_complete-claimwarden"] == "claimwarden.plugin.complete:main"
