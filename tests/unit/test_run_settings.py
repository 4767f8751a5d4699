"""`claimwarden run`'s flags become one frozen settings object (cli.run_settings), read from Kopf's memo."""

from __future__ import annotations

import dataclasses
from datetime import timedelta
from pathlib import Path

import kopf
import pytest

from claimwarden import app, cli
from claimwarden import settings as run


def _settings(*flags: str) -> run.RunSettings:
    return cli.run_settings(cli._parser(None).parse_args(["run", *flags]))


def test_the_defaults_are_those_of_the_flags() -> None:
    settings = _settings()
    assert isinstance(settings, run.RunSettings)
    assert settings.controllers == cli.ALL_CONTROLLERS
    assert settings.kubeconfig is None
    assert settings.namespace == "claimwarden-system"
    assert (settings.metrics_address, settings.metrics_port) == ("0.0.0.0", 9090)
    assert (settings.resync_seconds, settings.metrics_cache_seconds) == (300.0, 5.0)
    assert (settings.request_timeout, settings.api_qps, settings.api_burst) == (30.0, 0.0, 1)
    assert settings.workers == 50
    assert settings.election is not None and settings.election.namespace == "claimwarden-system"
    assert (settings.election.lease_seconds, settings.election.renew_deadline_seconds,
            settings.election.retry_seconds) == (15, 10.0, 2.0)
    assert settings.health.workers == 32 and settings.health.breaker.max_fraction == 0.3
    assert (settings.health.eviction_qps, settings.health.eviction_retry_qps) == (10.0, 1.0)
    # Only start-up discovery fills these (cli._run, with dataclasses.replace).
    assert (settings.server_version, settings.podgroup_version) == ("unknown", None)


def test_flags_reach_the_settings() -> None:
    settings = _settings("--controllers=claims,metrics", "--kubeconfig=/tmp/kc", "--namespace=ops",
                         "--metrics-cache-period=0", "--kube-api-qps=20", "--workers=3", "--leader-elect=false",
                         "--breaker-window=60", "--breaker-max-pods=5", "--eviction-burst=0", "--eviction-workers=0",
                         "--eviction-retry-qps=0.5")
    assert settings.controllers == ("claims", "metrics")
    assert (settings.kubeconfig, settings.namespace, settings.workers) == ("/tmp/kc", "ops", 3)
    assert settings.metrics_cache_seconds == 0.0
    assert (settings.api_qps, settings.api_burst) == (20.0, 40)  # the burst defaults to twice the QPS
    assert settings.election is None
    assert settings.health.breaker.window == timedelta(seconds=60) and settings.health.breaker.max_pods == 5
    assert (settings.health.eviction_burst, settings.health.workers) == (1, 1)  # at least one of each
    assert settings.health.eviction_retry_qps == 0.5


def test_an_explicit_burst_wins_and_the_lease_duration_is_whole_seconds() -> None:
    settings = _settings("--kube-api-qps=20", "--kube-api-burst=7", "--leader-elect-lease-duration=20.6",
                         "--namespace=ops")
    assert settings.api_burst == 7
    assert settings.election is not None
    assert (settings.election.lease_seconds, settings.election.namespace) == (21, "ops")


def test_election_durations_that_do_not_fit_together_are_refused() -> None:
    with pytest.raises(cli.SettingsError, match="--leader-elect-lease-duration must be longer"):
        _settings("--leader-elect-lease-duration=5", "--leader-elect-renew-deadline=10")
    assert _settings("--leader-elect=false", "--leader-elect-lease-duration=5").election is None


def test_the_settings_are_frozen() -> None:
    settings = _settings()
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.workers = 1  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.health.workers = 1  # type: ignore[misc]
    found = dataclasses.replace(settings, server_version="v1.36.0", podgroup_version="v1alpha2")
    assert (found.server_version, found.podgroup_version) == ("v1.36.0", "v1alpha2")
    assert settings.server_version == "unknown"


def test_login_reads_the_kubeconfig_from_the_memo(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: lab\n"
        "clusters: [{name: lab, cluster: {server: 'https://127.0.0.1:6443', insecure-skip-tls-verify: true}}]\n"
        "users: [{name: lab, user: {token: secret-token}}]\n"
        "contexts: [{name: lab, context: {cluster: lab, user: lab}}]\n")
    memo = kopf.Memo(run_settings=_settings(f"--kubeconfig={kubeconfig}"))
    info = app.login(settings=kopf.OperatorSettings(), memo=memo)
    assert isinstance(info, kopf.ConnectionInfo)
    assert (info.server, info.token, info.insecure) == ("https://127.0.0.1:6443", "secret-token", True)


def test_the_alert_webhook_is_off_by_default_and_on_with_a_token_file(tmp_path: Path) -> None:
    assert _settings().webhook is None
    assert _settings("--alert-webhook-port=9443").webhook is None  # still no way to authenticate callers
    token = tmp_path / "token"
    token.write_text("t\n")
    settings = _settings(f"--alert-token-file={token}", "--alert-webhook-address=127.0.0.1",
                         "--alert-rate=5", "--alert-burst=7")
    assert settings.webhook is not None and settings.webhook.enabled
    assert (settings.webhook.address, settings.webhook.port, settings.webhook.token_file) == (
        "127.0.0.1", 8443, str(token))
    assert (settings.webhook.rate, settings.webhook.burst) == (5.0, 7)
    assert _settings(f"--alert-token-file={token}", "--alert-webhook-port=0").webhook is None


@pytest.mark.parametrize(("flags", "words"), [
    (["--alert-client-ca-file=/etc/ca.crt"], "needs --alert-tls-cert-file"),
    (["--alert-tls-cert-file=/etc/tls.crt", "--alert-tls-key-file=/etc/tls.key"], "without --alert-token-file"),
    (["--alert-tls-cert-file=/etc/tls.crt"], "go together"),
    (["--alert-token-file=/nonexistent/token"], "/nonexistent/token is not a file"),
])
def test_bad_alert_webhook_flags_are_a_start_up_error(flags: list[str], words: str) -> None:
    with pytest.raises(cli.SettingsError, match=words):
        _settings(*flags)


@pytest.mark.parametrize("flag", ["--alert-rate=0", "--alert-rate=-1", "--alert-rate=fast", "--alert-burst=0"])
def test_alert_rates_must_be_positive(flag: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        _settings(flag)
    assert "--alert-" in capsys.readouterr().err


def test_the_namespace_is_the_pods_own_unless_given(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    namespace_file = tmp_path / "namespace"
    assert cli.own_namespace({}, namespace_file) == "claimwarden-system"  # outside a pod
    namespace_file.write_text("from-the-token\n")
    assert cli.own_namespace({}, namespace_file) == "from-the-token"
    assert cli.own_namespace({"POD_NAMESPACE": "gpu-ops"}, namespace_file) == "gpu-ops"  # the Downward API first
    assert cli.own_namespace({"POD_NAMESPACE": " "}, namespace_file) == "from-the-token"
    monkeypatch.setenv("POD_NAMESPACE", "gpu-ops")
    settings = _settings()
    assert settings.namespace == "gpu-ops"
    assert settings.election is not None and settings.election.namespace == "gpu-ops"
    assert _settings("--namespace=ops").namespace == "ops"  # the flag wins
