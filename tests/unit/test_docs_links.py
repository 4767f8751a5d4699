"""Every relative link in README.md and docs/ leads to a file that exists (and to a heading that exists, when it
names one), and every alert's runbook_url names a section of docs/reference/alerts.md."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
RULES = [ROOT / "manifests" / "monitoring" / "prometheusrule.yaml",
         ROOT / "manifests" / "monitoring" / "gpu-prometheusrule.yaml"]
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#{1,6} (.+)$")


def _outside_code(text: str) -> list[str]:
    lines, fenced = [], False
    for line in text.split("\n"):
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced:
            lines.append(re.sub(r"`[^`]*`", lambda m: m.group(0) if "](" not in m.group(0) else "", line))
    return lines


def anchors(text: str) -> set[str]:
    """The anchors GitHub gives a page's headings: lower case, punctuation dropped, spaces as hyphens,
    -1, -2 ... on repeats."""
    found: dict[str, int] = {}
    for line in _outside_code(text):
        match = HEADING.match(line)
        if not match:
            continue
        slug = re.sub(r"[^\w\- ]", "", match.group(1).strip().lower()).replace(" ", "-")
        count = found.get(slug, 0)
        found[slug] = count + 1
        if count:
            found[f"{slug}-{count}"] = 1
    return set(found)


def broken_links(page: Path, root: Path = ROOT) -> list[str]:
    broken = []
    for line in _outside_code(page.read_text()):
        for target in LINK.findall(line):
            if re.match(r"^[a-z]+:", target):
                continue  # https:, mailto: ...: not checked here
            path, _, anchor = target.partition("#")
            file = (page.parent / path).resolve() if path else page
            if not file.exists():
                broken.append(f"{page.relative_to(root)}: {target}: no such file")
            elif anchor and file.suffix == ".md" and anchor not in anchors(file.read_text()):
                broken.append(f"{page.relative_to(root)}: {target}: no such heading")
    return broken


def test_every_relative_link_resolves() -> None:
    assert len(PAGES) > 20
    assert [problem for page in PAGES for problem in broken_links(page)] == []


def test_a_broken_link_and_a_missing_anchor_are_found(tmp_path: Path) -> None:
    (tmp_path / "a.md").write_text("# A page\n\n## Same\n\n## Same\n\n[ok](#same-1) [bad](#nope) [gone](b.md)\n"
                                   "```\n[in code](c.md)\n```\n")
    assert broken_links(tmp_path / "a.md", tmp_path) == ["a.md: #nope: no such heading", "a.md: b.md: no such file"]


def test_the_anchors_follow_github() -> None:
    assert anchors("# `make bench`: claimwarden beside X\n## Kubernetes versions: 1.34 to 1.37\n") == {
        "make-bench-claimwarden-beside-x", "kubernetes-versions-134-to-137"}


def test_every_alert_has_a_runbook_url_naming_its_section() -> None:
    sections = anchors((ROOT / "docs" / "reference" / "alerts.md").read_text())
    alerts = [rule for file in RULES for group in yaml.safe_load(file.read_text())["spec"]["groups"]
              for rule in group["rules"] if "alert" in rule]
    assert len(alerts) >= 12
    for rule in alerts:
        url = rule["annotations"].get("runbook_url")
        assert url == f"docs/reference/alerts.md#{rule['alert'].lower()}", rule["alert"]
        assert url.partition("#")[2] in sections, f"{rule['alert']}: no section in docs/reference/alerts.md"
