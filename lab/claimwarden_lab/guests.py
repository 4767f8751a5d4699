"""Processes that run against a lab without being part of it, recorded so that `claimwarden lab down` stops them."""

from __future__ import annotations

import json
from pathlib import Path

from .processes import Process, is_running, stop

GUESTS_DIR = "guests"
"""Processes that run against the lab without being part of it (the demo's claimwarden) record
themselves in DIR/guests/NAME.json, so that `down` stops them too if whoever started them could not."""


def add_guest(directory: Path, proc: Process) -> None:
    """Record ``proc`` as running against the lab in ``directory`` (see GUESTS_DIR)."""
    guests = directory / GUESTS_DIR
    guests.mkdir(exist_ok=True)
    (guests / f"{proc.name}.json").write_text(json.dumps(proc.to_json(), indent=2))


def remove_guest(directory: Path, proc: Process) -> None:
    (directory / GUESTS_DIR / f"{proc.name}.json").unlink(missing_ok=True)


def guests(directory: Path) -> list[Process]:
    found = []
    for path in sorted((directory / GUESTS_DIR).glob("*.json")):
        try:
            found.append(Process.from_json(json.loads(path.read_text())))
        except (OSError, ValueError, KeyError, TypeError):
            path.unlink(missing_ok=True)  # half written by a killed run; its process is unknown
    return found


def stop_guests(directory: Path) -> list[Process]:
    """Stop (by PID) every guest of the lab in ``directory`` that still runs; return those."""
    stopped = []
    for proc in guests(directory):
        if is_running(proc):
            stop(proc)
            stopped.append(proc)
        remove_guest(directory, proc)
    return stopped
