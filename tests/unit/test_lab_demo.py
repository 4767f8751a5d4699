"""The demo's pure parts: colour only on a terminal, the commands as shown, the manifests it applies."""

from __future__ import annotations

import io

import pytest
import yaml

from claimwarden_lab.demo import manifests, narration, options
from claimwarden_lab.demo.scenes import metrics


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_colour_only_on_a_terminal_without_no_color() -> None:
    assert narration.use_colour(_Terminal(), {}) is True
    assert narration.use_colour(io.StringIO(), {}) is False  # piped, as in the integration test
    assert narration.use_colour(_Terminal(), {"NO_COLOR": "1"}) is False
    assert narration.use_colour(_Terminal(), {"NO_COLOR": ""}) is True  # no-color.org: only a non-empty value counts


def test_plain_style_is_plain_text_and_colour_wraps_it() -> None:
    plain, colour = narration.Style(colour=False), narration.Style(colour=True)
    assert plain.heading(2, 8, "Experiment 1") == "== 2/8. Experiment 1 =="
    assert plain.note("why") == "# why"
    assert plain.command("kubectl get nodes") == "$ kubectl get nodes"
    for text in (plain.heading(1, 8, "x"), plain.note("x"), plain.command("x"), plain.error("x")):
        assert "\033[" not in text
    assert colour.note("why").startswith("\033[") and colour.note("why").endswith("\033[0m")
    assert "# why" in colour.note("why")


def test_commands_are_shown_as_a_user_would_type_them() -> None:
    assert narration.command_text(["annotate", "resourceslice", "s", "unhealthy.claimwarden.io/gpu-3=XID 79: x"]) == (
        "kubectl annotate resourceslice s 'unhealthy.claimwarden.io/gpu-3=XID 79: x'")
    assert narration.command_text(["apply", "-f", "-"], "kind: Pod\n") == "kubectl apply -f - <<EOF\nkind: Pod\nEOF"


def test_manifests_are_the_walkthrough_objects() -> None:
    template = yaml.safe_load(manifests.template_yaml("single-gpu", manifests.one_gpu()))
    assert template["spec"]["spec"]["devices"]["requests"] == [
        {"name": "gpu", "exactly": {"deviceClassName": "gpu.example.com"}}]
    claim = yaml.safe_load(manifests.claim_yaml("batch-gpus", manifests.gpus(3, manifests.CLAIM_INDENT)))
    assert claim["kind"] == "ResourceClaim"
    assert claim["spec"]["devices"]["requests"][0]["exactly"] == {
        "deviceClassName": "gpu.example.com", "allocationMode": "ExactCount", "count": 3}
    pod = yaml.safe_load(manifests.pod_yaml("pod3", "gpu", "resourceClaimTemplateName: single-gpu",
                                       containers=("ctr0", "ctr1"), node="kwok-node-0"))
    assert pod["spec"]["nodeSelector"] == {"kubernetes.io/hostname": "kwok-node-0"}
    assert [c["resources"]["claims"] for c in pod["spec"]["containers"]] == [[{"name": "gpu"}], [{"name": "gpu"}]]
    assert pod["spec"]["resourceClaims"] == [{"name": "gpu", "resourceClaimTemplateName": "single-gpu"}]
    fallback = yaml.safe_load(manifests.template_yaml("h100-or-a100", manifests.first_available(options.FALLBACK)))
    [request] = fallback["spec"]["spec"]["devices"]["requests"]
    assert [(s["name"], s["selectors"][0]["cel"]["expression"]) for s in request["firstAvailable"]] == [
        ("h100", "device.attributes['gpu.example.com'].model == 'H100'"),
        ("a100", "device.attributes['gpu.example.com'].model == 'A100'")]
    assert len(list(yaml.safe_load_all(manifests.documents("a: 1\n", "b: 2\n")))) == 2


def test_models_must_include_the_fallback_pair() -> None:
    assert options.parse_models(None) == []
    assert options.parse_models("H100,A100,L4") == ["H100", "A100", "L4"]
    with pytest.raises(options.DemoError, match="lacks A100"):
        options.parse_models("H100,L4")
    with pytest.raises(options.DemoError, match="'X9'"):
        options.parse_models("H100,A100,X9")


def test_metrics_are_picked_by_exact_name() -> None:
    text = ("# HELP claimwarden_evictions_total x\nclaimwarden_evictions_total{result=\"evicted\"} 1.0\n"
            "claimwarden_evictions_created{result=\"evicted\"} 1.7e9\nclaimwarden_eviction_pending_pods 0.0\n"
            "claimwarden_eviction_pending_pods_other 3.0\n")
    lines = narration.grep_metrics(text, ["claimwarden_evictions_total", "claimwarden_eviction_pending_pods"])
    assert lines == ['claimwarden_evictions_total{result="evicted"} 1.0', "claimwarden_eviction_pending_pods 0.0"]


def test_the_alert_named_is_the_one_in_the_manifests() -> None:
    root = options.repo_root()
    assert root is not None
    rule = metrics.alert_rule(root, metrics.ALERT)
    assert rule is not None and rule["expr"] == "claimwarden_eviction_pending_pods > 0" and rule["for"] == "10m"


def test_hints_repeat_how_claimwarden_was_started() -> None:
    assert narration.self_command(".venv/bin/claimwarden") == ".venv/bin/claimwarden"
    assert narration.self_command("/somewhere/claimwarden/__main__.py") == "claimwarden"
