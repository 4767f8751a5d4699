"""The Alertmanager path with real components (no lab): the shipped counters file, GPU alert rule and
Alertmanager receiver agree with each other and with promtool/amtool, and an XID on a DCGM-shaped series
reaches claimwarden's webhook through a real Prometheus and a real Alertmanager (alerting.py)."""

from __future__ import annotations

import asyncio
import csv
import re
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from claimwarden import cli, metrics
from claimwarden.health.records import DeviceRef
from claimwarden.signals.alerts import Alert, resolve_device
from claimwarden.signals.observations import SOURCE_ALERT, UNHEALTHY, Observation
from claimwarden.signals.webhook import Receiver, WebhookSettings, serve
from claimwarden_lab.binaries import bin_dir
from claimwarden_lab.driver import DEFAULT_MODEL, DRIVER, MODELS, device_uuid, devices
from claimwarden_lab.pki import write_pki
from claimwarden_lab.processes import free_port

from .alerting import MONITORING, alerting, claimwarden_receiver, gpu_rules
from .helpers import wait_for

PROMTOOL, AMTOOL = Path("/usr/bin/promtool"), Path("/usr/bin/amtool")
RULES_NAME = "claimwarden-gpu-rules.yaml"  # what gpu_alerts_test.yaml's rule_files names
LABELS_READ = ("dra_driver_name", "dra_pool_name", "dra_device_name", "UUID", "Hostname", "xid")


def tool(path: Path, target: str) -> str:
    if not (path.is_file() and path.stat().st_mode & 0o111):
        pytest.fail(f"{path} is missing: run `make {target}`", pytrace=False)
    return str(path)


def enabled_counters() -> dict[str, str]:
    """The counters file's enabled fields: name -> Prometheus type."""
    rows = {}
    with (MONITORING / "dcgm-exporter-counters.csv").open() as f:
        for row in csv.reader(line for line in f if line.strip() and not line.lstrip().startswith("#")):
            assert len(row) >= 3, row  # field, type, help (the help may contain commas)
            name, kind = row[0].strip(), row[1].strip()
            assert name not in rows, f"{name} listed twice"
            rows[name] = kind
    return rows


def test_the_counters_file_enables_the_xid_counters_the_rules_read() -> None:
    counters = enabled_counters()
    assert set(counters.values()) <= {"gauge", "counter", "label"}
    assert all(re.fullmatch(r"DCGM_(FI|EXP)_[A-Z0-9_]+", name) for name in counters)
    assert counters["DCGM_EXP_XID_ERRORS_COUNT"] == "gauge"
    assert counters["DCGM_EXP_XID_ERRORS_TOTAL"] == "counter"
    # A -f file replaces dcgm-exporter's defaults: the usual telemetry is listed too.
    assert {"DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_XID_ERRORS"} <= set(counters)
    read = {name for group in gpu_rules()["groups"] for rule in group["rules"]
            for name in re.findall(r"\bDCGM_[A-Z0-9_]+", rule["expr"])}
    assert read and read <= set(counters), read - set(counters)


def test_the_rule_and_the_receiver_route_agree() -> None:
    [group] = gpu_rules()["groups"]
    rules = {r["alert"]: r for r in group["rules"]}
    assert set(rules) == {"GPUXidError"}
    rule = rules["GPUXidError"]
    # No aggregation: every label of the series, those claimwarden reads among them, reaches the alert.
    assert not re.search(r"\b(sum|max|min|avg|count)\b|\bby\b|\bwithout\b", rule["expr"])
    assert "for" not in rule
    shipped = claimwarden_receiver()
    [matcher] = shipped["route"]["matchers"]
    key, value = matcher.split("=")
    assert rule["labels"][key] == value.strip('"')
    assert set(shipped["route"]["group_by"]) >= {"alertname", "UUID", "xid"}
    [webhook] = shipped["receiver"]["webhook_configs"]
    assert webhook["url"].endswith("/alerts") and webhook["send_resolved"] is False
    assert webhook["http_config"]["authorization"]["type"] == "Bearer"
    assert webhook["http_config"]["authorization"]["credentials_file"]


def test_promtool_checks_and_unit_tests_the_gpu_rules(tmp_path: Path) -> None:
    promtool = tool(PROMTOOL, "prometheus")
    (tmp_path / RULES_NAME).write_text(yaml.safe_dump(gpu_rules(), sort_keys=False))
    shutil.copy(MONITORING / "gpu_alerts_test.yaml", tmp_path / "gpu_alerts_test.yaml")
    checked = subprocess.run([promtool, "check", "rules", RULES_NAME], cwd=tmp_path, capture_output=True,
                             text=True, timeout=60)
    assert checked.returncode == 0 and "SUCCESS: 1 rules found" in checked.stdout, checked.stdout + checked.stderr
    unit = yaml.safe_load((tmp_path / "gpu_alerts_test.yaml").read_text())
    assert unit["rule_files"] == [RULES_NAME]
    fired = [c for t in unit["tests"] for c in t["alert_rule_test"] if c["exp_alerts"]]
    assert any(set(LABELS_READ) <= set(a["exp_labels"]) for c in fired for a in c["exp_alerts"])
    tested = subprocess.run([promtool, "test", "rules", "gpu_alerts_test.yaml"], cwd=tmp_path,
                            capture_output=True, text=True, timeout=60)
    assert tested.returncode == 0, tested.stdout + tested.stderr


