"""`make release`'s script, run whole: every artifact in its directory, each checked from the outside.

It runs release/build.py as `make release VERSION=0.0.0-rc.0` does (the Makefile only adds its venv's python
and defaults), into a temporary directory. The `image` session fixture has built the image before, so the
base and the dependency layer are cached and the release rebuilds only the layers its stamped version
changes. No lab is needed. The chart is checked when charts/claimwarden exists (it is packaged then).
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from claimwarden_lab import binaries

from .test_image import ENV, ROOT, podman

VERSION = "0.0.0-rc.0"  # a pre-release: made from any commit, the copy stamped (a final one needs its commit)
PYTHON_VERSION = "0.0.0rc0"
IMAGE = f"localhost/claimwarden:{VERSION}"


def _release(*args: str, dist: Path, engine: str = "podman") -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "release.build", *args, "--dist", str(dist),
                           "--kubectl", str(binaries.bin_dir() / "kubectl")],
                          capture_output=True, text=True, cwd=ROOT, env={**ENV, "ENGINE": engine}, timeout=1800)


def _tracked_changes() -> str:
    return subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT, capture_output=True,
                          text=True, check=True).stdout


@pytest.fixture(scope="module")
def released(image: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, float]]:
    """dist/ of release 0.0.0-rc.0 and the seconds it took; its image is removed from podman's store after."""
    dist = tmp_path_factory.mktemp("release") / "dist"
    before = _tracked_changes()
    started = time.monotonic()
    # ALLOW_DIRTY: a developer's uncommitted work is built as it is; a clean clone (CI) builds HEAD.
    result = _release("--version", VERSION, "--allow-dirty", dist=dist)
    took = time.monotonic() - started
    print(f"release {VERSION}: {took:.0f} s")
    try:
        assert result.returncode == 0, f"release failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
        assert _tracked_changes() == before, "a release changes no tracked file"
        yield dist, took
    finally:
        podman("rmi", IMAGE)


def _archive(path: Path) -> dict[str, bytes]:
    with tarfile.open(path) as tar:
        return {m.name.removeprefix("./"): tar.extractfile(m).read()  # type: ignore[union-attr]
                for m in tar.getmembers() if m.isfile() and (m.name.endswith(".json") or m.size < 100_000)}


