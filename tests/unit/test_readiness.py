"""/readyz: ready when Kopf has indexed everything and (with leader election) the Lease was read recently."""

from __future__ import annotations

import asyncio
import urllib.error
import urllib.request

import pytest

from claimwarden.runtime import kopf_toggles
from claimwarden.runtime.kopf_toggles import CountingToggleSet
from claimwarden.runtime.readiness import Readiness, decide, split_url
from claimwarden.runtime.server import readiness_handler, serve
from claimwarden_lab.processes import free_port


@pytest.mark.parametrize(("indexed", "last_contact", "max_age", "ready"), [
    (False, 99.0, 15.0, False),  # a standby or leader still listing
    (True, None, 15.0, False),  # the Lease not read yet
    (True, 90.0, 15.0, True),  # read 10 s ago: connected, whether leading or standing by
    (True, 85.0, 15.0, False),  # read a lease duration ago: cut off from the API server
    (True, None, None, True),  # --leader-elect=false: nothing reads the Lease, indexing decides
    (False, None, None, False),
])
def test_ready_when_indexed_and_the_lease_was_read_within_a_lease_duration(
        indexed: bool, last_contact: float | None, max_age: float | None, ready: bool) -> None:
    state = decide(indexed=indexed, last_contact=last_contact, now=100.0, max_age=max_age)
    assert state.ready is ready and state.reason


def test_the_reason_says_how_long_ago_the_api_answered() -> None:
    assert decide(indexed=True, last_contact=70.0, now=100.0, max_age=15.0).reason == (
        "the last successful API request (the Lease) was 30 s ago")


@pytest.mark.parametrize("url", ["https://0.0.0.0:8082/readyz", "http://0.0.0.0/readyz", "http://0.0.0.0:8082"])
def test_only_an_http_url_with_port_and_path_is_served(url: str) -> None:
    with pytest.raises(ValueError, match="is not an http://host:port/path URL"):
        split_url(url)
    assert split_url("http://0.0.0.0:8082/readyz") == ("0.0.0.0", 8082, "/readyz")


def test_indexed_only_once_kopfs_all_set_had_toggles_and_all_are_on() -> None:
    async def scenario() -> list[bool]:
        operator_indexed = CountingToggleSet(all)
        states = [kopf_toggles.indexed()]  # empty: all() is true, but nothing was listed yet
        blocker = await operator_indexed.make_toggle(name="orchestration blocker")
        pods = await operator_indexed.make_toggle(name="pods")
        states.append(kopf_toggles.indexed())
        await pods.turn_to(True)
        await operator_indexed.drop_toggle(blocker)
        states.append(kopf_toggles.indexed())
        CountingToggleSet(any)  # Kopf's operator_paused: not the one readiness reads
        states.append(kopf_toggles.indexed())
        return states

    assert asyncio.run(scenario()) == [False, False, True, True]


def test_the_server_answers_200_or_503_with_the_reason() -> None:
    port = free_port()
    answers = [Readiness(False, "not all watched resources are listed yet"), Readiness(True, "indexed and connected")]

    def get() -> tuple[int, str]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5) as response:
                return response.status, response.read().decode()
        except urllib.error.HTTPError as error:
            return error.code, error.read().decode()

    async def scenario() -> list[tuple[int, str]]:
        runner = await serve({f"http://127.0.0.1:{port}/readyz": readiness_handler(lambda: answers[0])})
        try:
            first = await asyncio.to_thread(get)
            answers.pop(0)
            return [first, await asyncio.to_thread(get)]
        finally:
            await runner.cleanup()

    assert asyncio.run(scenario()) == [(503, "not all watched resources are listed yet\n"),
                                       (200, "indexed and connected\n")]
