"""The elector against an apiserver it cannot reach, and two candidates on one Lease with a fake clock."""

from __future__ import annotations

import asyncio
import copy
import socket
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from kubernetes.aio import client as aio

from claimwarden.kube.api import Kube
from claimwarden.kube.errors import ApiError
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


# --- two candidates on one Lease, with a fake clock: who may write when ---------------------------

class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class LeaseServer:
    """One Lease behind the calls the elector makes: GET, POST, and PUT as a compare-and-swap."""

    def __init__(self) -> None:
        self.lease: dict[str, Any] | None = None
        self.version = 0

    def answer(self, method: str, body: Any) -> dict[str, Any] | None:
        if method == "GET":
            return copy.deepcopy(self.lease)
        if method == "PUT":
            assert self.lease is not None
            if body["metadata"]["resourceVersion"] != self.lease["metadata"]["resourceVersion"]:
                raise ApiError(409, "Conflict", "the object has been modified")
        self.version += 1
        self.lease = {**copy.deepcopy(body), "metadata": {**body["metadata"], "resourceVersion": str(self.version)}}
        return copy.deepcopy(self.lease)


class LeaseClient:
    """What one candidate's Kube would do against `server`; `on_get` runs while a GET is on its way."""

    def __init__(self, server: LeaseServer) -> None:
        self.server = server
        self.on_get: Callable[[], Awaitable[None]] | None = None

    async def request(self, method: str, path: str, body: Any = None, **_: Any) -> dict[str, Any] | None:
        if method == "GET" and self.on_get is not None:
            during, self.on_get = self.on_get, None
            await during()
        return self.server.answer(method, body)


def _candidate(identity: str, server: LeaseServer, clock: Clock) -> tuple[Elector, LeaseClient]:
    async def started() -> None:
        pass

    api = LeaseClient(server)
    elector = Elector(api, ElectionSettings(namespace="ns", identity=identity),  # type: ignore[arg-type]
                      on_started=started, on_lost=lambda: None, clock=clock)
    return elector, api


def test_a_renewal_seen_by_a_slow_read_is_dated_when_the_read_returns() -> None:
    """The review's timeline: the standby's GET starts at 99.0, the holder renews at 100 (its lease now
    holds until 115), the GET returns at 100.5 with the renewed record. Dated from 99.0 the standby took
    over at 114.0, while the holder could still write."""
    clock = Clock(90.0)
    server = LeaseServer()
    holder, _ = _candidate("holder", server, clock)
    standby, standby_api = _candidate("standby", server, clock)
    takeovers: list[float] = []

    async def renewal_meanwhile() -> None:
        clock.now = 100.0
        assert await holder._try()
        clock.now = 100.5

    async def scenario() -> None:
        assert await holder._try()
        holder.leading = True
        clock.now = 92.0
        assert not await standby._try()
        clock.now = 99.0
        standby_api.on_get = renewal_meanwhile
        assert not await standby._try()
        assert holder.holds_lease() and clock.now == 100.5
        while clock.now < 117.0:
            clock.now += 0.25
            if await standby._try():
                takeovers.append(clock.now)
                assert not holder.holds_lease(), f"two leaders at {clock.now}"

    asyncio.run(scenario())
    assert takeovers and takeovers[0] == pytest.approx(115.5), takeovers


def test_the_holders_own_renewal_counts_from_before_its_read() -> None:
    """For the holder the early date is the safe one: a renewal whose read took 0.7 s holds 15 s from its start."""
    clock = Clock(100.0)
    server = LeaseServer()
    holder, api = _candidate("holder", server, clock)

    async def slow() -> None:
        clock.now = 100.7

    async def scenario() -> None:
        api.on_get = slow
        assert await holder._try()
        holder.leading = True

    asyncio.run(scenario())
    clock.now = 114.9
    assert holder.holds_lease()
    clock.now = 115.0
    assert not holder.holds_lease()


def test_the_leader_sends_writes_only_within_the_renew_deadline_of_its_last_renewal() -> None:
    """The rest of the lease (15 - 10 s) is left for a write already on its way; a standby gets no time."""
    clock = Clock(100.0)
    server = LeaseServer()
    holder, _ = _candidate("holder", server, clock)
    standby, _ = _candidate("standby", server, clock)

    async def scenario() -> None:
        assert await holder._try()
        holder.leading = True
        assert not await standby._try()

    asyncio.run(scenario())
    clock.now = 104.0
    assert holder.write_time_left() == pytest.approx(6.0) and standby.write_time_left() <= 0
    clock.now = 110.0
    assert holder.write_time_left() <= 0 and holder.holds_lease()
