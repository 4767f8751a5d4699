"""The play: which scenes run, in what order, and what happens around them (signals, pauses, clean-up).

`run` sets the stage up, plays the scenes under numbered headings, then either hands over to
claimwarden's log in the foreground or, with ``--exit``, cleans up and ends. SIGTERM is handled like
Ctrl-C.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from collections.abc import Callable, Mapping
from types import FrameType
from typing import TextIO

from ..processes import LabError
from . import lifecycle
from .narration import Style, use_colour
from .options import DemoError, DemoOptions
from .scenes import broken, cluster, containers, delete, fallback, metrics, recovery, shared, template
from .stage import Stage

Scene = tuple[str, Callable[[Stage], None]]


def scenes(*, with_models: bool) -> list[Scene]:
    """The walkthrough's four experiments, the broken GPU and its recovery, the fallback when the lab has
    the models for it, and what Prometheus would see."""
    played = [cluster, template, containers, shared, delete, broken, recovery]
    if with_models:
        played.append(fallback)
    played.append(metrics)
    return [(scene.TITLE, scene.play) for scene in played]


def play(stage: Stage, *, playlist: list[Scene]) -> None:
    for number, (title, scene) in enumerate(playlist, start=1):
        if number > 1 and stage.options.pause:
            _pause(stage)
        stage.print()
        stage.print(stage.style.heading(number, len(playlist), title))
        scene(stage)


def _pause(stage: Stage) -> None:
    stage.print(stage.style.note("(press Enter for the next scene)"))
    with contextlib.suppress(EOFError):
        input()


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def run(options: DemoOptions, out: TextIO | None = None, environ: Mapping[str, str] | None = None) -> int:
    """Play the demo; return the exit code.

    SIGTERM is handled like Ctrl-C: clean up, stop what we started. SIGINT is handled even when the
    demo was started with it ignored (a shell's background job), so that Ctrl-C semantics are testable.
    """
    out = out or sys.stdout
    style = Style(use_colour(out, os.environ if environ is None else environ))
    previous = signal.signal(signal.SIGTERM, _interrupt), signal.signal(signal.SIGINT, _interrupt)
    started = time.monotonic()
    stage: Stage | None = None
    try:
        stage = Stage(options, out, style)
        lifecycle.setup(stage)
        playlist = scenes(with_models=bool(stage.models))
        play(stage, playlist=playlist)
        print(f"\ndemo: {len(playlist)} scenes played in {time.monotonic() - started:.1f}s", file=out, flush=True)
        if not options.exit:
            return lifecycle.foreground(stage)
        lifecycle.clean_up(stage)
        return 0
    except (DemoError, LabError) as exc:
        print(style.error(f"demo: error: {exc}"), file=out, flush=True)
        if stage is not None:
            lifecycle.clean_up(stage)
        return 1
    except KeyboardInterrupt:
        print("\ndemo: interrupted; cleaning up", file=out, flush=True)
        if stage is not None:
            lifecycle.clean_up(stage)
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous[0])
        signal.signal(signal.SIGINT, previous[1])
