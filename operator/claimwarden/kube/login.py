"""Credentials from the official client's loaders (kubeconfig with exec plugins, or in-cluster).

Kopf calls the login handler again whenever the API answers 401, and `client_configuration`
loads the kubeconfig afresh each time, so an exec plugin runs again and a rotated token file is
read again. The asyncio client (kube/api.py) reloads through `aio_configuration`.
"""

from __future__ import annotations

import datetime
import os

import kopf
from kubernetes import client, config
from kubernetes.aio import client as aio
from kubernetes.aio import config as aio_config


def client_configuration(kubeconfig: str | None, in_cluster: bool) -> client.Configuration:
    """A loaded client Configuration; ``kubeconfig=None`` means $KUBECONFIG, then ~/.kube/config."""
    configuration = client.Configuration()
    if in_cluster:
        config.load_incluster_config(client_configuration=configuration)
    else:
        config.load_kube_config(config_file=kubeconfig or config.KUBE_CONFIG_DEFAULT_LOCATION,
                                client_configuration=configuration)
    return configuration


async def aio_configuration(kubeconfig: str | None, in_cluster: bool) -> tuple[aio.Configuration,
                                                                             datetime.datetime | None]:
    """A freshly loaded asyncio client Configuration and when its credentials expire, if an exec plugin said.

    In a pod the loader's own hook re-reads the token file every minute, so no expiry is reported.
    """
    configuration = aio.Configuration()
    if in_cluster:
        aio_config.load_incluster_config(client_configuration=configuration)
        return configuration, None
    loader = await aio_config.load_kube_config(config_file=kubeconfig or os.environ.get("KUBECONFIG"),
                                               client_configuration=configuration, persist_config=False)
    expiry = getattr(loader, "exec_plugin_expiry", None)
    return configuration, expiry if isinstance(expiry, datetime.datetime) and expiry.tzinfo else None


def connection_info(configuration: client.Configuration, trust_env: bool) -> kopf.ConnectionInfo:
    """What Kopf needs from a loaded client Configuration (token, client certificate or basic auth)."""
    header = (configuration.get_api_key_with_prefix("BearerToken")
              or configuration.get_api_key_with_prefix("authorization"))
    scheme, token = None, None
    if header:
        parts = header.split(" ", 1)
        scheme, token = (parts[0], parts[1]) if len(parts) == 2 else (None, parts[0])
    return kopf.ConnectionInfo(
        server=configuration.host,
        ca_path=configuration.ssl_ca_cert,
        insecure=not configuration.verify_ssl,
        username=configuration.username or None,
        password=configuration.password or None,
        scheme=scheme,
        token=token,
        certificate_path=configuration.cert_file,
        private_key_path=configuration.key_file,
        trust_env=trust_env,
    )