def test_amtool_accepts_the_receiver() -> None:
    receiver = MONITORING / "alertmanager-receiver.yaml"
    result = subprocess.run([tool(AMTOOL, "alertmanager"), "check-config", str(receiver)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and "SUCCESS" in result.stdout, result.stdout + result.stderr


# --- the chain --------------------------------------------------------------------------------------

NODE = "node-1"
SLICES = [{"spec": {"driver": DRIVER, "nodeName": NODE, "pool": {"name": NODE, "generation": 1},
                    "devices": devices(NODE, 4, MODELS[DEFAULT_MODEL])}}]


@dataclass
class Recorder:
    """The sink: what the webhook would write, with when it arrived."""

    written: list[tuple[float, DeviceRef, Observation]] = field(default_factory=list)

    async def __call__(self, pairs: list[tuple[DeviceRef, Observation]]) -> None:
        now = time.time()
        self.written.extend((now, ref, o) for ref, o in pairs)

    def about(self, ref: DeviceRef) -> list[tuple[float, Observation]]:
        return [(at, o) for at, r, o in list(self.written) if r == ref]


@dataclass
class Webhook:
    receiver: Receiver
    recorder: Recorder
    token_file: Path


@contextmanager
def running(settings: WebhookSettings) -> Iterator[Webhook]:
    """The real receiver (`serve`) on an event loop of its own thread, writing to a Recorder."""
    assert settings.token_file is not None
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="webhook loop", daemon=True)
    thread.start()
    recorder = Recorder()

    def resolve(alert: Alert) -> DeviceRef | None:
        return resolve_device(alert, SLICES)

    receiver = asyncio.run_coroutine_threadsafe(serve(settings, recorder, resolve, lambda: True), loop).result(30)
    try:
        yield Webhook(receiver, recorder, Path(settings.token_file))
    finally:
        asyncio.run_coroutine_threadsafe(receiver.stop(), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


@pytest.fixture
def webhook(tmp_path: Path) -> Iterator[Webhook]:
    token_file = tmp_path / "receiver-token"
    token_file.write_text("right-token\n")
    with running(WebhookSettings(address="127.0.0.1", port=free_port(), token_file=str(token_file))) as running_:
        yield running_


def requests_answered(code: str) -> float:
    return metrics.REGISTRY.get_sample_value("claimwarden_webhook_requests_total", {"code": code}) or 0.0


def test_an_xid_reaches_the_webhook_through_prometheus_and_alertmanager(webhook: Webhook, tmp_path: Path) -> None:
    """dra_* labels and UUID+Hostname both resolve; a wrong token is refused (401, nothing written) until the
    receiver's token file is rotated to it, and Alertmanager's next notification then gets through."""
    am_token = tmp_path / "alertmanager-token"
    am_token.write_text("right-token\n")
    allocated = DeviceRef(DRIVER, NODE, "gpu-3")
    idle = DeviceRef(DRIVER, NODE, "gpu-1")
    with alerting(webhook.receiver.url, am_token, tmp_path / "chain") as chain:
        started = time.time()
        chain.set_xid({"dra_driver_name": DRIVER, "dra_pool_name": NODE, "dra_device_name": "gpu-3",
                       "UUID": device_uuid(NODE, 3).upper(), "Hostname": NODE, "gpu": "3"}, 79)
        try:
            [(arrived, observation)] = wait_for("GPUXidError on gpu-3 at the webhook",
                                                lambda: webhook.recorder.about(allocated), 90)
        except AssertionError:
            raise AssertionError(f"firing in Prometheus: {chain.firing()}\n{chain.logs()}") from None
        assert (observation.source, observation.signal, observation.value, observation.state) == (
            SOURCE_ALERT, "GPUXidError", "79", UNHEALTHY)
        # startsAt is when Prometheus found the alert active: scrape and rule evaluation before it,
        # Alertmanager (group_wait 1 s) and the webhook after it.
        print(f"XID series set -> webhook: {arrived - started:.1f} s (-> Prometheus active "
              f"{observation.at.timestamp() - started:.1f} s, -> webhook {arrived - observation.at.timestamp():.1f} s)")

        # Alertmanager with a token the receiver does not know: refused, counted, nothing written.
        am_token.write_text("rotated-token\n")
        refused_before, failed_before = requests_answered("401"), chain.notifications_failed()
        chain.set_xid({"UUID": device_uuid(NODE, 1), "Hostname": NODE, "gpu": "1"}, 48)
        wait_for("the webhook to refuse Alertmanager's call (401)",
                 lambda: requests_answered("401") > refused_before, 90)
        wait_for("Alertmanager to count the failed notification",
                 lambda: chain.notifications_failed() > failed_before, 30)
        assert webhook.recorder.about(idle) == []
        # The receiver's Secret catches up: Alertmanager's next try (group_interval) is written.
        webhook.token_file.write_text("right-token\nrotated-token\n")
        [(_, observation)] = wait_for("GPUXidError on gpu-1 (by UUID) after the rotation",
                                      lambda: webhook.recorder.about(idle), 90)
        assert (observation.signal, observation.value) == ("GPUXidError", "48")
        # Alertmanager re-sends groups; the first alert was still written once.
        assert len(webhook.recorder.about(allocated)) == 1


def test_the_alerting_overlay_turns_the_webhook_on_with_its_secrets_and_service() -> None:
    kubectl = bin_dir() / "kubectl"
    rendered = subprocess.run([str(kubectl), "kustomize", str(MONITORING.parent / "alerting")],
                              capture_output=True, text=True, timeout=60)
    assert rendered.returncode == 0, rendered.stderr
    docs = list(yaml.safe_load_all(rendered.stdout))
    [deployment] = [d for d in docs if d["kind"] == "Deployment"]
    [service] = [d for d in docs if d["kind"] == "Service" and d["metadata"]["name"] == "claimwarden-webhook"]
    pod = deployment["spec"]["template"]["spec"]
    [container] = pod["containers"]
    args = container["args"]
    assert "--metrics-port=9090" in args  # the base's flags are kept
    # The flags parse, enable the webhook and point into the mounted Secrets.
    parsed = cli._parser(None).parse_args(["run", *args])
    settings = WebhookSettings(address=parsed.alert_webhook_address, port=parsed.alert_webhook_port,
                               token_file=parsed.alert_token_file, tls_cert_file=parsed.alert_tls_cert_file,
                               tls_key_file=parsed.alert_tls_key_file, client_ca_file=parsed.alert_client_ca_file)
    assert settings.enabled and settings.tls
    assert [p for p in settings.problems() if "is not a file" not in p] == []
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    secrets = {v["name"]: v["secret"]["secretName"] for v in pod["volumes"] if "secret" in v}
    assert secrets == {"webhook-token": "claimwarden-webhook", "webhook-tls": "claimwarden-webhook-tls"}
    assert Path(settings.token_file or "").parent == Path(mounts["webhook-token"])
    assert {Path(settings.tls_cert_file or "").parent, Path(settings.tls_key_file or "").parent} == {
        Path(mounts["webhook-tls"])}
    [port] = [p for p in container["ports"] if p["name"] == "webhook"]
    assert port["containerPort"] == settings.port == 8443
    assert service["spec"]["ports"] == [{"name": "webhook", "port": 8443, "targetPort": "webhook"}]
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]
    # The shipped receiver posts to this Service.
    [webhook] = claimwarden_receiver()["receiver"]["webhook_configs"]
    assert webhook["url"] == "https://claimwarden-webhook.claimwarden-system.svc:8443/alerts"


def test_alertmanager_posts_over_mtls_with_its_client_certificate(tmp_path: Path) -> None:
    """The shipped receiver's tls_config with a client certificate, against the webhook with
    --alert-client-ca-file and a token: both are checked, and the alert arrives."""
    pki = tmp_path / "pki"
    write_pki(pki)  # a CA, a serving certificate for 127.0.0.1, a client certificate
    token_file = tmp_path / "token"
    token_file.write_text("right-token\n")
    settings = WebhookSettings(address="127.0.0.1", port=free_port(), token_file=str(token_file),
                               tls_cert_file=str(pki / "apiserver.crt"), tls_key_file=str(pki / "apiserver.key"),
                               client_ca_file=str(pki / "ca.crt"))
    with running(settings) as hook:
        assert hook.receiver.url.startswith("https://")
        tls = {"ca_file": str(pki / "ca.crt"), "cert_file": str(pki / "admin.crt"), "key_file": str(pki / "admin.key")}
        with alerting(hook.receiver.url, token_file, tmp_path / "chain", tls_config=tls) as chain:
            chain.set_xid({"dra_driver_name": DRIVER, "dra_pool_name": NODE, "dra_device_name": "gpu-0"}, 94)
            try:
                [(_, observation)] = wait_for("GPUXidError over mTLS at the webhook",
                                              lambda: hook.recorder.about(DeviceRef(DRIVER, NODE, "gpu-0")), 90)
            except AssertionError:
                raise AssertionError(chain.logs()) from None
            assert observation.value == "94"
