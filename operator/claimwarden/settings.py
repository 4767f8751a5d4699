"""What `claimwarden run` was asked to do, as one frozen object.

`cli.py` builds it from the flags, adds what the server serves (`discovery.py`) and puts it in
Kopf's memo; every handler reads it back with `run_settings_of`, as Kopf hands its own
`OperatorSettings` around. Nothing changes it after start-up.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import kopf

from .handoff.controller import HandoffSettings
from .health.controller import HealthSettings
from .leader.elector import ElectionSettings
from .signals.webhook import WebhookSettings


@dataclass(frozen=True)
class RunSettings:
    """What `claimwarden run` was asked to do and what it found at start-up.

    It is not called `settings` in the memo because Kopf's handlers already take a `settings`
    keyword: Kopf's own.
    """

    controllers: tuple[str, ...]
    metrics_address: str
    metrics_port: int
    kubeconfig: str | None
    namespace: str
    workers: int
    request_timeout: float  # seconds per API request of the controllers (Kube)
    api_qps: float  # Kube's client-side budget (--kube-api-qps); 0 = no limit
    api_burst: int
    resync_seconds: float
    metrics_cache_seconds: float  # how long a computed gauge is served again (--metrics-cache-period)
    election: ElectionSettings | None  # None with --leader-elect=false: this process leads at once
    health: HealthSettings
    webhook: WebhookSettings | None = None  # Alertmanager's receiver (signals/webhook.py); None or not enabled: off
    handoff: HandoffSettings = field(default_factory=HandoffSettings)  # docs/guides/handoff-to-repair.md
    readiness: str = ""  # the /readyz URL to serve (runtime/server.py); "" serves none
    liveness: str = ""  # the /healthz URL to serve (runtime/server.py); "" serves none
    # Discovered from the server before Kopf starts (cli.py replaces these defaults):
    server_version: str = "unknown"
    podgroup_version: str | None = None  # the served scheduling.k8s.io version of PodGroups, None if none


def run_settings_of(memo: kopf.Memo) -> RunSettings:
    """The settings `cli.py` put in the memo that Kopf hands to every handler."""
    settings: RunSettings = memo["run_settings"]
    return settings
