"""The Alertmanager webhook receiver: alerts in, observations out, on the operator's event loop.

Alertmanager signs nothing, so a caller proves itself with a bearer token (Alertmanager's
`http_config.authorization.credentials_file`, the same Secret mounted on both sides) or a client
certificate (mTLS, `--alert-client-ca-file`), or both; anything else is answered 401 and nothing is written.
The token file is read again whenever it changes (a rotated Secret needs no restart); each non-empty line
is a valid token, so a new token can be added before Alertmanager switches to it.

One call goes through these steps, and the first that refuses answers:

  401 no or wrong bearer token          (before the body is read)
  503 this replica is not the leader     (Alertmanager retries; the leader answers)
  413 the body is over 1 MiB
  400 the body is not a version 4 payload (alerts.parse_payload)
  429 its new firing alerts are over --alert-rate / --alert-burst
  503 the sink failed to write them      (Alertmanager retries 5xx, never 4xx)
  200 written

Alertmanager drops a notification answered 4xx and, not having logged it as sent, sends the group
again at its next group_interval: an alert refused with 429 comes back minutes later, not never.

Firing alerts already written within the hour (same fingerprint and startsAt) are dropped before the
rate limit and the sink: Alertmanager re-sends a whole group whenever one of its alerts changes. Resolved
alerts are counted and dropped: resolving is not recovery (alerts.py). An alert whose device cannot be
found is counted (`unresolved_device`), logged and answered 200: retrying would not find it either.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import os
import ssl
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from aiohttp import web

from claimwarden import metrics
from claimwarden.health.records import DeviceRef
from claimwarden.tokenbucket import TokenBucket

from .alerts import FIRING, Alert, alert_observation, observation_key, parse_payload
from .observations import Observation

log = logging.getLogger("claimwarden.signals.webhook")

PATH = "/alerts"
BODY_MAX = 1024 * 1024
DEDUP_SECONDS = 3600.0
DEFAULT_PORT = 8443
DEFAULT_RATE = 50.0
DEFAULT_BURST = 200
CERT_RELOAD_SECONDS = 30.0

Sink = Callable[[list[tuple[DeviceRef, Observation]]], Awaitable[None]]
"""Writes the observations to their devices' records and returns; raising answers 503 (Alertmanager retries)."""
Resolve = Callable[[Alert], DeviceRef | None]
Clock = Callable[[], float]


@dataclass(frozen=True)
class WebhookSettings:
    """`claimwarden run --alert-*`: where and how the receiver listens. Off unless a token file or a client CA
    is given (and the port is not 0)."""

    address: str = "0.0.0.0"
    port: int = DEFAULT_PORT  # 0: off
    token_file: str | None = None
    tls_cert_file: str | None = None
    tls_key_file: str | None = None
    client_ca_file: str | None = None
    rate: float = DEFAULT_RATE  # new firing alerts per second
    burst: int = DEFAULT_BURST

    @property
    def enabled(self) -> bool:
        return self.port != 0 and bool(self.token_file or self.client_ca_file)

    @property
    def tls(self) -> bool:
        return bool(self.tls_cert_file)

    def problems(self) -> list[str]:
        """Why these settings cannot start (flag combinations, files that are not there); [] when they can."""
        problems = []
        if not 0 <= self.port <= 65535:
            problems.append(f"--alert-webhook-port {self.port} is not a port (0 turns the webhook off)")
        if bool(self.tls_cert_file) != bool(self.tls_key_file):
            problems.append("--alert-tls-cert-file and --alert-tls-key-file go together")
        if self.client_ca_file and not self.tls:
            problems.append("--alert-client-ca-file (mTLS) needs --alert-tls-cert-file and --alert-tls-key-file")
        if self.tls and not (self.token_file or self.client_ca_file):
            problems.append("--alert-tls-cert-file without --alert-token-file or --alert-client-ca-file: the "
                            "webhook is off unless it can authenticate its callers")
        if self.rate <= 0:
            problems.append(f"--alert-rate {self.rate:g} is not above 0")
        if self.burst < 1:
            problems.append(f"--alert-burst {self.burst} is not 1 or more")
        if self.enabled:
            for flag, path in (("--alert-token-file", self.token_file), ("--alert-tls-cert-file", self.tls_cert_file),
                               ("--alert-tls-key-file", self.tls_key_file),
                               ("--alert-client-ca-file", self.client_ca_file)):
                if path and not Path(path).is_file():
                    problems.append(f"{flag} {path} is not a file")
        return problems


