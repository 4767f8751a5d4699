"""claimwarden's alerts and metrics against the real Prometheus tools (bins/install-prometheus.sh).

manifests/monitoring/prometheusrule.yaml is the single source of truth for the alerts: its `spec`
is written to a plain rules file for promtool and for a real Prometheus that scrapes the session's
claimwarden while a device is marked unhealthy.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import urllib.parse
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from claimwarden_lab.cluster import LabState
from claimwarden_lab.processes import free_port

from .conftest import service_account_kubeconfig
from .health_helpers import device_of, mark, unmark, wait_gone
from .helpers import pod_with_claims, stop_process, template, wait_for
from .operator import Operator, fetch

MONITORING = Path(__file__).resolve().parents[2] / "manifests" / "monitoring"
RULES_NAME = "claimwarden-rules.yaml"  # what alerts_test.yaml's rule_files names
JOB = "claimwarden"  # the ServiceMonitor's jobLabel value; the rules match job="claimwarden"
PROMETHEUS, PROMTOOL = Path("/usr/bin/prometheus"), Path("/usr/bin/promtool")
ALERTS = {"ClaimwardenUnhealthyDeviceHasPods", "ClaimwardenEvictionBlockedByPDB", "ClaimwardenEvictionBreakerOpen",
          "ClaimwardenNoLeader", "ClaimwardenClaimNearReservationLimit", "ClaimwardenDown", "ClaimwardenAbsent",
          "ClaimwardenDeviceTaintRuleSelectsEverything", "ClaimwardenClaimPendingTooLong",
          "ClaimwardenApprovalPolicyMissing", "ClaimwardenDeviceHealthUnknown"}


def tool(path: Path) -> str:
    if not (path.is_file() and path.stat().st_mode & 0o111):
        pytest.fail(f"{path} is missing: run bins/install-prometheus.sh", pytrace=False)
    return str(path)


def run(*args: str, stdin: str | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, input=stdin, cwd=cwd, capture_output=True, text=True, timeout=60)


def load(name: str) -> Any:
    return yaml.safe_load((MONITORING / name).read_text())


@pytest.fixture
def rules_dir(tmp_path: Path) -> Path:
    """The PrometheusRule's spec as a plain rules file, next to a copy of alerts_test.yaml."""
    (tmp_path / RULES_NAME).write_text(yaml.safe_dump(load("prometheusrule.yaml")["spec"], sort_keys=False))
    shutil.copy(MONITORING / "alerts_test.yaml", tmp_path / "alerts_test.yaml")
    return tmp_path


def test_the_manifests_agree_on_the_job_and_the_alerts() -> None:
    assert load("kustomization.yaml")["resources"] == ["../base", "servicemonitor.yaml", "prometheusrule.yaml"]
    monitor = load("servicemonitor.yaml")["spec"]
    assert monitor["selector"]["matchLabels"][monitor["jobLabel"]] == JOB
    assert [e["port"] for e in monitor["endpoints"]] == ["metrics"]
    [group] = load("prometheusrule.yaml")["spec"]["groups"]
    rules = {r["alert"]: r for r in group["rules"]}
    assert set(rules) == ALERTS
    for name, rule in rules.items():
        assert rule["labels"]["severity"] in ("warning", "critical"), name
        assert rule["annotations"]["summary"] and rule["annotations"]["description"], name
        if "job=" in rule["expr"]:
            assert f'job="{JOB}"' in rule["expr"], name
    unit = load("alerts_test.yaml")
    assert unit["rule_files"] == [RULES_NAME]
    cases = [case for test in unit["tests"] for case in test["alert_rule_test"]]
    assert {c["alertname"] for c in cases if c["exp_alerts"]} == ALERTS, "each alert shown firing"
    assert {c["alertname"] for c in cases if not c["exp_alerts"]} == ALERTS, "each alert shown not firing"


def test_promtool_checks_the_rules(rules_dir: Path) -> None:
    result = run(tool(PROMTOOL), "check", "rules", str(rules_dir / RULES_NAME))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(ALERTS)} rules found" in result.stdout


def test_promtool_unit_tests_the_alerts(rules_dir: Path) -> None:
    result = run(tool(PROMTOOL), "test", "rules", "alerts_test.yaml", cwd=rules_dir)
    assert result.returncode == 0, result.stdout + result.stderr


def dashboard_exprs() -> list[str]:
    """Every PromQL expression of the Grafana dashboard, in panel order."""
    dashboard = json.loads((MONITORING / "dashboards" / "claimwarden.json").read_text())
    return [target["expr"] for panel in dashboard["panels"] for target in panel.get("targets", [])]