def _documents(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def test_a_release_writes_every_artifact_and_each_checks_out(released: tuple[Path, float]) -> None:
    dist, _ = released
    names = {p.name for p in dist.iterdir()}
    chart = ROOT / "charts" / "claimwarden"
    expected = {f"claimwarden-{VERSION}.oci.tar", f"claimwarden-{VERSION}.yaml", f"claimwarden-{VERSION}.spdx.json",
                f"claimwarden-monitoring-{VERSION}.yaml", "SHA256SUMS"}
    expected |= {f"claimwarden-{VERSION}.tgz"} if chart.is_dir() else set()
    assert names == expected, names ^ expected

    # Checksums: sha256sum verifies every file, and every file but SHA256SUMS is listed.
    check = subprocess.run(["sha256sum", "--check", "--strict", "SHA256SUMS"], cwd=dist, capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    listed = {line.split("  ", 1)[1] for line in (dist / "SHA256SUMS").read_text().splitlines()}
    assert listed == names - {"SHA256SUMS"}

    # The bundle names the image by the digest of the archive's manifest, computed here from its bytes.
    blobs = _archive(dist / f"claimwarden-{VERSION}.oci.tar")
    [entry] = json.loads(blobs["index.json"])["manifests"]
    manifest = blobs[f"blobs/{entry['digest'].replace(':', '/')}"]
    digest = "sha256:" + hashlib.sha256(manifest).hexdigest()
    assert entry["digest"] == digest
    for bundle in (f"claimwarden-{VERSION}.yaml", f"claimwarden-monitoring-{VERSION}.yaml"):
        images = [c["image"] for d in _documents(dist / bundle) if d["kind"] == "Deployment"
                  for c in d["spec"]["template"]["spec"]["containers"]]
        assert images == [f"claimwarden@{digest}"], (bundle, images)
    kinds = {d["kind"] for d in _documents(dist / f"claimwarden-{VERSION}.yaml")}
    assert {"CustomResourceDefinition", "Namespace", "ClusterRole", "Deployment", "Service"} <= kinds, kinds

    # The version is the same everywhere: the image's label and config, `claimwarden --version` in it.
    config = json.loads(blobs[f"blobs/{json.loads(manifest)['config']['digest'].replace(':', '/')}"])
    assert config["config"]["Labels"]["org.opencontainers.image.version"] == VERSION
    assert config["config"]["Labels"]["org.opencontainers.image.revision"].startswith(
        subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip())
    ran = podman("run", "--rm", "--network=none", "--entrypoint=claimwarden", IMAGE, "--version")
    assert ran.stdout.strip() == f"claimwarden {VERSION}", ran.stdout + ran.stderr

    # The SBOM (SPDX JSON) lists the image's Python packages: every locked dependency and claimwarden.
    sbom = json.loads((dist / f"claimwarden-{VERSION}.spdx.json").read_text())
    assert sbom["spdxVersion"].startswith("SPDX-2.")
    pypi = {ref["referenceLocator"].split("@")[0].removeprefix("pkg:pypi/").lower().replace("_", "-"):
            ref["referenceLocator"].split("@")[1].split("?")[0]
            for package in sbom["packages"] for ref in package.get("externalRefs", [])
            if ref.get("referenceType") == "purl" and ref["referenceLocator"].startswith("pkg:pypi/")}
    locked = {line.split("==")[0].strip().lower(): line.split("==")[1].split()[0].strip(" \\")
              for line in (ROOT / "requirements.lock").read_text().splitlines()
              if "==" in line and not line.startswith("#")}
    assert {name: pypi.get(name) for name in locked} == locked
    assert pypi.get("claimwarden") == PYTHON_VERSION, pypi.get("claimwarden")
    assert any(ref["referenceLocator"].startswith("pkg:deb/debian/python3")
               for package in sbom["packages"] for ref in package.get("externalRefs", [])), "the base's packages"

    if chart.is_dir():
        with tarfile.open(dist / f"claimwarden-{VERSION}.tgz") as tgz:
            member = tgz.extractfile("claimwarden/Chart.yaml")
            assert member is not None
            meta = yaml.safe_load(member.read())
            member = tgz.extractfile("claimwarden/values.yaml")
            assert member is not None
            values = yaml.safe_load(member.read())
        assert (meta["version"], meta["appVersion"]) == (VERSION, VERSION)
        assert (values["image"]["repository"], values["image"]["digest"]) == ("claimwarden", digest)


def test_a_version_that_is_not_releasable_is_refused_before_anything_is_built(tmp_path: Path) -> None:
    result = _release("--version", "0.0.0-test", dist=tmp_path / "dist")
    assert result.returncode == 2 and "PEP 440" in result.stderr, result.stderr
    assert not (tmp_path / "dist").exists()
    final = _release("--version", "99.0.0", "--allow-dirty", dist=tmp_path / "dist")
    assert final.returncode == 2, final.stderr
    assert "a final release 99.0.0 is cut from the commit that sets it" in final.stderr
    assert "CHANGELOG.md has no '## [99.0.0]' section" in final.stderr
    assert not (tmp_path / "dist").exists()



def test_a_failed_release_leaves_the_previous_one_and_no_half_written_directory(tmp_path: Path) -> None:
    dist = tmp_path / "dist" / f"v{VERSION}"
    dist.mkdir(parents=True)
    (dist / "SHA256SUMS").write_text("the previous release\n")
    failed = _release("--version", VERSION, "--allow-dirty", dist=dist, engine="no-such-engine")
    assert failed.returncode != 0 and "image/build.sh" in failed.stderr, failed.stderr
    assert [p.name for p in dist.parent.iterdir()] == [dist.name], "no partial directory is left"
    assert [p.name for p in dist.iterdir()] == ["SHA256SUMS"] and "previous" in (dist / "SHA256SUMS").read_text()
    # DIST=. (or a directory with anything a release did not write) is refused before anything is built.
    checkout = _release("--version", VERSION, "--allow-dirty", dist=ROOT)
    assert checkout.returncode == 2 and "holds the checkout itself" in checkout.stderr, checkout.stderr
    (dist / "notes.txt").write_text("mine")
    foreign = _release("--version", VERSION, "--allow-dirty", dist=dist)
    assert foreign.returncode == 2 and "holds files no release wrote (notes.txt)" in foreign.stderr, foreign.stderr
    assert (dist / "notes.txt").read_text() == "mine"
