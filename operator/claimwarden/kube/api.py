"""The one place claimwarden talks to the Kubernetes API for writes and point reads.

Bodies go in and come out as plain dicts in the API's JSON shape (the same shape Kopf gives
handlers), so the planning functions never see client models.
"""

from __future__ import annotations

import json
import os
from typing import Any
from urllib.parse import quote

from kubernetes.aio import client as aio
from kubernetes.aio import config as aio_config

from ..timestamps import now_rfc3339
from .errors import ApiError

FIELD_MANAGER = "claimwarden"
JSON_PATCH = "application/json-patch+json"
APPLY_PATCH = "application/apply-patch+yaml"
MERGE_PATCH = "application/merge-patch+json"
Body = dict[str, Any]
CORE = "/api/v1"
RESOURCE = "/apis/resource.k8s.io/v1"


class Kube:
    """Thin async adapter over ``kubernetes.aio``; one per operator process."""

    def __init__(self, api_client: aio.ApiClient) -> None:
        self.api_client = api_client

    @classmethod
    async def connect(cls, kubeconfig: str | None, in_cluster: bool) -> Kube:
        configuration = aio.Configuration()
        if in_cluster:
            aio_config.load_incluster_config(client_configuration=configuration)
        else:
            await aio_config.load_kube_config(config_file=kubeconfig or os.environ.get("KUBECONFIG"),
                                              client_configuration=configuration)
        configuration.connection_pool_maxsize = 32
        return cls(aio.ApiClient(configuration))

    async def close(self) -> None:
        await self.api_client.close()

    async def request(self, method: str, path: str, body: Any = None, *, query: dict[str, Any] | None = None,
                      content_type: str = "application/json", allow_missing: bool = False) -> Body | None:
        """One raw request; bodies stay dicts so no field is lost to a client model."""
        headers = {"Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = content_type
        params = await self.api_client.param_serialize(
            method=method, resource_path=path, query_params=list((query or {}).items()), header_params=headers,
            body=body, auth_settings=["BearerToken"])
        response = await self.api_client.call_api(*params, _preload_content=False)
        raw = response.response
        try:
            text = await raw.text()
        finally:
            raw.release()
        if raw.status >= 400:
            if allow_missing and raw.status == 404:
                return None
            raise ApiError.from_response(raw.status, text, raw.headers)
        return json.loads(text) if text else {}

    async def _must(self, method: str, path: str, body: Any = None, **kwargs: Any) -> Body:
        result = await self.request(method, path, body, **kwargs)
        assert result is not None
        return result

    # --- pods -------------------------------------------------------------------------------

    async def get_pod(self, namespace: str, name: str) -> Body | None:
        return await self.request("GET", _path(CORE, namespace, "pods", name), allow_missing=True)

    async def apply_pod_claim_statuses(self, namespace: str, name: str, entries: list[dict[str, str]]) -> Body:
        """Server-side apply of only the given ``status.resourceClaimStatuses`` entries (a map list)."""
        body = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace},
                "status": {"resourceClaimStatuses": entries}}
        return await self._must("PATCH", _path(CORE, namespace, "pods", name, "status"), body,
                                query={"fieldManager": FIELD_MANAGER, "force": "true"}, content_type=APPLY_PATCH)

    # --- resource claims --------------------------------------------------------------------

    async def get_claim(self, namespace: str, name: str) -> Body | None:
        return await self.request("GET", _path(RESOURCE, namespace, "resourceclaims", name), allow_missing=True)

    async def create_claim(self, namespace: str, body: Body) -> Body:
        return await self._must("POST", _path(RESOURCE, namespace, "resourceclaims"), body,
                                query={"fieldManager": FIELD_MANAGER})

    async def patch_claim_status(self, namespace: str, name: str, ops: list[Body]) -> Body:
        """JSON patch of the status subresource; callers include a resourceVersion ``test`` op."""
        return await self._must("PATCH", _path(RESOURCE, namespace, "resourceclaims", name, "status"), ops,
                                query={"fieldManager": FIELD_MANAGER}, content_type=JSON_PATCH)

    async def patch_claim(self, namespace: str, name: str, ops: list[Body]) -> Body:
        return await self._must("PATCH", _path(RESOURCE, namespace, "resourceclaims", name), ops,
                                query={"fieldManager": FIELD_MANAGER}, content_type=JSON_PATCH)

    async def delete_claim(self, namespace: str, name: str, uid: str, resource_version: str | None = None) -> bool:
        """Delete with a UID (and optionally resourceVersion) precondition; False if it was already gone."""
        preconditions = {"uid": uid}
        if resource_version:
            preconditions["resourceVersion"] = resource_version
        body = {"preconditions": preconditions}
        result = await self.request("DELETE", _path(RESOURCE, namespace, "resourceclaims", name), body,
                                    allow_missing=True)
        return result is not None

    async def evict_pod(self, namespace: str, name: str, uid: str) -> None:
        """The Eviction API (PodDisruptionBudgets hold: a 429 raises ApiError), pinned to ``uid``."""
        body = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": name, "namespace": namespace},
                "deleteOptions": {"preconditions": {"uid": uid}}}
        await self._must("POST", _path(CORE, namespace, "pods", name, "eviction"), body)

    async def create_namespace(self, name: str) -> None:
        """Create a namespace; one that already exists is fine."""
        try:
            await self._must("POST", f"{CORE}/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                                             "metadata": {"name": name}})
        except ApiError as exc:
            if exc.status != 409:
                raise

    # --- cluster-scoped objects by group/version/plural -------------------------------------

    async def create_cluster_object(self, group_version: str, plural: str, body: Body) -> Body:
        return await self._must("POST", f"/apis/{group_version}/{plural}", body,
                                query={"fieldManager": FIELD_MANAGER})

    async def list_cluster_objects(self, group_version: str, plural: str) -> list[Body]:
        listing = await self._must("GET", f"/apis/{group_version}/{plural}")
        return list(listing.get("items") or [])

    async def get_cluster_object(self, group_version: str, plural: str, name: str) -> Body | None:
        return await self.request("GET", f"/apis/{group_version}/{plural}/{quote(name, safe='')}",
                                  allow_missing=True)

    async def merge_patch_cluster_object(self, group_version: str, plural: str, name: str, patch: Body,
                                         subresource: str = "") -> Body:
        path = f"/apis/{group_version}/{plural}/{quote(name, safe='')}" + (f"/{subresource}" if subresource else "")
        return await self._must("PATCH", path, patch, query={"fieldManager": FIELD_MANAGER},
                                content_type=MERGE_PATCH)

    async def delete_cluster_object(self, group_version: str, plural: str, name: str) -> bool:
        result = await self.request("DELETE", f"/apis/{group_version}/{plural}/{quote(name, safe='')}",
                                    allow_missing=True)
        return result is not None

    async def served_version(self, group: str, plural: str, versions: tuple[str, ...]) -> str | None:
        """The first of ``versions`` under which the API server serves ``group``/``plural``."""
        for version in versions:
            listing = await self.request("GET", f"/apis/{group}/{version}", allow_missing=True)
            if listing and any(r.get("name") == plural for r in listing.get("resources") or []):
                return version
        return None

    # --- events -----------------------------------------------------------------------------

    async def post_event(self, involved: Body, event_type: str, reason: str, message: str,
                         component: str = "claimwarden") -> None:
        """A core/v1 Event on ``involved`` (a dict with apiVersion, kind and metadata)."""
        meta = involved.get("metadata", {})
        namespace = meta.get("namespace") or "default"
        body = {
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"generateName": f"{meta.get('name', 'object')}.", "namespace": namespace},
            "involvedObject": {"apiVersion": involved.get("apiVersion"), "kind": involved.get("kind"),
                               "name": meta.get("name"), "namespace": meta.get("namespace"),
                               "uid": meta.get("uid"), "resourceVersion": meta.get("resourceVersion")},
            "type": event_type, "reason": reason, "message": message[:1024],
            "source": {"component": component}, "reportingComponent": component,
            "firstTimestamp": now_rfc3339(), "lastTimestamp": now_rfc3339(), "count": 1,
        }
        await self._must("POST", _path(CORE, namespace, "events"), body)


def _path(prefix: str, namespace: str, resource: str, name: str = "", subresource: str = "") -> str:
    parts = [prefix, "namespaces", quote(namespace, safe=""), resource]
    if name:
        parts.append(quote(name, safe=""))
    if subresource:
        parts.append(subresource)
    return "/".join(parts)
