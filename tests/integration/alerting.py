"""The Alertmanager chain with real components: a DCGM-shaped exporter, Prometheus, Alertmanager.

    with alerting(target_url, token_file) as chain:
        chain.set_xid({"dra_driver_name": ..., "dra_pool_name": ..., "dra_device_name": ..., "UUID": ...,
                       "Hostname": ...}, 79)
        ... the webhook at target_url receives GPUXidError for that device

- the exporter is an http.server thread serving `DCGM_EXP_XID_ERRORS_COUNT` series, as dcgm-exporter does with
  manifests/monitoring/dcgm-exporter-counters.csv; the test changes them with `set_xid` / `clear_xid`;
- Prometheus (/usr/bin/prometheus, Debian) scrapes it every second and evaluates the shipped
  manifests/monitoring/gpu-prometheusrule.yaml every second;
- Alertmanager (/usr/bin/prometheus-alertmanager, Debian; `make alertmanager`) routes with the shipped
  manifests/monitoring/alertmanager-receiver.yaml, its waits shortened to a second, posting to `target_url`
  with the bearer token of `token_file` (read by Alertmanager on every call).

No lab is needed: the webhook is whatever listens at `target_url` (an in-process `serve(...)` or a
`claimwarden run --alert-token-file`).
"""

from __future__ import annotations

import http.server
import json
import subprocess
import tempfile
import threading
import urllib.parse
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml

from claimwarden_lab.processes import free_port

from .helpers import stop_process, wait_for
from .operator import fetch

MONITORING = Path(__file__).resolve().parents[2] / "manifests" / "monitoring"
PROMETHEUS, ALERTMANAGER = Path("/usr/bin/prometheus"), Path("/usr/bin/prometheus-alertmanager")
METRIC = "DCGM_EXP_XID_ERRORS_COUNT"


def binary(path: Path, make_target: str) -> str:
    if not (path.is_file() and path.stat().st_mode & 0o111):
        pytest.fail(f"{path} is missing: run `make {make_target}`", pytrace=False)
    return str(path)


def gpu_rules() -> dict[str, Any]:
    """The shipped GPU alert rules as a plain rules file (the PrometheusRule's spec)."""
    spec: dict[str, Any] = yaml.safe_load((MONITORING / "gpu-prometheusrule.yaml").read_text())["spec"]
    return spec


def claimwarden_receiver() -> dict[str, Any]:
    """The shipped Alertmanager route and receiver for claimwarden."""
    config = yaml.safe_load((MONITORING / "alertmanager-receiver.yaml").read_text())
    [route] = [r for r in config["route"]["routes"] if r["receiver"] == "claimwarden"]
    [receiver] = [r for r in config["receivers"] if r["name"] == "claimwarden"]
    return {"route": route, "receiver": receiver}


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


class Exporter:
    """Serves DCGM_EXP_XID_ERRORS_COUNT series on 127.0.0.1; the test sets them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._series: dict[tuple[tuple[str, str], ...], float] = {}
        exporter = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = exporter.exposition().encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = int(self._server.server_address[1])
        self._thread = threading.Thread(target=self._server.serve_forever, name="dcgm-exporter", daemon=True)
        self._thread.start()

    def set(self, labels: Mapping[str, str], value: float) -> None:
        with self._lock:
            self._series[tuple(sorted(labels.items()))] = value

    def exposition(self) -> str:
        with self._lock:
            series = dict(self._series)
        lines = [f"# HELP {METRIC} Count of XID errors within the time window.", f"# TYPE {METRIC} gauge"]
        for labels, value in sorted(series.items()):
            text = ",".join(f'{k}="{_escape(v)}"' for k, v in labels)
            lines.append(f"{METRIC}{{{text}}} {value:g}")
        return "\n".join(lines) + "\n"

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()


class Server:
    """One Debian server process on a free port, logging to `directory/<name>.log`."""

    def __init__(self, name: str, args: list[str], directory: Path, port: int) -> None:
        self.name, self.port = name, port
        self.url = f"http://127.0.0.1:{port}"
        self.log = directory / f"{name}.log"
        with self.log.open("wb") as log:
            self.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)

    def ready(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"{self.name} exited with {self.proc.returncode}:\n{self.log_tail()}")
        return fetch(f"{self.url}/-/ready") is not None

    def metric(self, name: str, **labels: str) -> float:
        """The sum of a metric's samples in the server's own /metrics whose labels include `labels`."""
        total = 0.0
        for line in (fetch(f"{self.url}/metrics") or "").splitlines():
            if not line.startswith(name + "{") and not line.startswith(name + " "):
                continue
            if all(f'{k}="{v}"' in line for k, v in labels.items()):
                total += float(line.rsplit(" ", 1)[1])
        return total

    def stop(self) -> None:
        stop_process(self.proc, 20)

    def log_tail(self, lines: int = 30) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])


class Chain:
    """What a test drives: the exporter's series, and the servers to look into."""

    def __init__(self, exporter: Exporter, prometheus: Server, alertmanager: Server) -> None:
        self.exporter, self.prometheus, self.alertmanager = exporter, prometheus, alertmanager

    def set_xid(self, labels: Mapping[str, str], value: int | str, count: float = 1) -> None:
        """The GPU of `labels` had XID `value`, `count` times within the exporter's window."""
        self.exporter.set({**labels, "xid": str(value)}, count)

    def clear_xid(self, labels: Mapping[str, str], value: int | str) -> None:
        """The window passed without that XID (its count back to 0, as dcgm-exporter reports it)."""
        self.exporter.set({**labels, "xid": str(value)}, 0)

    def scraped(self) -> bool:
        query = urllib.parse.urlencode({"query": 'up{job="dcgm-exporter"}'})
        text = fetch(f"{self.prometheus.url}/api/v1/query?{query}")
        result = json.loads(text)["data"]["result"] if text else []
        return bool(result) and result[0]["value"][1] == "1"

    def firing(self) -> list[dict[str, Any]]:
        """Prometheus' firing alerts."""
        text = fetch(f"{self.prometheus.url}/api/v1/alerts")
        alerts: list[dict[str, Any]] = json.loads(text)["data"]["alerts"] if text else []
        return [a for a in alerts if a.get("state") == "firing"]

    def notifications_failed(self) -> float:
        """Alertmanager's failed webhook notifications (alertmanager_notifications_failed_total)."""
        return self.alertmanager.metric("alertmanager_notifications_failed_total", integration="webhook")

    def logs(self) -> str:
        return "\n".join(f"--- {s.name}\n{s.log_tail()}" for s in (self.prometheus, self.alertmanager))


