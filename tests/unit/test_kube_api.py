"""The API adapter's own guarantees: a bounded time per request, and when credentials are reloaded."""

from __future__ import annotations

import asyncio
import itertools
import time
from datetime import UTC, datetime, timedelta

import pytest
from kubernetes.aio import client as aio

from claimwarden.kube.api import Kube, env_proxy, refresh_due
from claimwarden.kube.errors import ApiError, ApiTimeout, ApiUnreachable
from claimwarden.workqueue import WorkQueue, run_workers


async def _silent_peer() -> tuple[asyncio.Server, int]:
    """A TCP server that accepts connections and never answers (a hung API server or a black hole)."""
    async def hold(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read()  # until the client gives up and closes

    server = await asyncio.start_server(hold, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


def _kube(port: int, timeout: float) -> Kube:
    configuration = aio.Configuration(host=f"http://127.0.0.1:{port}")
    return Kube(aio.ApiClient(configuration), request_timeout=timeout)


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


def test_the_proxy_comes_from_the_environment_once_as_aiohttp_would_per_request(
        monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "NO_PROXY", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
    assert env_proxy("https://10.0.0.1:6443") == (None, {})
    monkeypatch.setenv("HTTPS_PROXY", "http://user:secret@proxy.example:3128")
    proxy, headers = env_proxy("https://10.0.0.1:6443")
    assert proxy is not None and proxy.startswith("http://proxy.example:3128")
    assert headers["Proxy-Authorization"].startswith("Basic ")
    assert env_proxy("http://10.0.0.1:8080") == (None, {}), "HTTPS_PROXY is for https:// servers only"
    monkeypatch.setenv("NO_PROXY", "10.0.0.1")
    assert env_proxy("https://10.0.0.1:6443") == (None, {})
