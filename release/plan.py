"""What a release is, decided from plain data: the version's two spellings, what refuses a release, the
version stamped into a copy of the tree, the bundle's image pinned by digest, the checksum file.

`release/build.py` does the I/O (git, podman, kustomize, syft, helm) and asks these functions.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packaging.version import InvalidVersion, Version

# The recommended expression of semver 2.0.0 (semver.org), build metadata left out: an image tag cannot hold '+'.
SEMVER = re.compile(
    r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)"
    r"(?:-((?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*)(?:\.(?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*))*))?$")
VERSION_LINE = re.compile(r'^__version__ = "([^"]*)"$', re.MULTILINE)
CHANGELOG_HEADING = re.compile(r"^## \[([^\]]+)\]", re.MULTILINE)


@dataclass(frozen=True)
class ReleaseVersion:
    semver: str  # the image tag, the chart's version, what `claimwarden --version` prints
    python: str  # the wheel's version in the image: PEP 440's spelling of the same version

    @property
    def prerelease(self) -> bool:
        return "-" in self.semver


def parse_version(text: str) -> ReleaseVersion:
    """VERSION as given to `make release`; ValueError says what is wrong with it.

    It must be semver (X.Y.Z, or X.Y.Z-pre) and also a PEP 440 version once Python spells it, since the
    wheel in the image carries it: pre-releases are alpha.N, beta.N, rc.N or dev.N (`0.0.0-test` is not).
    """
    if text.startswith("v"):
        raise ValueError(f"VERSION={text}: give it without the leading 'v' (the git tag is v{text[1:]})")
    if not SEMVER.match(text):
        raise ValueError(f"VERSION={text!r} is not semver X.Y.Z[-pre] (no build metadata: an image tag has no '+')")
    try:
        python = str(Version(text))
    except InvalidVersion:
        raise ValueError(f"VERSION={text}: the pre-release part must be one Python can also spell (PEP 440): "
                         "alpha.N, beta.N, rc.N or dev.N, e.g. 1.2.0-rc.1") from None
    return ReleaseVersion(semver=text, python=python)


def source_version(init_text: str) -> str:
    """`__version__` of operator/claimwarden/__init__.py, the one version source."""
    found = VERSION_LINE.findall(init_text)
    if len(found) != 1:
        raise ValueError(f"expected one __version__ line in operator/claimwarden/__init__.py, found {len(found)}")
    return found[0]


def stamp_version(init_text: str, version: ReleaseVersion) -> str:
    """The __init__.py of the staged copy, saying the release's version."""
    source_version(init_text)  # exactly one line to replace
    return VERSION_LINE.sub(f'__version__ = "{version.semver}"', init_text)


def release_problems(*, version: ReleaseVersion, source: str, changelog: str, dirty: list[str],
                     allow_dirty: bool) -> list[str]:
    """Why this release must not be made (empty: go ahead).

    A final release (no pre-release part) is cut from the commit that says so: __version__ and a CHANGELOG
    section of that version. A pre-release (rc, a test) may come from any commit: only the copy is stamped.
    Uncommitted changes to tracked files refuse any release unless allowed, since the artifacts are built
    from a copy of the commit and the changes would silently not be in them.
    """
    problems = []
    if dirty and not allow_dirty:
        shown = ", ".join(dirty[:5]) + (f" and {len(dirty) - 5} more" if len(dirty) > 5 else "")
        problems.append(f"uncommitted changes to tracked files ({shown}): commit or stash them "
                        "(ALLOW_DIRTY=1 builds the working tree as it is, and the release says so)")
    if not version.prerelease:
        if source != version.semver:
            problems.append(f"operator/claimwarden/__init__.py says __version__ = {source!r}: a final release "
                            f"{version.semver} is cut from the commit that sets it")
        if version.semver not in CHANGELOG_HEADING.findall(changelog):
            problems.append(f"CHANGELOG.md has no '## [{version.semver}]' section")
    return problems


RELEASE_FILE = re.compile(r"^(claimwarden(-monitoring)?-[^/]+\.(oci\.tar|yaml|tgz|spdx\.json)|SHA256SUMS)$")