# Dashboard expressions that may be empty in the scenario below, and why; every other one must
# return data there.
MAY_BE_EMPTY = {
    "kube_customresource_unhealthydevice_info": "kube-state-metrics' series: test_kube_state_metrics.py",
    'result="error"': "no reconcile fails in the scenario",
    'result="pdb_blocked"': "no PodDisruptionBudget in the scenario",
    "claimwarden_device_taint_rules_unselective": "the session lab does not serve DeviceTaintRule",
}


def test_the_dashboard_has_its_rows_and_promtool_checks_every_expression(tmp_path: Path) -> None:
    dashboard = json.loads((MONITORING / "dashboards" / "claimwarden.json").read_text())
    rows = [p["title"] for p in dashboard["panels"] if p["type"] == "row"]
    assert rows == ["Inventory", "Claims", "Health", "Controller"]
    exprs = dashboard_exprs()
    assert len(exprs) >= 15 and len(set(exprs)) == len(exprs)
    for expr in exprs:
        if "claimwarden_" in expr:
            assert f'job="{JOB}"' in expr, expr
    # promtool parses PromQL as part of a rules file: one recording rule per expression.
    rules = {"groups": [{"name": "dashboard", "rules": [
        {"record": f"dashboard:expr_{i}", "expr": expr} for i, expr in enumerate(exprs)]}]}
    (tmp_path / "dashboard-rules.yaml").write_text(yaml.safe_dump(rules))
    result = run(tool(PROMTOOL), "check", "rules", str(tmp_path / "dashboard-rules.yaml"))
    assert result.returncode == 0 and f"SUCCESS: {len(exprs)} rules found" in result.stdout, \
        result.stdout + result.stderr


def test_promtool_accepts_the_exposition(claimwarden: Operator) -> None:
    promtool = tool(PROMTOOL)
    result = run(promtool, "check", "metrics", stdin=claimwarden.metrics())
    assert result.returncode == 0, f"promtool check metrics:\n{result.stdout}{result.stderr}"


class Prometheus:
    """One /usr/bin/prometheus on 127.0.0.1 scraping the session's claimwarden (and `more_jobs`) every second."""

    def __init__(self, directory: Path, rules: Path, metrics_port: int,
                 more_jobs: dict[str, int] | None = None) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = directory / "prometheus.log"
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(rules)],
            "scrape_configs": [{"job_name": job, "scrape_interval": "1s",
                                "static_configs": [{"targets": [f"127.0.0.1:{port}"]}]}
                               for job, port in {JOB: metrics_port, **(more_jobs or {})}.items()],
        }
        (directory / "prometheus.yml").write_text(yaml.safe_dump(config))
        with self.log.open("wb") as log:
            self.proc = subprocess.Popen(
                [tool(PROMETHEUS), f"--config.file={directory / 'prometheus.yml'}",
                 f"--storage.tsdb.path={directory / 'data'}", f"--web.listen-address=127.0.0.1:{self.port}"],
                stdout=log, stderr=subprocess.STDOUT)

    def ready(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"prometheus exited with {self.proc.returncode}:\n{self.log_tail()}")
        return fetch(f"{self.url}/-/ready") is not None

    def api(self, path: str) -> Any:
        text = fetch(f"{self.url}/api/v1/{path}")
        assert text is not None, f"prometheus did not answer /api/v1/{path}:\n{self.log_tail()}"
        answer = json.loads(text)
        assert answer["status"] == "success", answer
        return answer["data"]

    def query_all(self, promql: str) -> list[Any]:
        return list(self.api("query?" + urllib.parse.urlencode({"query": promql}))["result"])

    def query(self, promql: str) -> float | None:
        """The value of a query returning at most one sample; None if it returns none."""
        result = self.api("query?" + urllib.parse.urlencode({"query": promql}))["result"]
        assert len(result) <= 1, f"{promql} returned {result}"
        return float(result[0]["value"][1]) if result else None

    def stop(self) -> None:
        stop_process(self.proc, 20)

    def log_tail(self, lines: int = 30) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])


def tainted(exposition: str) -> float:
    return sum(float(line.split()[-1]) for line in exposition.splitlines()
               if line.startswith("claimwarden_devices{") and 'state="tainted"' in line)