@contextmanager
def alerting(target_url: str, token_file: Path, directory: Path | None = None, *,
             tls_config: Mapping[str, str] | None = None) -> Iterator[Chain]:
    """Exporter, Prometheus and Alertmanager, ready, posting to `target_url` with `token_file`'s token (and, for
    an https URL, Alertmanager's `tls_config`: ca_file, cert_file and key_file for mTLS); their configurations,
    data and logs in `directory` (default: a temporary one)."""
    if directory is None:
        with (tempfile.TemporaryDirectory(prefix="alerting-") as temporary,
              alerting(target_url, token_file, Path(temporary), tls_config=tls_config) as chain):
            yield chain
        return
    prometheus_bin, alertmanager_bin = binary(PROMETHEUS, "prometheus"), binary(ALERTMANAGER, "alertmanager")
    directory.mkdir(parents=True, exist_ok=True)
    shipped = claimwarden_receiver()
    route = {**shipped["route"], "group_wait": "1s", "group_interval": "1s"}
    webhook = {**shipped["receiver"]["webhook_configs"][0], "url": target_url}
    webhook["http_config"] = {"authorization": {"type": "Bearer", "credentials_file": str(token_file)}}
    if tls_config is not None:
        webhook["http_config"]["tls_config"] = dict(tls_config)
    (directory / "alertmanager.yml").write_text(yaml.safe_dump({
        "route": {"receiver": "default", "routes": [route]},  # only the shipped route's matchers send to the webhook
        "receivers": [{"name": "default"}, {"name": "claimwarden", "webhook_configs": [webhook]}]}))
    (directory / "gpu-rules.yaml").write_text(yaml.safe_dump(gpu_rules(), sort_keys=False))

    exporter = Exporter()
    servers: list[Server] = []
    try:
        am_port = free_port()
        alertmanager = Server("alertmanager", [
            alertmanager_bin, f"--config.file={directory / 'alertmanager.yml'}",
            f"--storage.path={directory / 'alertmanager-data'}", f"--web.listen-address=127.0.0.1:{am_port}",
            "--cluster.listen-address="], directory, am_port)  # no gossip port: one Alertmanager
        servers.append(alertmanager)
        (directory / "prometheus.yml").write_text(yaml.safe_dump({
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(directory / "gpu-rules.yaml")],
            "alerting": {"alertmanagers": [{"static_configs": [{"targets": [f"127.0.0.1:{am_port}"]}]}]},
            "scrape_configs": [{"job_name": "dcgm-exporter", "scrape_interval": "1s",
                                "static_configs": [{"targets": [f"127.0.0.1:{exporter.port}"]}]}]}))
        prom_port = free_port()
        prometheus = Server("prometheus", [
            prometheus_bin, f"--config.file={directory / 'prometheus.yml'}",
            f"--storage.tsdb.path={directory / 'prometheus-data'}", f"--web.listen-address=127.0.0.1:{prom_port}",
            "--rules.alert.resend-delay=1s"], directory, prom_port)
        servers.append(prometheus)
        for server in servers:
            wait_for(f"{server.name} /-/ready", server.ready, 60)
        chain = Chain(exporter, prometheus, alertmanager)
        # Prometheus applies its scrape targets some seconds after it is ready: wait for the first scrape, so that
        # what a test measures from set_xid on is the chain's own delay.
        wait_for("Prometheus to scrape the exporter", chain.scraped, 60)
        yield chain
    finally:
        for server in servers:
            server.stop()
        exporter.stop()
