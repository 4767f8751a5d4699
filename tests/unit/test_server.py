"""runtime/server.py: /metrics, /healthz and /readyz from one aiohttp application on the event loop."""

from __future__ import annotations

import asyncio
import json
import logging
import re
import urllib.error
import urllib.request
from collections.abc import Mapping
from typing import Any

import pytest
from aiohttp import web
from prometheus_client import CollectorRegistry, Counter

from claimwarden.runtime import server
from claimwarden.runtime.readiness import Readiness
from claimwarden_lab.processes import free_port


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def _text(text: str) -> server.Handler:
    async def answer(_: web.Request) -> web.Response:
        return web.Response(text=text)

    return answer


def test_the_metrics_url_is_the_flags_address_and_port() -> None:
    assert server.metrics_url("0.0.0.0", 9090) == "http://0.0.0.0:9090/metrics"
    assert server.metrics_url("::", 9090) == "http://[::]:9090/metrics"


def test_urls_sharing_a_socket_are_one_socket_and_a_path_is_kept_per_port() -> None:
    urls = {"http://0.0.0.0:8080/healthz": "live", "http://0.0.0.0:8082/readyz": "ready",
            "http://0.0.0.0:8080/readyz": "ready on the probe port", "http://0.0.0.0:9090/metrics": "metrics"}
    assert server.sockets(urls) == [("0.0.0.0", 8080), ("0.0.0.0", 8082), ("0.0.0.0", 9090)]  # type: ignore[arg-type]
    assert server.by_path(urls) == {"/healthz": {8080: "live"}, "/readyz": {8082: "ready",  # type: ignore[arg-type]
                                                                          8080: "ready on the probe port"},
                                    "/metrics": {9090: "metrics"}}


@pytest.mark.parametrize(("urls", "error"), [
    ({"--liveness": "http://0.0.0.0/healthz"},
     "--liveness: 'http://0.0.0.0/healthz' is not an http://host:port/path URL"),
    ({"--readiness": "https://0.0.0.0:8082/readyz"}, "--readiness: 'https://0.0.0.0:8082/readyz' is not an http"),
    ({"--liveness": "http://0.0.0.0:8080/x", "--readiness": "http://127.0.0.1:8080/x"},
     "--liveness and --readiness would both answer /x on port 8080"),
])
def test_a_url_that_cannot_be_served_is_refused_naming_its_flag(urls: Mapping[str, str], error: str) -> None:
    with pytest.raises(ValueError, match="^" + re.escape(error)):
        server.check_urls(urls)


def test_empty_urls_serve_nothing_and_are_fine() -> None:
    server.check_urls({"--liveness": "", "--readiness": "", "--metrics-port": "http://0.0.0.0:9090/metrics"})


def test_each_path_is_answered_on_its_own_port_only() -> None:
    probe_port, metrics_port = free_port(), free_port()

    async def scenario() -> list[tuple[int, str]]:
        runner = await server.serve({f"http://127.0.0.1:{probe_port}/healthz": _text("alive"),
                                     f"http://127.0.0.1:{probe_port}/readyz": _text("ready"),
                                     f"http://127.0.0.1:{metrics_port}/metrics": _text("numbers")})
        try:
            return [await asyncio.to_thread(_get, f"http://127.0.0.1:{port}/{path}") for port, path in (
                (probe_port, "healthz"), (probe_port, "readyz"), (metrics_port, "metrics"),
                (probe_port, "metrics"), (metrics_port, "healthz"))]
        finally:
            await runner.cleanup()

    answers = asyncio.run(scenario())
    assert answers[:3] == [(200, "alive"), (200, "ready"), (200, "numbers")]
    assert [status for status, _ in answers[3:]] == [404, 404]


def test_a_port_in_use_fails_the_start_and_leaves_nothing_listening() -> None:
    port, busy = free_port(), free_port()

    async def scenario() -> int:
        holder = await server.serve({f"http://127.0.0.1:{busy}/x": _text("first")})
        try:
            with pytest.raises(OSError):
                await server.serve({f"http://127.0.0.1:{port}/healthz": _text("alive"),
                                    f"http://127.0.0.1:{busy}/metrics": _text("numbers")})
            again = await server.serve({f"http://127.0.0.1:{port}/healthz": _text("again")})
            await again.cleanup()  # the failed start freed its first socket
            return 0
        finally:
            await holder.cleanup()

    assert asyncio.run(scenario()) == 0


