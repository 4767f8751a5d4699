"""One version source: __version__ in operator/claimwarden/__init__.py. Every other place reads it, and a file
that writes the version out again fails here (the CHANGELOG, which names versions by design, and Go module
files, which pin other modules' versions, excepted)."""

from __future__ import annotations

import re
import subprocess
import tomllib
from pathlib import Path

import pytest
from release import plan

from claimwarden import __version__

ROOT = Path(__file__).resolve().parents[2]
SOURCE = "operator/claimwarden/__init__.py"
# The CHANGELOG names versions by design. Helm needs a literal version in Chart.yaml: the chart's own test holds
# it equal to __version__, and a release packages the chart with --version/--app-version of its own.
# The release plan's test is a table of versions to parse, this one of versions to find.
MAY_NAME_VERSIONS = {"CHANGELOG.md", "charts/claimwarden/Chart.yaml", "tests/unit/test_release_plan.py",
                     "tests/unit/test_version_source.py"}
# What precedes a version that is another thing's: a DRA driver's, an OCI layout's, a CNI config's, semver's own,
# a pinned dependency's. Without these the guard fails on the day __version__ becomes 1.0.0 or 2.0.0.
OTHERS = re.compile(r"(driverVersion\W+(version\W+)?|imageLayoutVersion\W+|cniVersion\W+|[sS]emver\W+|==\s*)$")


def _tracked_files() -> list[str]:
    out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return [name for name in out.split("\0") if name]


def _written_out(version: str) -> re.Pattern[str]:
    """The version as a token: not a part of a longer version, nor a Go module's "v1.2.3"."""
    return re.compile(rf"(?<![\w.]){re.escape(version)}(?!\.?\d)")


def test_the_source_is_the_package_version_and_pyproject_reads_it() -> None:
    assert plan.source_version((ROOT / SOURCE).read_text()) == __version__
    plan.parse_version(__version__)  # semver that Python can spell too, as a release needs
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "version" not in project["project"] and "version" in project["project"]["dynamic"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "claimwarden.__version__"}


def _places_naming(version: str) -> list[str]:
    """file:line of every tracked file that writes `version` out as claimwarden's."""
    token = _written_out(version)
    found = []
    for name in _tracked_files():
        if name == SOURCE or name in MAY_NAME_VERSIONS or Path(name).name in ("go.mod", "go.sum"):
            continue
        path = ROOT / name
        if not path.is_file():
            continue  # deleted in the working tree, not yet committed
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue
        found += [f"{name}:{n}" for n, line in enumerate(text.splitlines(), 1)
                  if any(not OTHERS.search(line[:m.start()]) for m in token.finditer(line))]
    return found


def test_no_tracked_file_writes_the_version_out_again() -> None:
    found = _places_naming(__version__)
    assert not found, f"{__version__} written out (read __version__ or the Makefile's SOURCE_VERSION): {found}"


@pytest.mark.parametrize("version", ["0.2.0", "1.0.0", "2.0.0"])
def test_the_guard_is_quiet_at_the_next_versions(version: str) -> None:
    """Bumping __version__ for a release must not fail on other things' versions."""
    assert not _places_naming(version)


def test_the_guard_sees_a_version_written_out() -> None:
    token = _written_out("1.2.3")
    assert token.search("IMAGE ?= claimwarden:1.2.3") and token.search("dist/claimwarden-1.2.3.oci.tar")
    assert not token.search("github.com/containerd/log v1.2.3") and not token.search("11.2.3.4")
    for other in ('"driverVersion": {"version": "1.2.3"}', "requests==1.2.3", 'semver("1.2.3")'):
        assert OTHERS.search(other[:token.search(other).start()]), other  # type: ignore[union-attr]
    assert not OTHERS.search("image: claimwarden:")
