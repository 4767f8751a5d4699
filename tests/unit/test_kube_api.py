"""The API adapter's own guarantees: a bounded time per request, when credentials are reloaded, and the fence."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from kubernetes.aio import client as aio

from claimwarden.kube.api import Kube, refresh_due
from claimwarden.kube.errors import ApiError, ApiTimeout, ApiUnreachable, NotLeader, NotServed
from claimwarden.runtime.workqueue import WorkQueue, run_workers
from claimwarden.tokenbucket import TokenBucket


async def _silent_peer() -> tuple[asyncio.Server, int]:
    """A TCP server that accepts connections and never answers (a hung API server or a black hole)."""
    async def hold(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read()  # until the client gives up and closes

    server = await asyncio.start_server(hold, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


def _kube(port: int, timeout: float, fence: Callable[[], float] | None = None) -> Kube:
    configuration = aio.Configuration(host=f"http://127.0.0.1:{port}")
    return Kube(aio.ApiClient(configuration), request_timeout=timeout, fence=fence)


@pytest.mark.parametrize("call", ["evict", "get"])
def test_a_request_without_an_answer_times_out_with_an_api_error(call: str) -> None:
    async def scenario() -> None:
        server, port = await _silent_peer()
        kube = _kube(port, 0.3)
        began = time.monotonic()
        try:
            with pytest.raises(ApiTimeout) as timed_out:
                if call == "evict":
                    await kube.evict_pod("default", "web-0", "uid-1")
                else:
                    await kube.get_pod("default", "web-0")
        finally:
            await kube.close()
            server.close()
        assert time.monotonic() - began < 2
        assert isinstance(timed_out.value, ApiError)
        assert "no answer within 0.3 s" in str(timed_out.value)

    asyncio.run(scenario())


def test_a_timed_out_reconcile_is_retried_with_back_off() -> None:
    attempts: list[float] = []

    async def scenario() -> None:
        server, port = await _silent_peer()
        kube = _kube(port, 0.1)
        queue = WorkQueue("test-timeout", base_delay=0.05)

        async def reconcile(key: object) -> None:
            attempts.append(time.monotonic())
            await kube.get_pod("default", str(key))

        workers = asyncio.create_task(run_workers(queue, reconcile, 1))
        queue.add("web-0")
        await asyncio.sleep(0.8)
        queue.close(1)
        await asyncio.wait_for(workers, 2)
        await kube.close()
        server.close()

    asyncio.run(scenario())
    assert len(attempts) >= 3
    gaps = [b - a for a, b in itertools.pairwise(attempts)]
    assert gaps[1] > gaps[0], "the delay grows"


NOON = datetime(2025, 1, 31, 12, 0, tzinfo=UTC)


@pytest.mark.parametrize(("lifetime", "age", "due"), [
    (timedelta(hours=1), timedelta(minutes=58), False),
    (timedelta(hours=1), timedelta(minutes=59, seconds=1), True),
    (timedelta(hours=1), timedelta(hours=2), True),
    (timedelta(minutes=2), timedelta(seconds=90), False),  # a fifth of two minutes ahead, not a minute
    (timedelta(minutes=2), timedelta(seconds=97), True),
])
def test_credentials_are_reloaded_shortly_before_they_expire(lifetime: timedelta, age: timedelta,
                                                             due: bool) -> None:
    assert refresh_due(NOON + age, NOON, NOON + lifetime) is due


def test_credentials_without_an_expiry_are_reloaded_only_on_401() -> None:
    assert refresh_due(NOON + timedelta(days=400), NOON, None) is False


def test_a_refused_connection_is_an_api_error_so_callers_retry_instead_of_dying() -> None:
    # The leader election's loop and every reconcile handle ApiError; a raw connection error used to
    # escape them while kube-apiserver restarted, killing the elector task.
    async def scenario() -> None:
        kube = _kube(_closed_port(), 2)
        try:
            with pytest.raises(ApiUnreachable) as refused:
                await kube.get_pod("default", "web-0")
        finally:
            await kube.close()
        assert isinstance(refused.value, ApiError) and "GET /api/v1/namespaces/default/pods/web-0" in str(
            refused.value)

    asyncio.run(scenario())


def _closed_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# --- the client-side budget (--kube-api-qps / --kube-api-burst) ---------------------------------

def test_a_burst_goes_out_at_once_then_one_request_per_interval() -> None:
    bucket = TokenBucket(qps=10, burst=3, now=100.0)
    waits = [bucket.reserve(100.0) for _ in range(6)]
    assert waits == pytest.approx([0.0, 0.0, 0.0, 0.1, 0.2, 0.3])


def test_tokens_refill_with_time_but_never_beyond_the_burst() -> None:
    bucket = TokenBucket(qps=2, burst=2, now=0.0)
    assert [bucket.reserve(0.0), bucket.reserve(0.0)] == [0.0, 0.0]
    assert bucket.reserve(0.5) == 0.0  # one token back after half a second
    assert bucket.reserve(0.5) == pytest.approx(0.5)
    # A long quiet spell refills only up to the burst: the debt of 1 is repaid, then 2 tokens.
    assert [bucket.reserve(100.0), bucket.reserve(100.0)] == [0.0, 0.0]
    assert bucket.reserve(100.0) == pytest.approx(0.5)


def test_no_qps_means_no_limit() -> None:
    bucket = TokenBucket(qps=0, burst=1, now=0.0)
    assert {bucket.reserve(0.0) for _ in range(1000)} == {0.0}


def test_requests_of_a_limited_client_are_spaced_by_the_budget() -> None:
    """Kube waits on its bucket before sending: 6 requests at 20 QPS with burst 2 take about 0.2 s."""
    sent: list[float] = []

    async def scenario() -> None:
        kube = Kube(aio.ApiClient(aio.Configuration(host="http://127.0.0.1:9")), qps=20, burst=2)

        async def record(*_: object, **__: object) -> dict[str, str]:
            sent.append(time.monotonic())
            return {}

        kube._send = record  # type: ignore[method-assign]
        started = time.monotonic()
        await asyncio.gather(*(kube.request("GET", "/api") for _ in range(6)))
        sent[:] = [t - started for t in sent]
        await kube.close()

    asyncio.run(scenario())
    assert len(sent) == 6
    assert sent[1] < 0.05 and sent[-1] == pytest.approx(0.2, abs=0.08)


# --- the request itself: kubernetes.aio's session and credentials, bodies through orjson --------------

@contextlib.asynccontextmanager
async def _answering(answer: Callable[[Any], Awaitable[Any]]) -> AsyncIterator[str]:
    """An HTTP server on a free loopback port where `answer` (an aiohttp handler) answers every path."""
    from aiohttp import web

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", answer)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"  # type: ignore[union-attr]
    finally:
        await runner.cleanup()


def test_a_request_carries_the_credentials_agent_query_and_body_and_maps_the_answer() -> None:
    from aiohttp import web

    seen: list[dict[str, object]] = []

    async def answer(request: web.Request) -> web.Response:
        seen.append({"method": request.method, "path": request.path, "query": dict(request.query),
                     "authorization": request.headers.get("Authorization"),
                     "agent": request.headers.get("User-Agent"), "type": request.headers.get("Content-Type"),
                     "accept": request.headers.get("Accept"), "body": await request.json() if request.can_read_body
                     else None})
        if request.path.endswith("/gone"):
            return web.json_response({"kind": "Status", "reason": "NotFound", "message": 'resourceclaims... "gone"',
                                      "details": {"name": "gone", "kind": "resourceclaims"}}, status=404)
        if request.path.endswith("/taken"):
            return web.json_response({"kind": "Status", "reason": "Conflict", "message": "changed"}, status=409)
        if request.method == "DELETE":
            return web.Response(status=200, body=b"")
        return web.json_response({"metadata": {"name": "c-1", "resourceVersion": "7"}, "ünï": "cödé"})

    async def scenario() -> None:
        async with _answering(answer) as host:
            configuration = aio.Configuration(host=host, api_key={"BearerToken": "s3cret"},
                                              api_key_prefix={"BearerToken": "Bearer"})
            kube = Kube(aio.ApiClient(configuration), user_agent="claimwarden/test (me)")
            await _requests(kube)

    async def _requests(kube: Kube) -> None:
        try:
            created = await kube.create_claim("ns", {"metadata": {"generateName": "p-gpu-"}, "spec": {"ü": 1}})
            assert created == {"metadata": {"name": "c-1", "resourceVersion": "7"}, "ünï": "cödé"}
            await kube.patch_claim_status("ns", "c-1", [{"op": "test", "path": "/metadata/resourceVersion",
                                                          "value": "7"}])
            assert await kube.get_claim("ns", "gone") is None
            with pytest.raises(ApiError) as conflict:
                await kube.patch_claim("ns", "taken", [])
            assert conflict.value.conflict and conflict.value.message == "changed"
            assert await kube.delete_claim("ns", "c-1", "uid-1") is True
            assert await kube.list_uids("/api/v1", "pods") == set()
        finally:
            await kube.close()

    asyncio.run(scenario())
    post, patch, get, _, delete, listing = seen
    assert post == {"method": "POST", "path": "/apis/resource.k8s.io/v1/namespaces/ns/resourceclaims",
                    "query": {"fieldManager": "claimwarden"}, "authorization": "Bearer s3cret",
                    "agent": "claimwarden/test (me)", "type": "application/json", "accept": "application/json",
                    "body": {"metadata": {"generateName": "p-gpu-"}, "spec": {"ü": 1}}}
    assert patch["type"] == "application/json-patch+json" and patch["path"].endswith("/c-1/status")
    assert patch["body"] == [{"op": "test", "path": "/metadata/resourceVersion", "value": "7"}]
    assert get["method"] == "GET" and get["body"] is None and get["type"] is None
    assert delete["body"] == {"preconditions": {"uid": "uid-1"}}
    assert listing["query"] == {"limit": "500"} and "PartialObjectMetadataList" in str(listing["accept"])


# --- the fence: asked right before each send, and a write gets no more time than it has left ----------

class Fence:
    """The leader's fence as Kube sees it: seconds left to send writes, shut by the test at will."""

    def __init__(self, seconds: float = 10.0) -> None:
        self.seconds = seconds

    def __call__(self) -> float:
        return self.seconds


