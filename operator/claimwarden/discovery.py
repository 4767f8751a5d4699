"""What the server serves, asked once before Kopf starts: its version, the PodGroup API version, our CRDs.

These are plain synchronous calls, made by `cli.py` before the event loop runs, so that a wrong
kubeconfig fails at once with one clear line and the handlers registered match what the server
serves (a PodGroup watch only where PodGroups are served, health's watches only with its CRDs).
"""

from __future__ import annotations

import os

from kubernetes import client as sync_client

from .claims import podgroups
from .health import records
from .kube.login import client_configuration

SERVICE_ACCOUNT_TOKEN = "/var/run/secrets/kubernetes.io/serviceaccount/token"


def in_cluster() -> bool:
    return bool(os.environ.get("KUBERNETES_SERVICE_HOST")) and os.path.exists(SERVICE_ACCOUNT_TOKEN)


def configuration_for(kubeconfig: str | None) -> sync_client.Configuration:
    """The given kubeconfig, else in-cluster credentials when in a pod, else $KUBECONFIG or ~/.kube/config."""
    return client_configuration(kubeconfig, in_cluster() and not kubeconfig)


def records_crd_installed(*, kubeconfig: str | None, plural: str = records.PLURAL) -> bool:
    configuration = configuration_for(kubeconfig)
    with sync_client.ApiClient(configuration) as api:
        try:
            sync_client.CustomObjectsApi(api).list_cluster_custom_object(
                records.GROUP, records.VERSION, plural, limit=1)
        except sync_client.ApiException as exc:
            if exc.status == 404:
                return False
            raise
    return True


def served_podgroup_version(*, kubeconfig: str | None) -> str | None:
    """The newest scheduling.k8s.io version under which the server serves PodGroups (discovery), or None.

    Decided by what the server serves, not by its version: 1.36 serves v1alpha2 and 1.37 v1alpha3 and,
    with --runtime-config, v1beta1 (upstream's controller uses v1beta1 there); none without the
    GenericWorkload gate.
    """
    configuration = configuration_for(kubeconfig)
    with sync_client.ApiClient(configuration) as api:
        for version in podgroups.VERSIONS:
            try:
                resources = sync_client.CustomObjectsApi(api).get_api_resources(podgroups.GROUP, version)
            except sync_client.ApiException as exc:
                if exc.status == 404:
                    continue
                raise
            if any(r.name == podgroups.PLURAL for r in resources.resources or []):
                return version
    return None


def server_version(*, kubeconfig: str | None) -> str:
    """One synchronous GET /version at start-up: proves the credentials work before watching."""
    configuration = configuration_for(kubeconfig)
    with sync_client.ApiClient(configuration) as api:
        info = sync_client.VersionApi(api).get_code()
    return str(info.git_version)
