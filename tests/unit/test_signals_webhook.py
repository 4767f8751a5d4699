"""The Alertmanager webhook receiver (signals/webhook.py): a real aiohttp server on 127.0.0.1, an in-memory sink."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import ssl
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from claimwarden import metrics
from claimwarden.health.records import DeviceRef
from claimwarden.signals import webhook
from claimwarden.signals.alerts import resolve_device
from claimwarden.signals.observations import Observation
from claimwarden.signals.webhook import BODY_MAX, Receiver, WebhookSettings, serve
from claimwarden_lab.driver import DEFAULT_MODEL, DRIVER, MODELS, device_uuid, devices
from claimwarden_lab.pki import write_pki

TOKEN = "s3cret-token"
SLICES = [{"spec": {"driver": DRIVER, "nodeName": "node-1", "pool": {"name": "node-1", "generation": 1},
                    "devices": devices("node-1", 4, MODELS[DEFAULT_MODEL])}}]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def alert(fingerprint: str = "f1", status: str = "firing", starts: str = "2026-12-02T10:00:00Z",
          **labels: str) -> dict[str, Any]:
    return {"status": status, "labels": {"alertname": "GPUXidError", "xid": "79", **labels},
            "annotations": {"summary": "XID 79"}, "startsAt": starts, "endsAt": "0001-01-01T00:00:00Z",
            "fingerprint": fingerprint}


def on(device: int, fingerprint: str, **kwargs: Any) -> dict[str, Any]:
    """A firing alert about node-1's gpu-<device>, attributed by dcgm-exporter's dra_* labels."""
    return alert(fingerprint, dra_driver_name=DRIVER, dra_pool_name="node-1", dra_device_name=f"gpu-{device}",
                 **kwargs)


def payload(*alerts: dict[str, Any]) -> bytes:
    return json.dumps({"version": "4", "status": "firing", "receiver": "claimwarden", "groupKey": "{}:{}",
                       "alerts": list(alerts)}).encode()


def ref(device: int) -> DeviceRef:
    return DeviceRef(DRIVER, "node-1", f"gpu-{device}")


@dataclass
class Sink:
    calls: list[list[tuple[DeviceRef, Observation]]] = field(default_factory=list)
    fail: bool = False

    async def __call__(self, pairs: list[tuple[DeviceRef, Observation]]) -> None:
        if self.fail:
            raise RuntimeError("the apiserver said no")
        self.calls.append(list(pairs))

    @property
    def written(self) -> list[tuple[DeviceRef, str]]:
        return [(r, o.key) for call in self.calls for r, o in call]


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def count(name: str, **labels: str) -> float:
    return metrics.REGISTRY.get_sample_value(name, labels) or 0.0


@dataclass
class Harness:
    receiver: Receiver
    sink: Sink
    session: aiohttp.ClientSession
    token_file: Path

    async def post(self, body: bytes, *, token: str | None = TOKEN, scheme: str = "Bearer",
                   **kwargs: Any) -> tuple[int, str]:
        headers = {"Content-Type": "application/json"}
        if token is not None:
            headers["Authorization"] = f"{scheme} {token}"
        async with self.session.post(self.receiver.url, data=body, headers=headers, **kwargs) as response:
            return response.status, await response.text()


@asynccontextmanager
async def harness(tmp_path: Path, *, leading: Callable[[], bool] = lambda: True, clock: Clock | None = None,
                  **settings: Any) -> AsyncIterator[Harness]:
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    options: dict[str, Any] = {"address": "127.0.0.1", "port": free_port(), "token_file": str(token_file), **settings}
    sink = Sink()
    receiver = Receiver(WebhookSettings(**options), sink, lambda a: resolve_device(a, SLICES), leading,
                        **({"clock": clock} if clock else {}))
    await receiver.start()
    try:
        async with aiohttp.ClientSession() as session:
            yield Harness(receiver, sink, session, token_file)
    finally:
        await receiver.stop()


def test_a_firing_alert_reaches_the_sink_as_its_devices_observation(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with harness(tmp_path) as h:
            before = count("claimwarden_webhook_alerts_total", result="observed")
            status, text = await h.post(payload(
                on(1, "f1"), on(2, "f2", status="resolved"),
                alert("f3", UUID=device_uuid("node-1", 3), Hostname="node-1"),
                alert("f4", claimwarden_device="other.example.com/pool/dev-9"),
                alert("f5", UUID="GPU-unknown", Hostname="node-1")))
            assert status == 200, text
            assert json.loads(text) == {"observed": 3, "duplicate": 0, "resolved": 1, "unresolved_device": 1}
            [call] = h.sink.calls  # one payload, one write
            assert [(r, o.signal, o.value, o.key) for r, o in call] == [
                (ref(1), "GPUXidError", "79", "f1@2026-12-02T10:00:00Z"),
                (ref(3), "GPUXidError", "79", "f3@2026-12-02T10:00:00Z"),
                (DeviceRef("other.example.com", "pool", "dev-9"), "GPUXidError", "79", "f4@2026-12-02T10:00:00Z")]
            assert count("claimwarden_webhook_alerts_total", result="observed") == before + 3
    asyncio.run(scenario())


def test_no_or_a_wrong_token_is_refused_with_401_and_nothing_written(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with harness(tmp_path) as h:
            before = count("claimwarden_webhook_requests_total", code="401")
            for kwargs in ({"token": None}, {"token": "wrong"}, {"token": TOKEN + "x"}, {"token": ""},
                           {"token": TOKEN, "scheme": "Basic"}):
                status, _ = await h.post(payload(on(1, "f1")), **kwargs)
                assert status == 401, kwargs
            assert h.sink.calls == []
            assert count("claimwarden_webhook_requests_total", code="401") == before + 5
            async with h.session.post(h.receiver.url, data=payload(on(1, "f1"))) as response:
                assert response.headers["WWW-Authenticate"] == 'Bearer realm="claimwarden"'
    asyncio.run(scenario())


def test_the_token_file_is_read_again_when_it_changes(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with harness(tmp_path) as h:
            assert (await h.post(payload(on(1, "f1"))))[0] == 200
            # A Secret update: a new file swapped in (a new inode), as the kubelet's atomic writer does.
            fresh = tmp_path / "token.new"
            fresh.write_text("rotated\n")
            os.replace(fresh, h.token_file)
            assert (await h.post(payload(on(1, "f2"))))[0] == 401
            assert (await h.post(payload(on(1, "f2")), token="rotated"))[0] == 200
            # During a rotation the file may hold the old and the new token, one a line.
            h.token_file.write_text("rotated\nnext-one\n\n")
            assert (await h.post(payload(on(1, "f3")), token="next-one"))[0] == 200
            assert (await h.post(payload(on(1, "f4")), token="rotated"))[0] == 200
            # An empty or missing file refuses everyone (an empty bearer never matches).
            h.token_file.write_text("\n")
            assert (await h.post(payload(on(1, "f5")), token="rotated"))[0] == 401
            h.token_file.unlink()
            assert (await h.post(payload(on(1, "f5")), token="rotated"))[0] == 401
            assert [key for _, key in h.sink.written] == [f"f{i}@2026-12-02T10:00:00Z" for i in (1, 2, 3, 4)]
    asyncio.run(scenario())


def test_a_malformed_body_is_400_and_an_oversized_one_413(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with harness(tmp_path) as h:
            before = count("claimwarden_webhook_requests_total", code="400")
            status, text = await h.post(b'{"version": "4", "alerts": [{"status": "firing"}]}')
            assert status == 400 and "alerts[0].labels" in text
            assert (await h.post(b"nonsense"))[0] == 400
            assert count("claimwarden_webhook_requests_total", code="400") == before + 2
            big = payload(*(on(1, f"f{i}", filler="x" * 1000) for i in range(1100)))
            assert len(big) > BODY_MAX
            assert (await h.post(big))[0] == 413
            assert h.sink.calls == []
    asyncio.run(scenario())


def test_a_standby_answers_503_and_writes_nothing(tmp_path: Path) -> None:
    leader = [False]

    async def scenario() -> None:
        async with harness(tmp_path, leading=lambda: leader[0]) as h:
            assert (await h.post(payload(on(1, "f1"))))[0] == 503
            # Closed after a 503: Alertmanager's retry must connect anew (through the Service, maybe to the leader).
            async with h.session.post(h.receiver.url, data=payload(on(1, "f1")),
                                      headers={"Authorization": f"Bearer {h.token_file.read_text().strip()}"}) as r:
                assert r.status == 503 and r.headers.get("Connection", "").lower() == "close"
            assert (await h.post(payload(on(1, "f1")), token="wrong"))[0] == 401  # authentication first
            assert h.sink.calls == []
            leader[0] = True
            assert (await h.post(payload(on(1, "f1"))))[0] == 200
            assert h.sink.written == [(ref(1), "f1@2026-12-02T10:00:00Z")]
    asyncio.run(scenario())


def test_a_failing_sink_answers_503_and_the_retry_is_written(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with harness(tmp_path) as h:
            h.sink.fail = True
            assert (await h.post(payload(on(1, "f1"))))[0] == 503
            assert h.sink.calls == []
            h.sink.fail = False
            # Not remembered as seen: Alertmanager's retry is written, not dropped as a duplicate.
            status, text = await h.post(payload(on(1, "f1")))
            assert status == 200 and json.loads(text)["observed"] == 1
            assert h.sink.written == [(ref(1), "f1@2026-12-02T10:00:00Z")]
    asyncio.run(scenario())


def test_duplicates_are_dropped_for_an_hour(tmp_path: Path) -> None:
    clock = Clock()

    async def scenario() -> None:
        async with harness(tmp_path, clock=clock) as h:
            before = count("claimwarden_webhook_alerts_total", result="duplicate")
            assert (await h.post(payload(on(1, "f1"), on(1, "f1"))))[0] == 200  # twice in one call
            clock.now += 3000
            # Alertmanager re-sends the group when another alert joins it.
            status, text = await h.post(payload(on(1, "f1"), on(2, "f2")))
            assert status == 200 and json.loads(text) == {
                "observed": 1, "duplicate": 1, "resolved": 0, "unresolved_device": 0}
            # The same fingerprint firing again later (a new startsAt) is a new observation.
            assert (await h.post(payload(on(1, "f1", starts="2026-12-02T12:00:00Z"))))[0] == 200
            assert count("claimwarden_webhook_alerts_total", result="duplicate") == before + 2
            clock.now += 700  # f1's first sighting is more than an hour old now
            assert json.loads((await h.post(payload(on(1, "f1"))))[1])["observed"] == 1
            assert [key for _, key in h.sink.written] == [
                "f1@2026-12-02T10:00:00Z", "f2@2026-12-02T10:00:00Z", "f1@2026-12-02T12:00:00Z",
                "f1@2026-12-02T10:00:00Z"]
    asyncio.run(scenario())


def test_new_alerts_over_the_rate_are_refused_with_429(tmp_path: Path) -> None:
    clock = Clock()

    async def scenario() -> None:
        async with harness(tmp_path, clock=clock, rate=1.0, burst=2) as h:
            before = count("claimwarden_webhook_alerts_total", result="rate_limited")
            assert (await h.post(payload(on(1, "f1"), on(2, "f2"))))[0] == 200
            assert (await h.post(payload(on(3, "f3"))))[0] == 429
            # Duplicates and resolved alerts cost nothing.
            assert (await h.post(payload(on(1, "f1"), on(2, "f9", status="resolved"))))[0] == 200
            assert count("claimwarden_webhook_alerts_total", result="rate_limited") == before + 1
            assert [r for r, _ in h.sink.written] == [ref(1), ref(2)]
            clock.now += 1.0
            assert (await h.post(payload(on(3, "f3"))))[0] == 200
            # A group bigger than the burst takes the whole bucket once it is full.
            assert (await h.post(payload(*(on(0, f"g{i}") for i in range(5)))))[0] == 429
            clock.now += 2.0
            assert (await h.post(payload(*(on(0, f"g{i}") for i in range(5)))))[0] == 200
            assert len(h.sink.written) == 8
    asyncio.run(scenario())


def test_only_post_to_the_path_is_served(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with harness(tmp_path) as h:
            async with h.session.get(h.receiver.url, headers={"Authorization": f"Bearer {TOKEN}"}) as response:
                assert response.status == 405
            async with h.session.post(h.receiver.url + "x", data=payload(on(1, "f1")),
                                      headers={"Authorization": f"Bearer {TOKEN}"}) as response:
                assert response.status == 404
            assert h.sink.calls == []
    asyncio.run(scenario())


def test_mtls_admits_a_client_certificate_of_the_ca_and_refuses_others(tmp_path: Path) -> None:
    ours, theirs = tmp_path / "pki", tmp_path / "other-pki"
    write_pki(ours)
    write_pki(theirs)

    def client(pki: Path | None) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=str(ours / "ca.crt"))
        if pki is not None:
            context.load_cert_chain(str(pki / "admin.crt"), str(pki / "admin.key"))
        return context

    async def scenario() -> None:
        async with harness(tmp_path, token_file=None, tls_cert_file=str(ours / "apiserver.crt"),
                           tls_key_file=str(ours / "apiserver.key"), client_ca_file=str(ours / "ca.crt")) as h:
            assert h.receiver.url.startswith("https://127.0.0.1:")
            status, _ = await h.post(payload(on(1, "f1")), token=None, ssl=client(ours))
            assert status == 200
            for pki in (None, theirs):
                with pytest.raises(aiohttp.ClientError):
                    await h.post(payload(on(2, "f2")), token=None, ssl=client(pki))
            assert h.sink.written == [(ref(1), "f1@2026-12-02T10:00:00Z")]
    asyncio.run(scenario())


def test_mtls_and_a_token_together_need_both(tmp_path: Path) -> None:
    pki = tmp_path / "pki"
    write_pki(pki)
    context = ssl.create_default_context(cafile=str(pki / "ca.crt"))
    context.load_cert_chain(str(pki / "admin.crt"), str(pki / "admin.key"))

    async def scenario() -> None:
        async with harness(tmp_path, tls_cert_file=str(pki / "apiserver.crt"), tls_key_file=str(pki / "apiserver.key"),
                           client_ca_file=str(pki / "ca.crt")) as h:
            assert (await h.post(payload(on(1, "f1")), token=None, ssl=context))[0] == 401
            assert (await h.post(payload(on(1, "f1")), ssl=context))[0] == 200
    asyncio.run(scenario())


# --- settings -------------------------------------------------------------------------------------

def test_the_webhook_is_off_without_a_token_file_or_client_ca(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text(TOKEN)
    assert not WebhookSettings().enabled
    assert WebhookSettings(token_file=str(token)).enabled
    assert not WebhookSettings(token_file=str(token), port=0).enabled
    with pytest.raises(ValueError, match="off"):
        asyncio.run(serve(WebhookSettings(), Sink(), lambda a: None, lambda: True))


@pytest.mark.parametrize(("settings", "words"), [
    ({"tls_cert_file": "c"}, "go together"),
    ({"tls_key_file": "k", "token_file": "t"}, "go together"),
    ({"client_ca_file": "ca"}, "needs --alert-tls-cert-file"),
    ({"tls_cert_file": "c", "tls_key_file": "k"}, "without --alert-token-file"),
    ({"rate": 0.0}, "--alert-rate 0 is not above 0"),
    ({"burst": 0}, "--alert-burst 0"),
    ({"port": 70000}, "not a port"),
    ({"token_file": "/nonexistent/token"}, "/nonexistent/token is not a file"),
])
def test_bad_combinations_are_named(settings: dict[str, Any], words: str) -> None:
    problems = WebhookSettings(**settings).problems()
    assert any(words in p for p in problems), problems


def test_good_settings_have_no_problems(tmp_path: Path) -> None:
    for name in ("token", "crt", "key", "ca"):
        (tmp_path / name).write_text("x")
    assert WebhookSettings().problems() == []
    assert WebhookSettings(token_file=str(tmp_path / "token")).problems() == []
    assert WebhookSettings(tls_cert_file=str(tmp_path / "crt"), tls_key_file=str(tmp_path / "key"),
                           client_ca_file=str(tmp_path / "ca")).problems() == []


def test_a_renewed_serving_certificate_is_loaded_without_a_restart(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(webhook, "CERT_RELOAD_SECONDS", 0.05)
    old, new = tmp_path / "old", tmp_path / "new"
    write_pki(old)
    write_pki(new)
    serving = tmp_path / "serving"
    serving.mkdir()
    for name in ("apiserver.crt", "apiserver.key"):
        shutil.copy(old / name, serving / name)

    def trusting(pki: Path) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(pki / "ca.crt"))

    async def scenario() -> None:
        async with harness(tmp_path, tls_cert_file=str(serving / "apiserver.crt"),
                           tls_key_file=str(serving / "apiserver.key")) as h:
            assert (await h.post(payload(on(1, "f1")), ssl=trusting(old)))[0] == 200
            # cert-manager (or a Secret update) swaps in a certificate of another CA.
            for name in ("apiserver.key", "apiserver.crt"):
                shutil.copy(new / name, serving / f"{name}.tmp")
                os.replace(serving / f"{name}.tmp", serving / name)
            for _ in range(100):
                await asyncio.sleep(0.05)
                try:
                    status, _ = await h.post(payload(on(1, "f2")), ssl=trusting(new))
                    break
                except aiohttp.ClientError:
                    continue
            else:
                raise AssertionError("the new certificate was not served within 5 s")
            assert status == 200
            with pytest.raises(aiohttp.ClientError):
                await h.post(payload(on(1, "f3")), ssl=trusting(old))
    asyncio.run(scenario())
