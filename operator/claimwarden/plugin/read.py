"""The plugin's only I/O: one snapshot of the cluster, read with the sync `kubernetes` client, and
the two writes of `mark`/`clear`. Objects stay raw JSON dicts (the shape the pure modules read).

Connection follows kubectl: `--kubeconfig` (else $KUBECONFIG, else ~/.kube/config), `--context`,
and the context's namespace when `-n` is not given.
"""

from __future__ import annotations

import contextlib
import json
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from kubernetes import config
from kubernetes.client.exceptions import ApiException
from kubernetes.config.config_exception import ConfigException

from claimwarden.health import records

from .snapshot import DEFAULT_CLAIMWARDEN_NAMESPACE, Obj, Snapshot

RESOURCE = "/apis/resource.k8s.io/v1"
RECORDS = f"/apis/{records.GROUP}/{records.VERSION}/{records.PLURAL}"
TAINT_RULE_VERSIONS = ("v1", "v1beta2", "v1alpha3")


class ClusterError(Exception):
    """The cluster cannot be reached or refuses; the message says what to check."""


class NotFound(Exception):
    """A named object does not exist."""


class Cluster:
    """A connection to one cluster, as kubectl would make it."""

    def __init__(self, *, kubeconfig: str | None, context: str | None) -> None:
        try:
            self.api = config.new_client_from_config(config_file=kubeconfig, context=context)
            contexts, active = config.list_kube_config_contexts(config_file=kubeconfig)
        except (ConfigException, OSError, TypeError) as exc:
            raise ClusterError(f"cannot load the kubeconfig ({' '.join(str(exc).split())}); "
                               "check --kubeconfig, $KUBECONFIG or --context") from None
        chosen = next((c for c in contexts if c.get("name") == context), active) if context else active
        self.default_namespace = str(((chosen or {}).get("context") or {}).get("namespace") or "default")

    def close(self) -> None:
        self.api.close()

    def request(self, method: str, path: str, body: Any = None, *, content_type: str = "application/json") -> Any:
        """One API call; the decoded JSON, or NotFound; other failures raise ClusterError."""
        status, data = self.call(method, path, body, content_type=content_type)
        if status == 404:
            raise NotFound(path)
        if not 200 <= status <= 299:
            message = data.get("message") or data.get("reason") if isinstance(data, dict) else None
            raise ClusterError(f"{method} {path}: {status} {message or 'refused'}")
        return data

    def call(self, method: str, path: str, body: Any = None, *,
             content_type: str = "application/json") -> tuple[int, Any]:
        """One API call: (HTTP status, decoded JSON body), whatever the status; an unreachable API raises
        ClusterError. For callers that act on refusals, such as an eviction's 429."""
        headers = {"Accept": "application/json", "Content-Type": content_type}
        try:
            method_, url, header_params, body_, post = self.api.param_serialize(
                method, path, header_params=headers, body=body, auth_settings=["BearerToken"])
            response = self.api.call_api(method_, url, header_params=header_params, body=body_, post_params=post,
                                         _request_timeout=30)
            response.read()
        except ApiException as exc:  # older clients raise on a non-2xx status
            with contextlib.suppress(ValueError):
                return int(exc.status or 0), json.loads(exc.body or "{}")
            return int(exc.status or 0), {"message": exc.reason}
        except Exception as exc:
            raise ClusterError(f"cannot reach the Kubernetes API ({type(exc).__name__}: "
                               f"{' '.join(str(exc).split())[:200]}); check --kubeconfig and --context") from None
        data: Any = {}
        if response.data:
            with contextlib.suppress(ValueError):
                data = json.loads(response.data)
        return int(response.status), data

    def list(self, path: str) -> list[Obj] | None:
        """Every item at a list path, or None when the cluster does not serve it."""
        try:
            return list(self.request("GET", path).get("items") or [])
        except NotFound:
            return None

    def get(self, path: str) -> Obj | None:
        try:
            return dict(self.request("GET", path))
        except NotFound:
            return None

    def taint_rule_path(self) -> str | None:
        for version in TAINT_RULE_VERSIONS:
            try:
                resources = self.request("GET", f"/apis/resource.k8s.io/{version}")
            except NotFound:
                continue
            if any(r.get("name") == "devicetaintrules" for r in resources.get("resources") or []):
                return f"/apis/resource.k8s.io/{version}/devicetaintrules"
        return None

    def snapshot(self, *, pods_namespace: str | None = None, pods: bool = True,
                 claimwarden_namespace: str = DEFAULT_CLAIMWARDEN_NAMESPACE) -> Snapshot:
        """Slices, classes, claims, nodes, records, taint rules and pods (all, one namespace or none)."""
        pod_path = (f"/api/v1/namespaces/{pods_namespace}/pods" if pods_namespace else "/api/v1/pods")
        paths = {
            "slices": f"{RESOURCE}/resourceslices", "classes": f"{RESOURCE}/deviceclasses",
            "claims": f"{RESOURCE}/resourceclaims", "nodes": "/api/v1/nodes", "records": RECORDS,
        }
        if pods:
            paths["pods"] = pod_path
        with ThreadPoolExecutor(max_workers=4) as pool:
            futures = {name: pool.submit(self.list, path) for name, path in paths.items()}
            rule_path = pool.submit(self.taint_rule_path).result()
            rules = self.list(rule_path) if rule_path else None
            lists = {name: future.result() for name, future in futures.items()}
        if lists["slices"] is None:
            raise ClusterError("the cluster does not serve resource.k8s.io/v1 (DRA, Kubernetes 1.34+)")
        return Snapshot(slices=lists["slices"] or [], classes=lists["classes"] or [], claims=lists["claims"] or [],
                        pods=lists.get("pods") or [], nodes=lists["nodes"] or [], records=lists["records"] or [],
                        taint_rules=rules, claimwarden_namespace=claimwarden_namespace)