def _recording(kube: Kube, sent: list[tuple[str, float]], answers: list[BaseException] | None = None) -> None:
    """Replace the wire: record (method, timeout) of each send; raise the next of `answers`, if any."""
    async def send(_: object, method: str, *__: object, timeout: float) -> dict[str, str]:
        sent.append((method, timeout))
        if answers:
            raise answers.pop(0)
        return {}

    kube._send = send  # type: ignore[method-assign]


def test_a_write_that_waited_in_the_budget_until_the_fence_shut_is_not_sent() -> None:
    sent: list[tuple[str, float]] = []

    async def scenario() -> list[object]:
        fence = Fence()
        kube = Kube(aio.ApiClient(aio.Configuration(host="http://127.0.0.1:9")), qps=5, burst=1, fence=fence)
        _recording(kube, sent)

        async def shut() -> None:
            await asyncio.sleep(0.05)  # while the second write waits for its token (0.2 s)
            fence.seconds = 0

        results = await asyncio.gather(kube.request("POST", "/a", {}), kube.request("POST", "/b", {}), shut(),
                                       return_exceptions=True)
        await kube.close()
        return results

    first, second, _ = asyncio.run(scenario())
    assert first == {} and isinstance(second, NotLeader)
    assert [method for method, _ in sent] == ["POST"]