def test_metrics_are_the_registrys_exposition() -> None:
    port = free_port()
    registry = CollectorRegistry()
    Counter("claimwarden_test_total", "A counter.", registry=registry).inc(3)

    async def scenario() -> tuple[int, str]:
        runner = await server.serve({f"http://127.0.0.1:{port}/metrics": server.metrics_handler(registry)})
        try:
            return await asyncio.to_thread(_get, f"http://127.0.0.1:{port}/metrics")
        finally:
            await runner.cleanup()

    status, text = asyncio.run(scenario())
    assert status == 200 and "claimwarden_test_total 3.0" in text


def test_readiness_is_200_or_503_with_the_reason() -> None:
    port = free_port()
    state = [Readiness(False, "not all watched resources are listed yet")]

    async def scenario() -> list[tuple[int, str]]:
        runner = await server.serve({f"http://127.0.0.1:{port}/readyz": server.readiness_handler(lambda: state[0])})
        try:
            first = await asyncio.to_thread(_get, f"http://127.0.0.1:{port}/readyz")
            state[0] = Readiness(True, "indexed")
            return [first, await asyncio.to_thread(_get, f"http://127.0.0.1:{port}/readyz")]
        finally:
            await runner.cleanup()

    assert asyncio.run(scenario()) == [(503, "not all watched resources are listed yet\n"), (200, "indexed\n")]


def test_liveness_runs_the_probes_at_most_once_per_period_and_answers_their_json() -> None:
    port = free_port()
    clock = [100.0]
    runs: list[float] = []

    async def probes() -> dict[str, Any]:
        runs.append(clock[0])
        await asyncio.sleep(0.05)  # slow enough that concurrent requests overlap
        return {"version": f"v{len(runs)}"}

    async def scenario() -> list[tuple[int, str]]:
        handler = server.liveness_handler(probes, max_age=10.0, clock=lambda: clock[0])
        runner = await server.serve({f"http://127.0.0.1:{port}/healthz": handler})
        url = f"http://127.0.0.1:{port}/healthz"
        try:
            together = await asyncio.gather(*(asyncio.to_thread(_get, url) for _ in range(3)))
            clock[0] = 109.0
            cached = await asyncio.to_thread(_get, url)
            clock[0] = 110.0
            return [*together, cached, await asyncio.to_thread(_get, url)]
        finally:
            await runner.cleanup()

    answers = asyncio.run(scenario())
    assert [(status, json.loads(text)) for status, text in answers] == [(200, {"version": "v1"})] * 4 + [
        (200, {"version": "v2"})]
    assert runs == [100.0, 110.0]


def test_the_probes_kopf_registered_run_through_the_door() -> None:
    import kopf

    from claimwarden import app
    from claimwarden.runtime import kopf_private

    async def scenario() -> dict[str, Any]:
        return await kopf_private.run_probes(registry=kopf.get_default_registry(), settings=kopf.OperatorSettings(),
                                             indexers=kopf_private.OperatorIndexers(), memo=kopf.Memo())

    assert asyncio.run(scenario()) == {"version": app.__version__}


def test_only_the_access_logged_paths_reach_the_access_log(caplog: pytest.LogCaptureFixture) -> None:
    port = free_port()

    async def scenario() -> None:
        runner = await server.serve({f"http://127.0.0.1:{port}/healthz": _text("alive"),
                                     f"http://127.0.0.1:{port}/metrics": _text("numbers")},
                                    access_logged=[f"http://127.0.0.1:{port}/healthz"])
        try:
            for path in ("healthz", "metrics"):
                await asyncio.to_thread(_get, f"http://127.0.0.1:{port}/{path}")
        finally:
            await runner.cleanup()

    with caplog.at_level(logging.INFO, logger="aiohttp.access"):
        asyncio.run(scenario())
    lines = [record.getMessage() for record in caplog.records if record.name == "aiohttp.access"]
    assert len(lines) == 1 and '"GET /healthz HTTP/1.1" 200' in lines[0]
