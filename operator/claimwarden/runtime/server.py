"""One HTTP server on the operator's event loop: ``/metrics``, ``/healthz`` and ``/readyz``.

The three endpoints are routes of one aiohttp application, run on Kopf's event loop, where the indices
the gauges read are changed: a scrape reads them between two events, never during one, so no thread hops
back to the loop and no scrape waits on a cross-thread timeout. The flags keep their ports: each URL
(``--liveness``, ``--readiness``, ``--metrics-address``/``--metrics-port``) is one listening socket of
the application, and a path is answered only on the port its URL names (``/metrics`` is not on the probe
port, so a NetworkPolicy that guards the metrics port still guards the metrics). URLs may share a port.

- ``/metrics``: prometheus_client's aiohttp handler over `metrics.REGISTRY`. The expensive gauges are
  cached (`metrics.cached`), so a scrape walks the claims at most once per period.
- ``/healthz`` (liveness): Kopf's ``@kopf.on.probe`` handlers, run as Kopf's own liveness server ran
  them (`kopf_private.run_probes`), at most once per `PROBE_MAX_AGE`; the answer is their JSON.
- ``/readyz``: `readiness.decide`'s answer, 200 or 503 with the reason.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Collection, Mapping
from typing import Any

from aiohttp import web
from aiohttp.web_log import AccessLogger
from prometheus_client import CollectorRegistry
from prometheus_client.aiohttp import make_aiohttp_handler

from .readiness import Readiness, split_url

log = logging.getLogger("claimwarden.server")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
PROBE_MAX_AGE = 10.0  # seconds a liveness answer is reused, as Kopf's server did


def metrics_url(address: str, port: int) -> str:
    """The URL ``--metrics-address`` and ``--metrics-port`` name."""
    host = f"[{address}]" if ":" in address else address
    return f"http://{host}:{port}/metrics"


def by_path(urls: Mapping[str, Handler]) -> dict[str, dict[int, Handler]]:
    """{path: {port: handler}} of URLs such as http://0.0.0.0:8080/healthz; ValueError for a URL that is
    not http://host:port/path, or for two URLs with one port and one path."""
    paths: dict[str, dict[int, Handler]] = {}
    for url, handler in urls.items():
        _, port, path = split_url(url)
        if port in paths.setdefault(path, {}):
            raise ValueError(f"two endpoints would answer {path} on port {port}")
        paths[path][port] = handler
    return paths


def check_urls(urls_by_flag: Mapping[str, str]) -> None:
    """ValueError, naming the flag, for a URL `serve` would refuse; an empty URL serves nothing."""
    seen: dict[tuple[int, str], str] = {}
    for flag, url in urls_by_flag.items():
        if not url:
            continue
        try:
            _, port, path = split_url(url)
        except ValueError as exc:
            raise ValueError(f"{flag}: {exc}") from None
        if (port, path) in seen:
            raise ValueError(f"{seen[port, path]} and {flag} would both answer {path} on port {port}")
        seen[port, path] = flag


def sockets(urls: Mapping[str, Handler]) -> list[tuple[str, int]]:
    """The (host, port) pairs to listen on, one per distinct pair, in the URLs' order."""
    return list(dict.fromkeys(split_url(url)[:2] for url in urls))


def _on_its_port(handlers: Mapping[int, Handler]) -> Handler:
    async def answer(request: web.Request) -> web.StreamResponse:
        sockname = request.transport.get_extra_info("sockname") if request.transport else None
        handler = handlers.get(sockname[1]) if sockname else None
        if handler is None:
            raise web.HTTPNotFound()
        return await handler(request)

    return answer


def _access_log_of(paths: Collection[str]) -> type[AccessLogger]:
    class PathsAccessLogger(AccessLogger):
        def log(self, request: Any, response: web.StreamResponse, time: float) -> None:
            if request.path in paths:
                super().log(request, response, time)

    return PathsAccessLogger


async def serve(urls: Mapping[str, Handler], *, access_logged: Collection[str] = ()) -> web.AppRunner:
    """Listen on every URL's host and port and answer each URL's path there; the caller cleans up.

    Requests to the ``access_logged`` URLs' paths go to aiohttp's access log (the liveness probes, as
    Kopf's liveness server logged them: a kubelet's probes are seen in the log); the others do not."""
    app = web.Application()
    for path, handlers in by_path(urls).items():
        app.router.add_get(path, _on_its_port(handlers))
    logged = {split_url(url)[2] for url in access_logged}
    runner = web.AppRunner(app, handle_signals=False, shutdown_timeout=1.0, access_log_class=_access_log_of(logged))
    await runner.setup()
    try:
        for host, port in sockets(urls):
            await web.TCPSite(runner, host, port).start()
    except BaseException:
        await runner.cleanup()
        raise
    log.info("serving %s", ", ".join(urls))
    return runner


def metrics_handler(registry: CollectorRegistry) -> Handler:
    """prometheus_client's exposition of ``registry``, computed on the loop."""
    return make_aiohttp_handler(registry)


def readiness_handler(check: Callable[[], Readiness]) -> Handler:
    """200 or 503, with the reason on one line."""

    async def answer(_: web.Request) -> web.Response:
        state = check()
        return web.Response(status=200 if state.ready else 503, text=state.reason + "\n")

    return answer


def liveness_handler(probe: Callable[[], Awaitable[Mapping[str, Any]]], *,
                     max_age: float = PROBE_MAX_AGE, clock: Callable[[], float] = time.monotonic) -> Handler:
    """The probes' results as JSON; they run at most once per ``max_age`` seconds, however many ask at once."""
    lock = asyncio.Lock()
    last: list[tuple[float, Mapping[str, Any]]] = []

    async def answer(_: web.Request) -> web.Response:
        async with lock:
            if not last or clock() - last[0][0] >= max_age:
                results = await probe()
                last[:] = [(clock(), results)]
        return web.json_response(dict(last[0][1]))

    return answer