def test_a_credentials_reload_that_outlasts_the_fence_sends_nothing() -> None:
    sent: list[tuple[str, float]] = []
    fence = Fence()

    async def reload() -> tuple[aio.Configuration, None]:
        fence.seconds = 0  # an exec plugin that took longer than the lease had left
        return aio.Configuration(host="http://127.0.0.1:9"), None

    async def scenario() -> None:
        kube = Kube(aio.ApiClient(aio.Configuration(host="http://127.0.0.1:9")), reload=reload,
                    expires_at=datetime.now(UTC) - timedelta(seconds=1), fence=fence)
        _recording(kube, sent)
        try:
            with pytest.raises(NotLeader):
                await kube.request("PATCH", "/claims/c-1", [])
        finally:
            await kube.close()

    asyncio.run(scenario())
    assert sent == []


def test_the_retry_after_a_401_asks_the_fence_again() -> None:
    sent: list[tuple[str, float]] = []
    fence = Fence()

    async def reload() -> tuple[aio.Configuration, None]:
        fence.seconds = 0
        return aio.Configuration(host="http://127.0.0.1:9"), None

    async def scenario() -> None:
        kube = Kube(aio.ApiClient(aio.Configuration(host="http://127.0.0.1:9")), reload=reload, fence=fence)
        _recording(kube, sent, [ApiError(401, "Unauthorized", "token expired")])
        try:
            with pytest.raises(NotLeader):
                await kube.request("DELETE", "/claims/c-1", {})
        finally:
            await kube.close()

    asyncio.run(scenario())
    assert [method for method, _ in sent] == ["DELETE"]


