"""Alertmanager end to end (issue 21): a DCGM-shaped XID series -> the real Prometheus (the shipped rule) -> the
real Alertmanager (the shipped receiver) -> claimwarden's webhook -> the device's record -> the pod evicted.
A call with a wrong token is refused with 401 and writes nothing."""

from __future__ import annotations

import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client

from claimwarden_lab.cluster import LabState
from claimwarden_lab.processes import free_port

from .alerting import alerting
from .conftest import service_account_kubeconfig
from .health_helpers import events, wait_gone
from .helpers import wait_for
from .operator import Operator
from .signals_helpers import (
    DRIVER,
    apply_policy,
    counter_sum,
    decision,
    delete_policy,
    delete_signal_record,
    observed_record,
    rule,
    run_pod,
    signal_record,
)

POLICY = "alerts"


@pytest.fixture
def receiving(signals_lab: LabState, signals_operator: Operator,
              tmp_path: Path) -> Iterator[tuple[Operator, str, Path]]:
    """A second claimwarden on the signals lab with the webhook on (bearer token); the session's is stopped
    meanwhile (two leaders' writes would be fenced by the lease: only one may lead)."""
    token = tmp_path / "token"
    token.write_text("the-token\n")
    port = free_port()
    operator = Operator(service_account_kubeconfig(signals_lab), tmp_path / "claimwarden.log", [
        "--alert-token-file", str(token), "--alert-webhook-address", "127.0.0.1", "--alert-webhook-port", str(port)])
    signals_operator.stop()
    operator.start()
    try:
        yield operator, f"http://127.0.0.1:{port}/alerts", token
    finally:
        operator.stop()
        signals_operator.start()


def test_an_xid_alert_evicts_the_pod_and_a_wrong_token_writes_nothing(
        signals_api: client.ApiClient, receiving: tuple[Operator, str, Path], signals_namespace: str,
        tmp_path: Path) -> None:
    api, namespace = signals_api, signals_namespace
    operator, url, token = receiving
    pool, device = run_pod(api, namespace, "xid-victim")
    apply_policy(api, POLICY, [rule("fatal-xid", "Alertmanager", "GPUXidError", values=["79"], effect="NoExecute")])
    try:
        # A wrong token: 401, nothing written.
        refused = urllib.request.Request(url, data=b'{"version":"4","alerts":[]}', method="POST",
                                         headers={"Authorization": "Bearer wrong", "Content-Type": "application/json"})
        with pytest.raises(urllib.error.HTTPError) as answer:
            urllib.request.urlopen(refused, timeout=10)
        assert answer.value.code == 401
        assert counter_sum(operator.metrics(), "claimwarden_webhook_requests_total", 'code="401"') >= 1

        am_token = tmp_path / "alertmanager-token"
        am_token.write_text(token.read_text())
        with alerting(url, am_token, tmp_path / "chain") as chain:
            started = time.monotonic()
            chain.set_xid({"dra_driver_name": DRIVER, "dra_pool_name": pool, "dra_device_name": device,
                           "Hostname": pool, "gpu": device.removeprefix("gpu-")}, 79)
            try:
                wait_gone(api, namespace, "xid-victim", 120)
            except AssertionError:
                raise AssertionError(f"firing: {chain.firing()}\n{chain.logs()}\n{operator.log_tail()}") from None
            print(f"XID series set -> pod evicted: {time.monotonic() - started:.1f} s")
            wait_for("the eviction's Event on xid-victim",
                     lambda: events(api, namespace, "xid-victim", "EvictedUnhealthyDevice"))
            record = observed_record(api, pool, device)
            assert record is not None and decision(record)["rule"] == "fatal-xid", record
            [observed] = record["status"]["observations"]
            assert (observed["source"], observed["signal"], observed["value"]) == ("Alertmanager", "GPUXidError", "79")
            # Resolving is not recovery: the series goes, the mark stays.
            chain.clear_xid({"dra_driver_name": DRIVER, "dra_pool_name": pool, "dra_device_name": device,
                             "Hostname": pool, "gpu": device.removeprefix("gpu-")}, 79)
            time.sleep(5)
            assert (signal_record(api, pool, device) or {}).get("spec", {}).get("effect") == "NoExecute"
    finally:
        delete_policy(api, POLICY)
        delete_signal_record(api, pool, device)