class Tokens:
    """The bearer tokens of a file, read again when the file changes (a Secret's update swaps a symlink:
    the inode changes)."""

    def __init__(self, path: str) -> None:
        self._path = path
        self._seen: tuple[int, int, int, int] | None = None
        self._tokens: tuple[bytes, ...] = ()

    def current(self) -> tuple[bytes, ...]:
        try:
            st = os.stat(self._path)
        except OSError as exc:
            if self._seen is not None:
                log.error("webhook: token file %s unreadable (%s); every call is refused", self._path, exc)
            self._seen, self._tokens = None, ()
            return ()
        seen = (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size)
        if seen != self._seen:
            try:
                text = Path(self._path).read_bytes()
            except OSError as exc:
                log.error("webhook: token file %s unreadable (%s); every call is refused", self._path, exc)
                return ()
            self._tokens = tuple(line.strip() for line in text.splitlines() if line.strip())
            self._seen = seen
            if not self._tokens:
                log.error("webhook: token file %s holds no token; every call is refused", self._path)
        return self._tokens

    def accepts(self, authorization: str | None) -> bool:
        """Whether an Authorization header carries one of the tokens; compared in constant time."""
        scheme, _, given = (authorization or "").partition(" ")
        presented = given.strip().encode()
        if scheme.lower() != "bearer" or not presented:
            return False
        match = False
        for token in self.current():
            match |= hmac.compare_digest(presented, token)
        return match


class Seen:
    """Observation keys written within the last `seconds`, oldest first."""

    def __init__(self, seconds: float = DEDUP_SECONDS, clock: Clock = time.monotonic) -> None:
        self._seconds, self._clock = seconds, clock
        self._keys: OrderedDict[str, float] = OrderedDict()

    def _expire(self, now: float) -> None:
        while self._keys:
            key, at = next(iter(self._keys.items()))
            if now - at < self._seconds:
                return
            del self._keys[key]

    def __contains__(self, key: object) -> bool:
        self._expire(self._clock())
        return key in self._keys

    def add(self, keys: Iterable[str]) -> None:
        now = self._clock()
        for key in keys:
            self._keys.setdefault(key, now)


def _answer(code: int, message: str | dict[str, int]) -> web.Response:
    if isinstance(message, dict):
        return web.json_response(message, status=code)
    response = web.Response(status=code, text=message + "\n")
    if code == 503:
        # Alertmanager's retry reuses a kept-alive connection: one that reached the standby would reach it again,
        # for every retry. Closed, the retry connects anew through the Service and may reach the leader.
        response.force_close()
    return response