def test_a_write_gets_no_more_time_than_the_fence_has_left_reads_and_the_lease_get_the_full_timeout() -> None:
    sent: list[tuple[str, float]] = []

    async def scenario() -> None:
        fence = Fence(4.5)
        kube = Kube(aio.ApiClient(aio.Configuration(host="http://127.0.0.1:9")), request_timeout=30, fence=fence)
        _recording(kube, sent)
        await kube.request("POST", "/a", {})
        await kube.request("GET", "/a")
        await kube.request("PUT", "/lease", {}, unfenced=True)
        fence.seconds = 0
        await kube.request("GET", "/a")
        await kube.request("PUT", "/lease", {}, unfenced=True)
        with pytest.raises(NotLeader):
            await kube.request("POST", "/a", {})
        await kube.close()

    asyncio.run(scenario())
    assert sent == [("POST", 4.5), ("GET", 30), ("PUT", 30), ("GET", 30), ("PUT", 30)]


def test_a_write_without_an_answer_gives_up_when_the_fence_would_shut() -> None:
    async def scenario() -> None:
        server, port = await _silent_peer()
        kube = _kube(port, 30, fence=Fence(0.31234))  # the time left is rarely round: say it in 3 digits
        began = time.monotonic()
        try:
            with pytest.raises(ApiTimeout, match=r"no answer within 0\.312 s"):
                await kube.evict_pod("default", "web-0", "uid-1")
        finally:
            await kube.close()
            server.close()
        assert time.monotonic() - began < 2

    asyncio.run(scenario())


def test_a_404_for_a_version_not_served_raises_and_discovery_skips_that_version() -> None:
    """Under allow_missing only a 404 naming the object reads as "missing" (kube/errors.py has the bodies)."""
    from aiohttp import web

    async def answer(request: web.Request) -> web.Response:
        if request.path.startswith("/apis/scheduling.k8s.io/v1alpha2"):
            return web.json_response({"kind": "Status", "reason": "NotFound", "details": {}, "code": 404,
                                      "message": "the server could not find the requested resource"}, status=404)
        if request.path == "/apis/scheduling.k8s.io/v1beta1":
            return web.json_response({"kind": "APIResourceList", "resources": [{"name": "podgroups"}]})
        return web.json_response({"kind": "Status", "reason": "NotFound", "code": 404,
                                  "message": 'podgroups.scheduling.k8s.io "team" not found',
                                  "details": {"name": "team", "kind": "podgroups"}}, status=404)

    async def scenario() -> None:
        async with _answering(answer) as host:
            await _requests(Kube(aio.ApiClient(aio.Configuration(host=host))))

    async def _requests(kube: Kube) -> None:
        try:
            with pytest.raises(NotServed):
                await kube.get_podgroup("v1alpha2", "ns", "team")
            with pytest.raises(NotServed):
                await kube.delete_cluster_object("scheduling.k8s.io/v1alpha2", "things", "x")
            assert await kube.get_podgroup("v1beta1", "ns", "team") is None
            assert await kube.served_version("scheduling.k8s.io", "podgroups", ("v1alpha2", "v1beta1")) == "v1beta1"
        finally:
            await kube.close()

    asyncio.run(scenario())
