"""Kopf wiring only: settings, login, start-up and clean-up."""

from __future__ import annotations

import asyncio
import logging
import os
from dataclasses import dataclass
from typing import Any

import kopf
from kubernetes import client as sync_client
from kubernetes import config as sync_config

from . import __version__, metrics

log = logging.getLogger("claimwarden")

ALL_CONTROLLERS = ("claims", "reservations", "health", "metrics")
SERVICE_ACCOUNT_TOKEN = "/var/run/secrets/kubernetes.io/serviceaccount/token"


@dataclass
class RunConfig:
    """What `claimwarden run` was asked to do; set once before Kopf starts."""

    controllers: tuple[str, ...] = ALL_CONTROLLERS
    metrics_address: str = "0.0.0.0"
    metrics_port: int = 9090
    kubeconfig: str | None = None
    workers: int = 8


CONFIG = RunConfig()


def in_cluster() -> bool:
    return bool(os.environ.get("KUBERNETES_SERVICE_HOST")) and os.path.exists(SERVICE_ACCOUNT_TOKEN)


@kopf.on.login()
def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
    """One explicit login, so credentials never depend on which client libraries are installed."""
    if in_cluster() and not CONFIG.kubeconfig:
        return kopf.login_with_service_account(**kwargs)
    return kopf.login_via_client(**kwargs)


# --- start-up and clean-up --------------------------------------------------------------------

@kopf.on.startup()
async def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, **kwargs: Any) -> None:
    settings.scanning.disabled = True
    settings.posting.level = logging.WARNING
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix="claimwarden.io")
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(prefix="claimwarden.io")
    settings.persistence.finalizer = "claimwarden.io/finalizer"
    settings.networking.request_timeout = 60
    settings.networking.connect_timeout = 10
    settings.watching.chunk_size = 500

    version = await asyncio.to_thread(_server_version)
    log.info("claimwarden %s connected to Kubernetes %s; controllers: %s",
             __version__, version, ",".join(CONFIG.controllers))

    if "metrics" in CONFIG.controllers:
        memo.metrics_server = metrics.serve(CONFIG.metrics_address, CONFIG.metrics_port)
        log.info("metrics on http://%s:%d/metrics", CONFIG.metrics_address, CONFIG.metrics_port)


@kopf.on.cleanup()
async def cleanup(memo: kopf.Memo, **_: Any) -> None:
    server = memo.get("metrics_server")
    if server is not None:
        server.shutdown()
        server.server_close()
    log.info("claimwarden stopped")


@kopf.on.probe(id="version")
def probe_version(**_: Any) -> str:
    return __version__


def _server_version() -> str:
    """One synchronous GET /version at start-up: proves the credentials work before watching."""
    if in_cluster() and not CONFIG.kubeconfig:
        sync_config.load_incluster_config()
    else:
        sync_config.load_kube_config(config_file=CONFIG.kubeconfig)
    with sync_client.ApiClient() as api:
        info = sync_client.VersionApi(api).get_code()
    return str(info.git_version)