class Receiver:
    """One running webhook server; `stop()` closes it."""

    def __init__(self, settings: WebhookSettings, sink: Sink, resolve: Resolve, leading: Callable[[], bool], *,
                 clock: Clock = time.monotonic) -> None:  # clock: tests only
        self.settings = settings
        self._sink, self._resolve, self._leading = sink, resolve, leading
        self._tokens = Tokens(settings.token_file) if settings.token_file else None
        self._bucket = TokenBucket(qps=settings.rate, burst=settings.burst, clock=clock)
        self._seen = Seen(DEDUP_SECONDS, clock)
        self._runner: web.AppRunner | None = None
        self._reload: asyncio.Task[None] | None = None
        self.port = settings.port
        self.url = ""

    # --- serving ---------------------------------------------------------------------------------

    async def start(self) -> None:
        app = web.Application(client_max_size=BODY_MAX, middlewares=[self._count])
        app.router.add_post(PATH, self._handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        context = self._ssl_context() if self.settings.tls else None
        site = web.TCPSite(self._runner, self.settings.address, self.settings.port, ssl_context=context)
        await site.start()
        scheme = "https" if context else "http"
        host = {"0.0.0.0": "127.0.0.1", "": "127.0.0.1", "::": "::1"}.get(self.settings.address, self.settings.address)
        host = f"[{host}]" if ":" in host else host
        self.url = f"{scheme}://{host}:{self.port}{PATH}"
        if context is not None:
            self._reload = asyncio.create_task(self._reload_certificate(context), name="webhook certificate")
        log.info("webhook: Alertmanager receiver on %s (%s)", self.url, ", ".join(
            what for what, on in (("bearer token", self._tokens), ("client certificates", self.settings.client_ca_file))
            if on))

    async def stop(self) -> None:
        if self._reload is not None:
            self._reload.cancel()
            self._reload = None
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    def _ssl_context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        assert self.settings.tls_cert_file and self.settings.tls_key_file
        context.load_cert_chain(self.settings.tls_cert_file, self.settings.tls_key_file)
        if self.settings.client_ca_file:
            context.load_verify_locations(cafile=self.settings.client_ca_file)
            context.verify_mode = ssl.CERT_REQUIRED
        return context

    async def _reload_certificate(self, context: ssl.SSLContext) -> None:
        """Load the serving certificate again when its files change (cert-manager renews it in place); new
        connections get the new one. A new client CA needs a restart."""
        files = [self.settings.tls_cert_file or "", self.settings.tls_key_file or ""]

        def stamp() -> list[tuple[int, int]]:
            try:
                return [(st.st_ino, st.st_mtime_ns) for st in map(os.stat, files)]
            except OSError:
                return []

        last = stamp()
        while True:
            await asyncio.sleep(CERT_RELOAD_SECONDS)
            now = stamp()
            if now and now != last:
                try:
                    context.load_cert_chain(*files)
                    last = now
                    log.info("webhook: serving certificate reloaded from %s", files[0])
                except (OSError, ssl.SSLError) as exc:  # half-written: the next round tries again
                    log.warning("webhook: serving certificate not reloaded: %s", exc)

    @web.middleware
    async def _count(self, request: web.Request,
                     handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> web.StreamResponse:
        try:
            response = await handler(request)
        except web.HTTPException as exc:
            metrics.WEBHOOK_REQUESTS.labels(str(exc.status)).inc()
            raise
        metrics.WEBHOOK_REQUESTS.labels(str(response.status)).inc()
        return response

    # --- one call --------------------------------------------------------------------------------

    def _authenticated(self, request: web.Request) -> bool:
        # With a client CA the TLS handshake already refused anyone without a certificate it signed.
        return self._tokens is None or self._tokens.accepts(request.headers.get("Authorization"))

    async def _handle(self, request: web.Request) -> web.Response:
        if not self._authenticated(request):
            refused = _answer(401, "no valid bearer token")
            refused.headers["WWW-Authenticate"] = 'Bearer realm="claimwarden"'
            return refused
        if not self._leading():
            return _answer(503, "this replica is not the leader")
        try:
            body = await request.read()
        except web.HTTPRequestEntityTooLarge:
            return _answer(413, f"the body is over {BODY_MAX} bytes")
        alerts, why = parse_payload(body)
        if why is not None:
            log.warning("webhook: malformed call refused: %s", why)
            return _answer(400, why)
        return await self._alerts(alerts)

    async def _alerts(self, alerts: list[Alert]) -> web.Response:
        counts = {"observed": 0, "duplicate": 0, "resolved": 0, "unresolved_device": 0}
        new: dict[str, Alert] = {}
        for alert in alerts:
            if alert.status != FIRING:
                counts["resolved"] += 1
                continue
            key = observation_key(alert)
            if key in new or key in self._seen:
                counts["duplicate"] += 1
            else:
                new[key] = alert
        if new and not self._bucket.take_batch(len(new)):
            metrics.WEBHOOK_ALERTS.labels("rate_limited").inc(len(new))
            return _answer(429, f"{len(new)} new alert(s) over --alert-rate {self.settings.rate:g}/s "
                                f"(burst {self.settings.burst})")
        written: list[tuple[DeviceRef, Observation]] = []
        try:
            for alert in new.values():
                observation = alert_observation(alert)
                ref = self._resolve(alert) if observation is not None else None
                if ref is None or observation is None:
                    counts["unresolved_device"] += 1
                    log.warning("webhook: alert %r names no device claimwarden knows%s (labels %s)",
                                alert.labels.get("alertname", ""), "" if observation else ", or no alertname",
                                dict(alert.labels))
                    continue
                written.append((ref, observation))
            if written:
                await self._sink(written)
        except Exception as exc:
            log.error("webhook: %d observation(s) not written, answering 503: %s: %s",
                      len(written), type(exc).__name__, exc)
            return _answer(503, "the observations were not written; retry")
        self._seen.add(o.key for _, o in written)
        counts["observed"] = len(written)
        for result, count in counts.items():
            if count:
                metrics.WEBHOOK_ALERTS.labels(result).inc(count)
        return _answer(200, counts)


async def serve(settings: WebhookSettings, sink: Sink, resolve: Resolve, leading: Callable[[], bool]) -> Receiver:
    """Start the receiver on the running event loop (settings.enabled must be true); `stop()` it at shutdown.

    `resolve` names an alert's device (alerts.resolve_device over the slices at hand); `leading` says whether
    this replica may write now (a standby answers 503).
    """
    if not settings.enabled:
        raise ValueError("the webhook is off: it needs a port and a token file or a client CA")
    receiver = Receiver(settings, sink, resolve, leading)
    await receiver.start()
    return receiver

