"""claimwarden outlives its credentials: an exec plugin's token that is revoked is replaced.

The kubeconfig's user is an exec plugin printing a TokenRequest token of claimwarden's
ServiceAccount bound to a Secret. Deleting the Secret revokes the token at once (401). With a new
token in the plugin's file, claimwarden must carry on writing: Kopf re-runs its login handler
for the watches, and the API adapter reloads its own credentials.
"""

from __future__ import annotations

import datetime
import json
import stat
import uuid
from pathlib import Path

import pytest
import yaml
from kubernetes import client

from claimwarden_lab.cluster import LabState

from .conftest import SERVICE_ACCOUNT
from .helpers import pod_with_claims, template, wait_for
from .operator import Operator

TEMPLATE_CLAIM = [{"name": "gpu", "resourceClaimTemplateName": "single-gpu"}]
TOKEN_SECONDS = 3600  # the plugin reports this expiry: far enough that only the revocation matters


def _bound_token(core: client.CoreV1Api) -> tuple[str, str]:
    """A new Opaque Secret and a token of claimwarden's ServiceAccount bound to it: (secret name, token)."""
    namespace, account = SERVICE_ACCOUNT
    secret = core.create_namespaced_secret(namespace, body={
        "metadata": {"name": f"credentials-test-{uuid.uuid4().hex[:6]}"}, "type": "Opaque"})
    request = core.create_namespaced_service_account_token(account, namespace, body={"spec": {
        "audiences": [], "expirationSeconds": TOKEN_SECONDS,
        "boundObjectRef": {"apiVersion": "v1", "kind": "Secret", "name": secret.metadata.name,
                           "uid": secret.metadata.uid}}})
    return secret.metadata.name, request.status.token


def _write_credential(path: Path, token: str) -> None:
    expires = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=TOKEN_SECONDS)
    path.write_text(json.dumps({"apiVersion": "client.authentication.k8s.io/v1", "kind": "ExecCredential",
                                "status": {"token": token,
                                           "expirationTimestamp": expires.strftime("%Y-%m-%dT%H:%M:%SZ")}}))


def _exec_kubeconfig(lab: LabState, directory: Path) -> tuple[Path, Path]:
    """A kubeconfig whose user runs a plugin that prints ``credential.json``: (kubeconfig, credential file)."""
    credential = directory / "credential.json"
    plugin = directory / "plugin.sh"
    plugin.write_text(f"#!/bin/sh\ncat '{credential}'\n")
    plugin.chmod(plugin.stat().st_mode | stat.S_IXUSR)
    kubeconfig = directory / "exec.kubeconfig"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "claimwarden",
        "clusters": [{"name": "lab", "cluster": {"server": lab.api_url,
                                                 "certificate-authority": str(lab.dir / "pki" / "ca.crt")}}],
        "users": [{"name": "claimwarden", "user": {"exec": {
            "apiVersion": "client.authentication.k8s.io/v1", "command": str(plugin),
            "interactiveMode": "Never"}}}],
        "contexts": [{"name": "claimwarden", "context": {"cluster": "lab", "user": "claimwarden"}}]}))
    return kubeconfig, credential


def _rejected(lab: LabState, token: str) -> bool:
    """True once the API server refuses ``token`` (401), past its authentication cache."""
    configuration = client.Configuration(host=lab.api_url)
    configuration.ssl_ca_cert = str(lab.dir / "pki" / "ca.crt")
    configuration.api_key = {"authorization": f"Bearer {token}"}
    with client.ApiClient(configuration) as api:
        try:
            client.VersionApi(api).get_code()
            client.CoreV1Api(api).list_namespaced_pod(SERVICE_ACCOUNT[0], limit=1)
        except client.ApiException as exc:
            return exc.status == 401
    return False


def _recorded_claim(core: client.CoreV1Api, namespace: str, pod: str) -> str | None:
    statuses = core.read_namespaced_pod(pod, namespace).status.resource_claim_statuses or []
    return next((s.resource_claim_name for s in statuses if s.resource_claim_name), None)


def test_a_revoked_exec_plugin_token_is_replaced_and_writes_carry_on(
        api: client.ApiClient, namespace: str, lab: LabState, operator_process: Operator,
        tmp_path: Path) -> None:
    core, resource = client.CoreV1Api(api), client.ResourceV1Api(api)
    kubeconfig, credential = _exec_kubeconfig(lab, tmp_path)
    first_secret, first_token = _bound_token(core)
    _write_credential(credential, first_token)
    resource.create_namespaced_resource_claim_template(namespace, body=template("single-gpu"))
    claimwarden = Operator(kubeconfig, tmp_path / "claimwarden.log")
    with operator_process.stopped():  # only the claimwarden under test may write claims
        claimwarden.start()
        try:
            core.create_namespaced_pod(namespace, body=pod_with_claims("before", TEMPLATE_CLAIM))
            wait_for("the first pod's claim generated and recorded",
                     lambda: _recorded_claim(core, namespace, "before"), 60)

            second_secret, second_token = _bound_token(core)
            _write_credential(credential, second_token)
            core.delete_namespaced_secret(first_secret, SERVICE_ACCOUNT[0])
            wait_for("the first token refused (401)", lambda: _rejected(lab, first_token), 60)

            core.create_namespaced_pod(namespace, body=pod_with_claims("after", TEMPLATE_CLAIM))
            try:
                claim = wait_for("the second pod's claim generated and recorded",
                                 lambda: _recorded_claim(core, namespace, "after"), 30)
            except AssertionError:
                pytest.fail(f"no claim after the token was revoked; claimwarden's log:\n{claimwarden.log_tail()}")
            assert claim.startswith("after-gpu-")
            assert resource.read_namespaced_resource_claim(claim, namespace).metadata.owner_references[0].name \
                == "after"
            core.delete_namespaced_secret(second_secret, SERVICE_ACCOUNT[0])
        finally:
            code = claimwarden.stop()
    assert code in (None, 0), f"claimwarden exited with {code}; log:\n{claimwarden.log_tail()}"
