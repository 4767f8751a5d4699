"""`kubectl_complete-claimwarden`: completion through kubectl itself (kubectl 1.26 and later).

When a user presses tab after `kubectl claimwarden`, kubectl looks on PATH for an executable named
`kubectl_complete-claimwarden` and runs it with the words typed after the plugin's name, the word being
completed last (empty after a space). It reads the candidates one a line from stdout, and a last line
`:N` as Cobra's shell directive: 4 (no file completion) here, 0 (the shell's default, file names) after
`--kubeconfig`. The candidates come from the plugin's parser (meta.verb_specs), as the bash script's do,
so there is no second list to keep in step. Nothing is read from a cluster: object names are not offered.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from .meta import verb_specs

DIRECTIVE_DEFAULT = 0
"""Cobra's ShellCompDirectiveDefault: the shell may offer file names."""
DIRECTIVE_NO_FILES = 4
"""Cobra's ShellCompDirectiveNoFileComp."""
FILE_FLAGS = ("--kubeconfig",)


def completions(top: argparse.ArgumentParser, words: Sequence[str]) -> tuple[list[str], int]:
    """The candidates for the last of `words` (the words after the plugin's name), and Cobra's directive."""
    specs = {spec.name: spec for spec in verb_specs(top)}
    *before, current = list(words) or [""]
    verb = next((word for word in before if word in specs), None)
    if verb is None:
        return [name for name in specs if name.startswith(current)], DIRECTIVE_NO_FILES
    spec = specs[verb]
    previous = before[-1] if before else ""
    if previous in FILE_FLAGS:
        return [], DIRECTIVE_DEFAULT
    if previous in spec.choices:
        return [value for value in spec.choices[previous] if value.startswith(current)], DIRECTIVE_NO_FILES
    flag, equals, value = current.partition("=")
    if equals and flag in spec.choices:
        return [f"{flag}={choice}" for choice in spec.choices[flag] if choice.startswith(value)], DIRECTIVE_NO_FILES
    if current.startswith("-"):
        return [option for option in spec.flags if option.startswith(current)], DIRECTIVE_NO_FILES
    return [], DIRECTIVE_NO_FILES


def main(argv: Sequence[str] | None = None) -> int:
    from .cli import parser

    found, directive = completions(parser(), list(sys.argv[1:] if argv is None else argv))
    for candidate in found:
        print(candidate)
    print(f":{directive}")
    return 0
