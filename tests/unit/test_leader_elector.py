"""The elector's loop survives an apiserver it cannot reach (it used to die with the connection error)."""

from __future__ import annotations

import asyncio
import socket

from kubernetes.aio import client as aio

from claimwarden.kube.api import Kube
from claimwarden.leader.elector import ElectionSettings, Elector


def test_a_round_against_an_unreachable_apiserver_fails_quietly_and_holds_nothing() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]

    async def scenario() -> None:
        kube = Kube(aio.ApiClient(aio.Configuration(host=f"http://127.0.0.1:{port}")), request_timeout=2)

        async def started() -> None:
            raise AssertionError("must not lead")

        elector = Elector(kube, ElectionSettings(namespace="ns", identity="me"), on_started=started,
                          on_lost=lambda: None)
        try:
            assert await elector._try() is False
            assert not elector.holds_lease()
        finally:
            await kube.close()

    asyncio.run(scenario())