def dist_problem(dist: Path, *, root: Path, entries: list[str] | None) -> str | None:
    """Why DIST must not be emptied and written (None: go ahead); `entries` are the names in it, None when it does
    not exist. A release replaces only what a release wrote: DIST=. or DIST=dist would otherwise remove the
    checkout, or `make manifests`'s output and every other release, on a typo."""
    if dist == root or root.is_relative_to(dist):
        return f"DIST={dist} holds the checkout itself: give a directory of its own (default dist/v<version>)"
    foreign = sorted(name for name in entries or [] if not RELEASE_FILE.match(name))
    if foreign:
        shown = ", ".join(foreign[:5]) + (f" and {len(foreign) - 5} more" if len(foreign) > 5 else "")
        return (f"DIST={dist} holds files no release wrote ({shown}): a release empties its directory, so give an "
                "empty or new one")
    return None


def pin_image(kustomization: dict[str, Any], *, repository: str, digest: str) -> dict[str, Any]:
    """manifests/base/kustomization.yaml with the image `claimwarden` replaced by repository@digest."""
    if not re.fullmatch(r"sha256:[0-9a-f]{64}", digest):
        raise ValueError(f"not a sha256 digest: {digest!r}")
    images = [i for i in kustomization.get("images", []) if i.get("name") != "claimwarden"]
    images.append({"name": "claimwarden", "newName": repository, "digest": digest})
    return {**kustomization, "images": images}


def pin_chart_values(values: str, *, repository: str, digest: str) -> str:
    """The chart's values.yaml (charts/claimwarden) with image.repository and image.digest set, its comments
    kept (the chart's values reference is made from them). The `image:` block must hold both keys, two spaces
    in; anything else is a ValueError, not a silent unpinned chart."""
    if not re.fullmatch(r"sha256:[0-9a-f]{64}", digest):
        raise ValueError(f"not a sha256 digest: {digest!r}")
    block = re.search(r"^image:\n((?:(?:  .*|#.*|)\n)+)", values, re.MULTILINE)
    if block is None:
        raise ValueError("the chart's values.yaml has no top-level image: block")
    body = block.group(1)
    for key, value in (("repository", repository), ("digest", digest)):
        body, found = re.subn(rf"^  {key}: .*$", f"  {key}: {json.dumps(value)}", body, count=1, flags=re.MULTILINE)
        if not found:
            raise ValueError(f"the chart's values.yaml has no image.{key}")
    return values[:block.start(1)] + body + values[block.end(1):]


def manifest_digest(index: dict[str, Any], blobs: dict[str, bytes]) -> str:
    """The digest of the image manifest that an OCI archive's index.json names, after checking that the
    manifest's bytes hash to it (what a registry then serves under that digest: push with --preserve-digests).
    `blobs` holds the archive's blobs by digest ("sha256:...")."""
    manifests = index.get("manifests", [])
    if len(manifests) != 1:
        raise ValueError(f"the OCI index lists {len(manifests)} manifests; a single-platform image has one")
    digest = str(manifests[0]["digest"])
    blob = blobs.get(digest)
    if blob is None:
        raise ValueError(f"the OCI archive has no blob {digest}")
    if "sha256:" + hashlib.sha256(blob).hexdigest() != digest:
        raise ValueError(f"the blob {digest} does not hash to its name")
    media = json.loads(blob).get("mediaType", manifests[0].get("mediaType"))
    if media != "application/vnd.oci.image.manifest.v1+json":
        raise ValueError(f"{digest} is a {media}, not an OCI image manifest")
    return digest


def sha256sums(files: dict[str, str]) -> str:
    """SHA256SUMS as `sha256sum` writes it and `sha256sum -c` reads it; `files` maps name to hex digest."""
    return "".join(f"{files[name]}  {name}\n" for name in sorted(files))


def artifact_names(version: ReleaseVersion) -> dict[str, str]:
    """Every file of a release but the chart (helm names its own) and SHA256SUMS, by role."""
    v = version.semver
    return {"image": f"claimwarden-{v}.oci.tar", "bundle": f"claimwarden-{v}.yaml",
            "monitoring": f"claimwarden-monitoring-{v}.yaml", "sbom": f"claimwarden-{v}.spdx.json"}