def test_prometheus_sees_a_device_marked_evicted_and_cleared(
        api: client.ApiClient, namespace: str, claimwarden: Operator, rules_dir: Path) -> None:
    prometheus = Prometheus(rules_dir, rules_dir / RULES_NAME, claimwarden.metrics_port)
    try:
        wait_for("prometheus /-/ready", prometheus.ready, 60)
        wait_for(f'up{{job="{JOB}"}} == 1', lambda: prometheus.query(f'up{{job="{JOB}"}}') == 1, 30)
        tainted_query = 'sum(claimwarden_devices{state="tainted"})'
        evicted_query = 'sum(claimwarden_evictions_total{result="evicted"})'
        # Baseline once Prometheus agrees with claimwarden (marks cleared by earlier tests may be settling).
        before = wait_for("prometheus and claimwarden agree on the tainted devices", lambda: (
            [value] if (value := tainted(claimwarden.metrics())) == (prometheus.query(tainted_query) or 0) else None),
            30)[0]
        evicted_before = prometheus.query(evicted_query) or 0

        core, resource = client.CoreV1Api(api), client.ResourceV1Api(api)
        resource.create_namespaced_resource_claim_template(namespace, body=template("single-gpu"))
        core.create_namespaced_pod(namespace, body=pod_with_claims(
            "victim", [{"name": "gpu", "resourceClaimTemplateName": "single-gpu"}]))
        wait_for("victim Running", lambda: core.read_namespaced_pod("victim", namespace).status.phase == "Running")
        pool, device = device_of(api, namespace, "victim")
        mark(api, pool, device, "ECC errors seen by prometheus")
        try:
            wait_gone(api, namespace, "victim")
            expected = {
                tainted_query: before + 1,
                evicted_query: evicted_before + 1,
                'sum(claimwarden_unhealthy_devices{effect="NoExecute"})': 1,
                f'up{{job="{JOB}"}}': 1,
            }
            wait_for("prometheus to show the eviction", lambda: all(
                (prometheus.query(q) or 0) >= want for q, want in expected.items()), 30)
            assert prometheus.query(f'up{{job="{JOB}"}}') == 1
            groups = prometheus.api("rules")["groups"]
            [group] = [g for g in groups if g["name"] == "claimwarden"]
            assert {r["name"] for r in group["rules"]} == ALERTS
            assert all(r["health"] == "ok" for r in group["rules"]), group["rules"]
            # Every dashboard panel answers with data where the scenario produces some (rate() and
            # increase() need two scrapes of a series, so give it a few).
            def without_data() -> list[str]:
                return [e for e in dashboard_exprs() if not prometheus.query_all(e)
                        and not any(key in e for key in MAY_BE_EMPTY)]
            try:
                wait_for("data for every dashboard expression", lambda: not without_data(), 20)
            except AssertionError:
                raise AssertionError(f"dashboard expressions without data: {without_data()}") from None
        finally:
            unmark(api, pool, device)
        wait_for(f"prometheus to show {before:g} tainted devices again",
                 lambda: (prometheus.query(tainted_query) or 0) == before, 60)
    finally:
        prometheus.stop()


def test_prometheus_sees_the_eviction_breaker_open_and_close(
        api: client.ApiClient, namespace: str, lab: LabState, claimwarden: Operator, rules_dir: Path,
        tmp_path: Path) -> None:
    """A claimwarden of its own with `--breaker-max-pods=1` (the session's is stopped meanwhile, so that
    one process evicts): two marked pods, one evicted, the breaker open, its alert pending."""
    core, resource = client.CoreV1Api(api), client.ResourceV1Api(api)
    resource.create_namespaced_resource_claim_template(namespace, body=template("single-gpu"))
    for name in ("first", "second"):
        core.create_namespaced_pod(namespace, body=pod_with_claims(
            name, [{"name": "gpu", "resourceClaimTemplateName": "single-gpu"}]))
    for name in ("first", "second"):
        wait_for(f"{name} Running", lambda name=name: core.read_namespaced_pod(name, namespace).status.phase ==
                 "Running")
    devices = [device_of(api, namespace, name) for name in ("first", "second")]
    gauge = 'claimwarden_eviction_breaker_open{driver="gpu.example.com"}'
    with claimwarden.stopped():
        own = Operator(service_account_kubeconfig(lab), tmp_path / "claimwarden.log", extra=["--breaker-max-pods=1"])
        own.start()
        prometheus = Prometheus(rules_dir, rules_dir / RULES_NAME, own.metrics_port)
        try:
            wait_for("prometheus /-/ready", prometheus.ready, 60)
            for pool, device in devices:
                mark(api, pool, device, "two at once")
            wait_for("prometheus to show the breaker open", lambda: prometheus.query(gauge) == 1, 60)
            alerts = wait_for("the alert pending", lambda: [
                a for a in prometheus.api("alerts")["alerts"] if a["labels"]["alertname"] ==
                "ClaimwardenEvictionBreakerOpen"], 30)
            assert alerts[0]["labels"]["driver"] == "gpu.example.com" and alerts[0]["state"] in ("pending", "firing")
            assert (prometheus.query('sum(claimwarden_evictions_deferred_total{reason="breaker"})') or 0) >= 1
            running = [p.metadata.name for p in core.list_namespaced_pod(namespace).items
                       if p.status.phase == "Running" and not p.metadata.deletion_timestamp]
            assert len(running) == 1, running
            for pool, device in devices:
                unmark(api, pool, device)
            wait_for("prometheus to show the breaker closed", lambda: prometheus.query(gauge) == 0, 60)
        finally:
            for pool, device in devices:
                unmark(api, pool, device)
            prometheus.stop()
            own.stop()
