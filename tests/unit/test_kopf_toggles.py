"""The toggle set that replaces Kopf's: Kopf's semantics, O(1) state, waiters woken only on a flip."""

from __future__ import annotations

import asyncio

import pytest
from kopf._cogs.aiokits import aiotoggles

from claimwarden.runtime.kopf_toggles import CountingToggleSet, install


def test_all_set_is_on_only_when_every_toggle_is_on_and_empty_counts_as_on() -> None:
    async def scenario() -> list[bool]:
        toggles = CountingToggleSet(all)
        states = [toggles.is_on()]
        first = await toggles.make_toggle(name="pods listed")
        second = await toggles.make_toggle(True, name="claims listed")
        states.append(toggles.is_on())
        await first.turn_to(True)
        states.append(toggles.is_on())
        await second.turn_to(False)
        states.append(toggles.is_on())
        await toggles.drop_toggle(second)
        states.append(toggles.is_on())
        assert len(toggles) == 1 and first in toggles and second not in toggles
        return states

    assert asyncio.run(scenario()) == [True, False, True, False, True]


def test_any_set_follows_its_toggles() -> None:
    async def scenario() -> list[bool]:
        paused = CountingToggleSet(any)
        states = [paused.is_on()]
        reason = await paused.make_toggle(name="peering CRD is missing")
        states.append(paused.is_on())
        await reason.turn_to(True)
        states.append(paused.is_on())
        await paused.drop_toggles([reason])
        states.append(paused.is_on())
        return states

    assert asyncio.run(scenario()) == [False, False, True, False]


def test_other_functions_are_evaluated_over_the_toggles() -> None:
    async def scenario() -> bool:
        toggles = CountingToggleSet(lambda states: sum(states) == 1)
        await toggles.make_toggle(True)
        await toggles.make_toggle(False)
        return toggles.is_on()

    assert asyncio.run(scenario()) is True


def test_waiters_return_once_the_last_toggle_is_dropped_and_not_before() -> None:
    async def scenario() -> tuple[int, int]:
        indexed = CountingToggleSet(all)
        objects = [await indexed.make_toggle(name=f"object {i}") for i in range(1000)]
        waiters = [asyncio.create_task(indexed.wait_for(True)) for _ in range(1000)]
        for toggle in objects[:-1]:
            await indexed.drop_toggle(toggle)
        await asyncio.sleep(0)
        early = sum(w.done() for w in waiters)
        await indexed.drop_toggle(objects[-1])
        await asyncio.wait_for(asyncio.gather(*waiters), 5)
        return early, sum(w.done() for w in waiters)

    assert asyncio.run(scenario()) == (0, 1000)


def test_wait_for_off_and_a_toggle_s_own_wait() -> None:
    async def scenario() -> None:
        toggles = CountingToggleSet(all)
        toggle = await toggles.make_toggle(True)
        off = asyncio.create_task(toggles.wait_for(False))
        own = asyncio.create_task(toggle.wait_for(False))
        await asyncio.sleep(0)
        assert not off.done() and not own.done()
        await toggle.turn_to(False)
        await asyncio.wait_for(asyncio.gather(off, own), 5)
        await toggles.wait_for(False)  # already off: returns at once

    asyncio.run(scenario())


@pytest.fixture
def restore_kopf() -> object:
    original = aiotoggles.ToggleSet
    yield original
    aiotoggles.ToggleSet = original  # type: ignore[misc]


def test_install_makes_kopf_create_counting_sets(restore_kopf: object) -> None:
    install()
    assert aiotoggles.ToggleSet is CountingToggleSet
    assert isinstance(aiotoggles.ToggleSet(all), restore_kopf)  # type: ignore[arg-type]
