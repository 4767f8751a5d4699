"""What Prometheus would see: claimwarden's /metrics after the eviction, and the alert that did not fire."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from ..narration import grep_metrics, sample_sum
from ..options import repo_root
from ..stage import Stage

TITLE = "What Prometheus would see"
ALERT = "ClaimwardenUnhealthyDeviceHasPods"


def play(stage: Stage) -> None:
    names = ["claimwarden_devices", "claimwarden_unhealthy_devices", "claimwarden_eviction_pending_pods",
             "claimwarden_evictions_total", "claimwarden_eviction_latency_seconds_count",
             "claimwarden_eviction_latency_seconds_sum"]

    def scraped() -> list[str] | None:
        lines = grep_metrics(stage.metrics(), names)
        stage.seen = f"{len(lines)} line(s), evictions {sample_sum(lines, 'claimwarden_evictions_total')}"
        return lines if sample_sum(lines, "claimwarden_eviction_latency_seconds_count") >= 1 else None

    lines = stage.wait("claimwarden's /metrics to count the eviction", scraped)
    stage.say("claimwarden's /metrics, which Prometheus scrapes (the Service claimwarden-metrics in a cluster):")
    stage.print(stage.style.command(f"curl -s http://127.0.0.1:{stage.metrics_port}/metrics | "
                                    f"grep -E '^({'|'.join(names)})[{{ ]'"))
    stage.print("\n".join(lines))
    latency = sample_sum(lines, "claimwarden_eviction_latency_seconds_sum") / sample_sum(
        lines, "claimwarden_eviction_latency_seconds_count")
    root = repo_root()
    rule = alert_rule(root, ALERT) if root else None
    if rule is None:
        stage.say(f"(the alert {ALERT} is in manifests/monitoring/prometheusrule.yaml of the repository)")
        return
    stage.say(f"Alert {ALERT} ({rule['expr']}, for {rule['for']}) fires when pods stay on a device marked "
              f"NoExecute for {rule['for']}, for example because a PodDisruptionBudget refuses the eviction.")
    stage.say(f"It did not fire here: claimwarden evicted trainer {latency:.1f}s after the mark "
              f"(claimwarden_eviction_latency_seconds_sum), and no pod is pending now.")
    gone = sample_sum([line for line in lines if 'result="gone"' in line], "claimwarden_evictions_total")
    if gone:
        stage.say(f'result="gone" counts {gone:.0f} later check(s) that found the pod already gone, '
                  'not evictions.')


def alert_rule(root: Path, name: str) -> dict[str, Any] | None:
    """The alerting rule ``name`` from manifests/monitoring/prometheusrule.yaml."""
    path = root / "manifests" / "monitoring" / "prometheusrule.yaml"
    try:
        rule = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError):
        return None
    for group in (rule.get("spec") or {}).get("groups") or []:
        for item in group.get("rules") or []:
            if item.get("alert") == name:
                return dict(item)
    return None
