"""The values reference of charts/claimwarden, generated from the comments of its values.yaml.

A line ``# -- text`` (continued by plain ``# text`` lines) documents the key on the next line, as helm-docs
reads it. Every key is documented, or is a mapping whose keys all are; anything else is an error, so that a
new value cannot go into the chart without a word. The table replaces everything after MARKER in the chart's
README.md: ``python -m claimwarden_lab.chartdocs`` (``make chart-docs``) writes it, and tests/chart checks that
the committed README is what this module would write.
"""

from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

CHART = Path(__file__).resolve().parents[2] / "charts" / "claimwarden"
MARKER = "<!-- values reference: generated from values.yaml by `make chart-docs`; do not edit below -->"

_KEY = re.compile(r"^(?P<indent> *)(?P<key>[A-Za-z0-9_]+):(?P<rest>.*)$")
_DOC_START = re.compile(r"^ *# -- ?(?P<text>.*)$")
_DOC_MORE = re.compile(r"^ *# ?(?P<text>.*)$")


SECTION = object()
"""The default of a documented mapping whose keys have descriptions of their own (their rows give them)."""


class ValuesDocError(ValueError):
    """values.yaml has a key without a description, or a description without a key."""


@dataclass(frozen=True)
class Value:
    path: str
    default: Any  # SECTION for a mapping documented key by key
    description: str


def documented_keys(text: str) -> dict[str, str]:
    """Dotted key path -> its description, for every key preceded by a ``# --`` comment."""
    docs: dict[str, str] = {}
    stack: list[tuple[int, str]] = []
    pending: list[str] | None = None
    for number, line in enumerate(text.splitlines(), start=1):
        if (start := _DOC_START.match(line)) is not None:
            pending = [start["text"].strip()]
        elif pending is not None and (more := _DOC_MORE.match(line)) is not None:
            pending.append(more["text"].strip())
        elif (key := _KEY.match(line)) is not None:
            indent = len(key["indent"])
            while stack and stack[-1][0] >= indent:
                stack.pop()
            stack.append((indent, key["key"]))
            if pending is not None:
                docs[".".join(k for _, k in stack)] = " ".join(pending)
            pending = None
        elif pending is not None and line.strip():
            raise ValuesDocError(f"values.yaml line {number}: a `# --` description is followed by {line.strip()!r}, "
                                 "not by a key")
    return docs


def values(text: str) -> list[Value]:
    """The documented values in file order; a ValuesDocError names the first key that is not documented."""
    docs = documented_keys(text)
    tree = yaml.safe_load(text)
    found: list[Value] = []

    def walk(node: dict[str, Any], prefix: str) -> None:
        for key, default in node.items():
            path = f"{prefix}{key}"
            documented_below = any(k.startswith(f"{path}.") for k in docs)
            if path in docs:
                found.append(Value(path, SECTION if documented_below else default, docs[path]))
            if isinstance(default, dict) and default and (documented_below or path not in docs):
                walk(default, f"{path}.")
            elif path not in docs:
                raise ValuesDocError(f"values.yaml: {path} has no `# --` description")

    walk(tree, "")
    order = list(docs)
    return sorted(found, key=lambda value: order.index(value.path))


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def table(text: str) -> str:
    """The values reference, a Markdown table: key, default, description."""
    rows = ["| Key | Default | Description |", "| --- | --- | --- |"]
    for value in values(text):
        default = "" if value.default is SECTION else f"`{_cell(json.dumps(value.default, separators=(', ', ': ')))}`"
        rows.append(f"| `{value.path}` | {default} | {_cell(value.description)} |")
    return "\n".join(rows) + "\n"


def render(readme: str, values_text: str) -> str:
    """README.md with everything after MARKER replaced by the table."""
    head, found, _ = readme.partition(MARKER)
    if not found:
        raise ValuesDocError(f"the chart's README.md lacks the line {MARKER}")
    return f"{head}{MARKER}\n\n{table(values_text)}"


def main(chart: Path = CHART) -> int:
    readme = chart / "README.md"
    try:
        readme.write_text(render(readme.read_text(), (chart / "values.yaml").read_text()))
    except ValuesDocError as error:
        print(f"chartdocs: {error}", file=sys.stderr)
        return 1
    print(f"wrote the values reference into {readme}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
