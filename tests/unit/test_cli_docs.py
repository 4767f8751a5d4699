"""docs/reference/cli.md is what the argparse parsers say now (lab/claimwarden_lab/clidocs.py)."""

from __future__ import annotations

import argparse

from claimwarden_lab import clidocs


def test_the_cli_reference_is_current() -> None:
    assert clidocs.PAGE.read_text() == clidocs.render(), "run 'make cli-docs'"


def test_every_verb_of_both_front_ends_has_its_section() -> None:
    page = clidocs.render()
    for heading in ("## claimwarden", "### claimwarden run", "### claimwarden lab up", "## kubectl claimwarden",
                    "### kubectl claimwarden explain", "### kubectl claimwarden doctor",
                    "### kubectl claimwarden devices", "### kubectl claimwarden mark",
                    "### kubectl claimwarden clear", "### kubectl claimwarden approve",
                    "### kubectl claimwarden drain"):
        assert f"\n{heading}\n" in page
    assert "--leader-elect-lease-duration" in page and "--dry-run" in page


def test_a_new_flag_changes_the_page_and_stub_verbs_are_left_out() -> None:
    top = argparse.ArgumentParser(prog="tool")
    sub = top.add_subparsers()
    verb = sub.add_parser("verb", help="does it")
    sub.add_parser("stub", add_help=False)
    before = [p.prog for p in clidocs.commands(top)]
    assert before == ["tool", "tool verb"]
    text = clidocs._help(verb)
    verb.add_argument("--new-flag", help="a new flag")
    assert "--new-flag" not in text and "--new-flag" in clidocs._help(verb)
