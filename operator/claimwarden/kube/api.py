"""The one place claimwarden talks to the Kubernetes API for writes and point reads.

Bodies go in and come out as plain dicts in the API's JSON shape (the same shape Kopf gives
handlers), so the planning functions never see client models.

Every request has a total timeout (`REQUEST_TIMEOUT` unless told otherwise): a request that gets
no complete answer in time raises `ApiTimeout`, an `ApiError` the work queues retry with back-off.

Writes are fenced: with leader election, the `fence` a `Kube` is built with says how many seconds this
replica may still send writes (leader/elector.py explains the margin it keeps). A write may wait before it
is sent (the client-side budget, a credentials reload, the 401 retry, a pooled connection), so the fence is
asked again right before each send, and the write gets no more time than the fence has left: a write not
sent by then is not sent at all (`NotLeader`, or `ApiTimeout` while waiting for a connection).

Credentials expire: exec plugins hand out short-lived tokens, bound ServiceAccount tokens die
with their object, and in a pod the kubelet rotates the token file. ``kubernetes.aio`` re-reads
the in-cluster token file every minute but never re-runs an exec plugin, so `Kube` reloads the
credentials itself: shortly before the expiry an exec plugin reported, and once after any 401
(then the request is sent again, once). Kopf's own watches re-run the login handler on a 401.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import logging
import math
import urllib.parse
import urllib.request
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import quote

import aiohttp
import orjson
from kubernetes.aio import client as aio

from ..timestamps import now_rfc3339
from ..tokenbucket import TokenBucket
from .errors import ApiError, ApiTimeout, ApiUnreachable, NotLeader, NotServed
from .login import aio_configuration

log = logging.getLogger("claimwarden.kube")

FIELD_MANAGER = "claimwarden"
JSON_PATCH = "application/json-patch+json"
APPLY_PATCH = "application/apply-patch+yaml"
MERGE_PATCH = "application/merge-patch+json"
METADATA_LIST = "application/json;as=PartialObjectMetadataList;v=v1;g=meta.k8s.io,application/json"
Body = dict[str, Any]
CORE = "/api/v1"
RESOURCE = "/apis/resource.k8s.io/v1"
REQUEST_TIMEOUT = 30.0  # seconds, for the whole request: connect, send, wait, read
CONNECTION_POOL = 32
UNLIMITED = 0.0  # --kube-api-qps 0: no client-side limit (the default)

Credentials = tuple[aio.Configuration, datetime.datetime | None]  # a loaded configuration and its expiry
Reload = Callable[[], Awaitable[Credentials]]


def env_proxy(url: str) -> str | None:
    """The proxy $HTTPS_PROXY/$HTTP_PROXY name for ``url``, unless $NO_PROXY exempts its host."""
    parts = urllib.parse.urlsplit(url)
    proxies = urllib.request.getproxies()
    proxy = proxies.get(parts.scheme or "https")
    if not proxy or urllib.request.proxy_bypass(parts.hostname or ""):
        return None
    return proxy


def refresh_due(now: datetime.datetime, loaded_at: datetime.datetime, expires_at: datetime.datetime | None) -> bool:
    """True when credentials loaded at ``loaded_at`` should be reloaded before they expire.

    A minute ahead, or a fifth of their lifetime ahead when that is shorter, so a token that
    lives two minutes is not reloaded before every request.
    """
    if expires_at is None:
        return False
    margin = min(datetime.timedelta(minutes=1), max(expires_at - loaded_at, datetime.timedelta(0)) / 5)
    return now >= expires_at - margin


class Kube:
    """Thin async adapter over ``kubernetes.aio``; one per operator process."""

    def __init__(self, api_client: aio.ApiClient, *, reload: Reload | None = None,
                 expires_at: datetime.datetime | None = None, request_timeout: float = REQUEST_TIMEOUT,
                 user_agent: str = FIELD_MANAGER, qps: float = UNLIMITED, burst: int = 1,
                 fence: Callable[[], float] | None = None) -> None:
        """`fence`: seconds this replica may still send writes (the elector's ``write_time_left``); None without
        leader election: writes are never fenced."""
        self.api_client = api_client
        self.request_timeout = request_timeout
        self.user_agent = user_agent
        api_client.user_agent = user_agent
        # Asked right before each send: 0 or less refuses the write (NotLeader). The leader election's own
        # writes are not fenced (`unfenced`).
        self._fence: Callable[[], float] = fence if fence is not None else (lambda: math.inf)
        self._reload = reload  # None in unit tests: the credentials are then never reloaded
        self._loaded_at = _utcnow()
        self._expires_at = expires_at
        self._refreshing = asyncio.Lock()
        self._retired: set[asyncio.Task[None]] = set()
        # Every request this client sends draws on it (writes, point reads, the lease); Kopf's watches do not.
        self._budget = TokenBucket(qps=qps, burst=burst) if qps > 0 else None

    @classmethod
    async def connect(cls, kubeconfig: str | None, in_cluster: bool, *,
                      request_timeout: float = REQUEST_TIMEOUT, user_agent: str = FIELD_MANAGER,
                      qps: float = UNLIMITED, burst: int = 1, connections: int = CONNECTION_POOL,
                      fence: Callable[[], float] | None = None) -> Kube:
        """`connections`: at most this many requests at once (HTTP/1.1: one connection each); `fence`: as for
        the constructor."""
        async def reload() -> Credentials:
            configuration, expires_at = await aio_configuration(kubeconfig, in_cluster)
            configuration.connection_pool_maxsize = connections
            # kubernetes.aio's session trusts the environment, and aiohttp then looks up the proxy
            # variables and ~/.netrc in a worker thread on every request (two thread hops each, a
            # tenth of the CPU under load). The proxy is looked up once here instead.
            configuration.client_session_kwargs = {"trust_env": False}
            if not configuration.proxy:
                configuration.proxy = env_proxy(configuration.host)
            return configuration, expires_at

        configuration, expires_at = await reload()
        return cls(aio.ApiClient(configuration), reload=reload, expires_at=expires_at,
                   request_timeout=request_timeout, user_agent=user_agent, qps=qps, burst=burst, fence=fence)

    async def close(self) -> None:
        for task in self._retired:
            task.cancel()
        for task in list(self._retired):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        await self.api_client.close()

    async def request(self, method: str, path: str, body: Any = None, *, query: dict[str, Any] | None = None,
                      content_type: str = "application/json", allow_missing: bool = False,
                      accept: str = "application/json", unfenced: bool = False) -> Body | None:
        """One raw request; bodies stay dicts so no field is lost to a client model.

        Every write asks the `fence` before it waits for anything and again right before each send, except
        with `unfenced` (the lease itself). `allow_missing`: None when the object is missing; a 404 for a
        resource the server does not serve still raises (`NotServed`, kube/errors.py).
        """
        fenced = method != "GET" and not unfenced
        self._time_for(fenced, method, path)  # a write refused now waits for nothing first
        if self._reload is not None and refresh_due(_utcnow(), self._loaded_at, self._expires_at):
            await self._refresh(self.api_client, "they expire soon")
        api_client = self.api_client
        await self._spend()
        try:
            return await self._send(api_client, method, path, body, query, content_type, allow_missing, accept,
                                    timeout=self._time_for(fenced, method, path))
        except ApiError as exc:
            if exc.status != 401 or self._reload is None:
                raise
        # The token was revoked or expired early (e.g. its bound object was deleted): reload once, retry once.
        await self._refresh(api_client, f"{method} {path} was refused with 401 Unauthorized")
        await self._spend()
        return await self._send(self.api_client, method, path, body, query, content_type, allow_missing, accept,
                                timeout=self._time_for(fenced, method, path))

    def _time_for(self, fenced: bool, method: str, path: str) -> float:
        """The time a request sent now may take: the request timeout, and for a write no longer than the fence
        still holds; NotLeader when it holds no more."""
        if not fenced:
            return self.request_timeout
        left = self._fence()
        if left <= 0:
            raise NotLeader(method, path)
        return min(self.request_timeout, left)

    async def _spend(self) -> None:
        """Wait for the client-side budget (--kube-api-qps), if there is one."""
        if self._budget is not None:
            wait = self._budget.reserve()
            if wait > 0:
                await asyncio.sleep(wait)

    async def _send(self, api_client: aio.ApiClient, method: str, path: str, body: Any,
                    query: dict[str, Any] | None, content_type: str, allow_missing: bool,
                    accept: str, *, timeout: float) -> Body | None:
        """One request on kubernetes.aio's own session (its Configuration: host, TLS, client certificate,
        proxy) and credentials (its bearer token, which it re-reads in a pod), without its generic
        serialisation layers: bodies are plain dicts, so they go out and come back through orjson.
        About a quarter less client CPU per request, measured against a canned HTTPS responder."""
        configuration = api_client.configuration
        rest = api_client.rest_client
        headers = {**api_client.default_headers, "Accept": accept}
        auth = (await configuration.auth_settings()).get("BearerToken")
        if auth and auth.get("value"):
            headers[auth["key"]] = auth["value"]
        data = None
        if body is not None:
            headers["Content-Type"] = content_type
            data = orjson.dumps(body)
        url = configuration.host + path + (f"?{urllib.parse.urlencode(query)}" if query else "")
        options: dict[str, Any] = {}
        if configuration.tls_server_name:
            options["server_hostname"] = configuration.tls_server_name
        if rest.proxy:
            options["proxy"] = rest.proxy
        if rest.proxy_headers:
            options["proxy_headers"] = rest.proxy_headers
        try:
            async with asyncio.timeout(timeout):
                if rest.pool_manager is None:
                    rest.pool_manager = rest._create_pool_manager()
                async with rest.pool_manager.request(method, url, headers=headers, data=data, **options) as raw:
                    payload = await raw.read()
        except TimeoutError:
            raise ApiTimeout(method, path, timeout) from None
        except (aiohttp.ClientError, OSError) as exc:  # refused, reset, TLS: the apiserver restarting, say
            raise ApiUnreachable(method, path, exc) from None
        if raw.status >= 400:
            error = ApiError.from_response(raw.status, payload.decode("utf-8", "replace"), raw.headers)
            if allow_missing and error.not_found:  # a NotServed 404 is raised: it says nothing of the object
                return None
            raise error
        result: Body = orjson.loads(payload) if payload else {}
        return result

    async def _refresh(self, stale: aio.ApiClient, why: str) -> None:
        """Load the credentials again (re-running an exec plugin) into a new client, once per stale client."""
        assert self._reload is not None
        async with self._refreshing:
            if self.api_client is not stale:
                return  # another request reloaded them meanwhile
            configuration, expires_at = await self._reload()
            self.api_client = aio.ApiClient(configuration)
            self.api_client.user_agent = self.user_agent
            self._loaded_at, self._expires_at = _utcnow(), expires_at
            log.info("API credentials reloaded: %s", why)
        # Requests in flight on the old client finish (or time out) before it is closed.
        task = asyncio.create_task(self._close_later(stale), name="close-stale-api-client")
        self._retired.add(task)
        task.add_done_callback(self._retired.discard)

    async def _close_later(self, api_client: aio.ApiClient) -> None:
        try:
            await asyncio.sleep(self.request_timeout + 1)
        finally:
            await api_client.close()

    async def _must(self, method: str, path: str, body: Any = None, **kwargs: Any) -> Body:
        result = await self.request(method, path, body, **kwargs)
        assert result is not None
        return result

    # --- pods -------------------------------------------------------------------------------

    async def get_pod(self, namespace: str, name: str) -> Body | None:
        return await self.request("GET", _path(CORE, namespace, "pods", name), allow_missing=True)

    async def list_pods_on_node(self, node: str) -> list[Body]:
        """Every pod bound to `node` (a field selector on spec.nodeName: the cache holds only pods with claims)."""
        result = await self._must("GET", f"{CORE}/pods", query={"fieldSelector": f"spec.nodeName={node}"})
        return list(result.get("items") or [])

    async def apply_pod_claim_statuses(self, namespace: str, name: str, entries: list[dict[str, str]]) -> Body:
        """Server-side apply of only the given ``status.resourceClaimStatuses`` entries (a map list)."""
        body = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace},
                "status": {"resourceClaimStatuses": entries}}
        return await self._must("PATCH", _path(CORE, namespace, "pods", name, "status"), body,
                                query={"fieldManager": FIELD_MANAGER, "force": "true"}, content_type=APPLY_PATCH)

    # --- PodGroups (scheduling.k8s.io, at the version the server serves) ----------------------

    async def get_podgroup(self, version: str, namespace: str, name: str) -> Body | None:
        return await self.request("GET", _path(f"/apis/scheduling.k8s.io/{version}", namespace, "podgroups", name),
                                  allow_missing=True)

    async def apply_podgroup_claim_statuses(self, version: str, namespace: str, name: str,
                                            entries: list[dict[str, str]]) -> Body:
        """Server-side apply of only the given ``status.resourceClaimStatuses`` entries (a map list)."""
        body = {"apiVersion": f"scheduling.k8s.io/{version}", "kind": "PodGroup",
                "metadata": {"name": name, "namespace": namespace}, "status": {"resourceClaimStatuses": entries}}
        return await self._must("PATCH", _path(f"/apis/scheduling.k8s.io/{version}", namespace, "podgroups", name,
                                               "status"), body,
                                query={"fieldManager": FIELD_MANAGER, "force": "true"}, content_type=APPLY_PATCH)

    # --- resource claims and templates ------------------------------------------------------

    async def get_template(self, namespace: str, name: str) -> Body | None:
        return await self.request("GET", _path(RESOURCE, namespace, "resourceclaimtemplates", name),
                                  allow_missing=True)

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

    async def evict_pod(self, namespace: str, name: str, uid: str, resource_version: str | None = None) -> None:
        """The Eviction API (PodDisruptionBudgets hold: a 429 raises ApiError), pinned to ``uid`` and, when
        given, to ``resource_version``: the server then refuses with 409 if the pod changed since it was read."""
        preconditions = {"uid": uid}
        if resource_version:
            preconditions["resourceVersion"] = resource_version
        body = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": name, "namespace": namespace},
                "deleteOptions": {"preconditions": preconditions}}
        await self._must("POST", _path(CORE, namespace, "pods", name, "eviction"), body)

    async def create_namespace(self, name: str, *, unfenced: bool = False) -> None:
        """Create a namespace; one that already exists is fine."""
        try:
            await self._must("POST", f"{CORE}/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                                             "metadata": {"name": name}}, unfenced=unfenced)
        except ApiError as exc:
            if exc.status != 409:
                raise

    # --- any kind, by API path prefix and plural -----------------------------------------

    async def list_uids(self, api: str, plural: str, page: int = 500) -> set[str]:
        """The UIDs of every object of a kind, from metadata-only pages (cheap even at 10,000 pods)."""
        return {str(meta.get("uid")) for meta in await self.list_metadata(api, plural, page)}

    async def list_metadata(self, api: str, plural: str, page: int = 500) -> list[Body]:
        """Every object of a kind (in every namespace) as its metadata alone, from metadata-only pages."""
        found: list[Body] = []
        query: dict[str, Any] = {"limit": page}
        while True:
            listing = await self._must("GET", f"{api}/{plural}", query=query, accept=METADATA_LIST)
            found.extend(item.get("metadata") or {} for item in listing.get("items") or [])
            token = (listing.get("metadata") or {}).get("continue")
            if not token:
                return found
            query = {"limit": page, "continue": token}

    async def get_object(self, api: str, plural: str, name: str, *, namespace: str | None) -> Body | None:
        """One object by name (namespaced when `namespace` is given), or None when there is none."""
        path = _path(api, namespace, plural, name) if namespace is not None else \
            f"{api}/{plural}/{quote(name, safe='')}"
        return await self.request("GET", path, allow_missing=True)

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

    async def delete_cluster_object(self, group_version: str, plural: str, name: str, *, uid: str | None = None,
                                    resource_version: str | None = None) -> bool:
        """False when it is gone already. `uid`, `resource_version`: delete only that very version (409 if not)."""
        preconditions = {key: value for key, value in (("uid", uid), ("resourceVersion", resource_version)) if value}
        result = await self.request("DELETE", f"/apis/{group_version}/{plural}/{quote(name, safe='')}",
                                    {"preconditions": preconditions} if preconditions else None, allow_missing=True)
        return result is not None

    async def served_version(self, group: str, plural: str, versions: tuple[str, ...]) -> str | None:
        """The first of ``versions`` under which the API server serves ``group``/``plural``."""
        for version in versions:
            try:
                listing = await self.request("GET", f"/apis/{group}/{version}")
            except NotServed:
                continue
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


def _utcnow() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)
