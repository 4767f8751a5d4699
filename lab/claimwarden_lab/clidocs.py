"""The CLI reference, docs/reference/cli.md, generated from the argparse parsers themselves.

Every command and verb of ``claimwarden`` (with the lab's, when claimwarden-lab is installed) and of
``kubectl claimwarden`` gets a heading (its anchor) and its ``--help`` text, formatted at a fixed width so
that the page does not depend on the terminal. ``python -m claimwarden_lab.clidocs`` (``make cli-docs``)
writes the page, and tests/unit/test_cli_docs.py checks that the committed page is what this module would
write.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from pathlib import Path

from claimwarden import cli as claimwarden_cli
from claimwarden.plugin import cli as plugin_cli

from . import cli as lab_cli

PAGE = Path(__file__).resolve().parents[2] / "docs" / "reference" / "cli.md"
WIDTH = 100
HEADER = """# CLI reference

<!-- generated from the argparse parsers by `make cli-docs` (lab/claimwarden_lab/clidocs.py); do not edit:
     tests/unit/test_cli_docs.py fails when this page is stale -->

Two front ends: `claimwarden` (the operator, `run`; the plugin's verbs; the lab, a development tool) and
`kubectl claimwarden` (the kubectl plugin, the console script `kubectl-claimwarden`). Each section is the
command's `--help`.
"""


def _help(parser: argparse.ArgumentParser) -> str:
    """The parser's help at WIDTH columns, with this user's home directory (in defaults) written as ~."""
    parser.formatter_class = lambda prog: argparse.HelpFormatter(prog, width=WIDTH)
    return parser.format_help().rstrip().replace(str(Path.home()), "~")


def commands(parser: argparse.ArgumentParser) -> Iterator[argparse.ArgumentParser]:
    """The parser and every sub-command's parser below it, depth first, in the order they were added.

    A verb added with ``add_help=False`` only hands its arguments to another front end (claimwarden's
    stubs of the plugin's verbs): it is documented there, not here."""
    yield parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in dict.fromkeys(action.choices.values()):
                if child.add_help:
                    yield from commands(child)


def render() -> str:
    sections = [HEADER]
    for top in (claimwarden_cli._parser(lab_cli), plugin_cli.parser()):
        for number, parser in enumerate(commands(top)):
            level = "##" if number == 0 else "###"
            sections.append(f"{level} {parser.prog}\n\n```text\n{_help(parser)}\n```\n")
    return "\n".join(sections)


def main(page: Path = PAGE) -> int:
    page.parent.mkdir(parents=True, exist_ok=True)
    page.write_text(render())
    print(f"wrote {page}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
