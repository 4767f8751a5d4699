"""A drop-in for Kopf's ``ToggleSet`` that does not wake every waiter on every change.

At start-up Kopf holds back every object's handlers until all objects are indexed: one toggle per
object in a ``ToggleSet(all)``, and each object's worker waits on the set. Kopf's set recomputes
``all(...)`` over its toggles (O(N)) in every waiter (N) on every toggle added or dropped (N): with
1,000 pods and their claims a restart spent a minute of CPU there (py-spy: ``Condition.notify_all``,
``ToggleSet.make_toggle``), and it grows as the cube of the objects.

This set counts its toggles that are on, so its state is O(1), and wakes its waiters only when the
state of the whole set flips. Semantics are Kopf's: ``fn`` is ``all`` or ``any`` over the toggles
(any other function falls back to evaluating it); toggles come only from `make_toggle`.
`install` swaps it in for Kopf's class before ``kopf.run`` (through `kopf_private`, Kopf's one door).
"""

from __future__ import annotations

import asyncio
import builtins
from collections.abc import Callable, Iterable, Iterator

from .kopf_private import Toggle, ToggleSet, install_toggle_set


class CountedToggle(Toggle):
    """A toggle of a `CountingToggleSet`: tells its set when it flips."""

    def __init__(self, state: bool, *, name: str | None, owner: CountingToggleSet) -> None:
        super().__init__(state, name=name)
        self._owner = owner

    async def turn_to(self, __state: bool) -> None:
        before = self.is_on()
        await super().turn_to(__state)
        if before != self.is_on():
            self._owner._flipped(self, self.is_on())


class CountingToggleSet(ToggleSet):
    def __init__(self, fn: Callable[[Iterable[bool]], bool]) -> None:
        super().__init__(fn)
        global _INDEXED
        if fn is builtins.all:  # Kopf makes one ToggleSet(all): its orchestrator's operator_indexed
            _INDEXED = self
        self._ever_toggled = False  # empty, all() is true before the orchestrator adds its first toggle
        self._members: set[Toggle] = set()
        self._on_count = 0
        self._became_on = asyncio.Event()
        self._became_off = asyncio.Event()
        self._state = self._compute()
        (self._became_on if self._state else self._became_off).set()

    def _compute(self) -> bool:
        if self._fn is builtins.all:
            return self._on_count == len(self._members)
        if self._fn is builtins.any:
            return self._on_count > 0
        return self._fn(toggle.is_on() for toggle in self._members)

    def _refresh(self) -> None:
        state = self._compute()
        if state != self._state:
            self._state = state
            (self._became_on if state else self._became_off).set()
            (self._became_off if state else self._became_on).clear()

    def _flipped(self, toggle: Toggle, on: bool) -> None:
        if toggle in self._members:
            self._on_count += 1 if on else -1
            self._refresh()

    def __repr__(self) -> str:
        return repr(self._members)

    def __len__(self) -> int:
        return len(self._members)

    def __iter__(self) -> Iterator[Toggle]:
        return iter(self._members)

    def __contains__(self, toggle: object) -> bool:
        return toggle in self._members

    def is_on(self) -> bool:
        return self._state

    def is_off(self) -> bool:
        return not self._state

    async def wait_for(self, __state: bool) -> None:
        while self._state != bool(__state):
            await (self._became_on if __state else self._became_off).wait()

    async def make_toggle(self, __val: bool = False, *, name: str | None = None) -> Toggle:
        toggle = CountedToggle(__val, name=name, owner=self)
        self._ever_toggled = True
        self._members.add(toggle)
        self._on_count += toggle.is_on()
        self._refresh()
        return toggle

    async def drop_toggle(self, toggle: Toggle) -> None:
        await self.drop_toggles([toggle])

    async def drop_toggles(self, toggles: Iterable[Toggle]) -> None:
        for toggle in toggles:
            if toggle in self._members:
                self._members.discard(toggle)
                self._on_count -= toggle.is_on()
        self._refresh()


_INDEXED: CountingToggleSet | None = None


def indexed() -> bool:
    """Kopf has listed every resource it watches once (readiness.py): its orchestrator's operator_indexed, the one
    ToggleSet(all) it makes, holds a toggle per watched resource and is on once each resource's initial
    listing is indexed (and its own blocker, held while it starts the watchers, is dropped)."""
    return _INDEXED is not None and _INDEXED._ever_toggled and _INDEXED.is_on()


def install() -> None:
    """Make Kopf create `CountingToggleSet`s (its modules look the class up in `aiotoggles` when they run)."""
    install_toggle_set(CountingToggleSet)
