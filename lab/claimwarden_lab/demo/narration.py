"""How the demo speaks: colour, headings, notes, commands as a user would type them, and hints.

Every command a scene runs is introduced by a one-line note (``# ...``), printed as the user would
type it (``$ kubectl ...``) and followed by its real output; this module only shapes that text.
"""

from __future__ import annotations

import contextlib
import re
import shlex
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO


def use_colour(stream: TextIO, environ: Mapping[str, str]) -> bool:
    """ANSI colour only on a terminal, and never when NO_COLOR is set (https://no-color.org)."""
    return not environ.get("NO_COLOR") and stream.isatty()


@dataclass(frozen=True)
class Style:
    colour: bool

    def _paint(self, code: str, text: str) -> str:
        return f"\033[{code}m{text}\033[0m" if self.colour else text

    def heading(self, number: int, total: int, title: str) -> str:
        return self._paint("1;36", f"== {number}/{total}. {title} ==")

    def note(self, text: str) -> str:
        return self._paint("32", f"# {text}")

    def command(self, text: str) -> str:
        return self._paint("1", f"$ {text}")

    def error(self, text: str) -> str:
        return self._paint("1;31", text)


def command_text(args: Sequence[str], stdin: str | None = None) -> str:
    """The kubectl command as a user would type it, with a here-document for what goes to stdin."""
    text = "kubectl " + shlex.join(args)
    return f"{text} <<EOF\n{stdin.rstrip()}\nEOF" if stdin else text


def grep_metrics(text: str, names: Sequence[str]) -> list[str]:
    """The sample lines of ``names`` in Prometheus text, as `grep -E '^(name1|name2)[{ ]'` finds them."""
    pattern = re.compile(rf"^({'|'.join(re.escape(n) for n in names)})[{{ ]")
    return [line for line in text.splitlines() if pattern.match(line)]


def sample_sum(lines: Sequence[str], name: str) -> float:
    """Sum of the samples of ``name`` (any labels) among Prometheus text lines."""
    total = 0.0
    for line in lines:
        metric, _, value = line.rpartition(" ")
        if metric.split("{")[0] == name:
            total += float(value)
    return total


def self_command(argv0: str | None = None) -> str:
    """How the user started claimwarden (`.venv/bin/claimwarden` under make), to repeat in hints."""
    path = Path(argv0 if argv0 is not None else sys.argv[0])
    if path.name != "claimwarden":
        return "claimwarden"
    with contextlib.suppress(ValueError):
        path = path.resolve().relative_to(Path.cwd().resolve()) if path.is_absolute() else path
    return shlex.quote(str(path))
