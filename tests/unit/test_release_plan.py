"""release/plan.py: what `make release` decides, from plain data."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from release import plan

INIT = '"""claimwarden."""\n\n__version__ = "0.3.0"\n'
CHANGELOG = "# Changelog\n\n## [Unreleased]\n\n## [0.3.0] - 2026-12-24\n\n### Added\n- a thing\n"


@pytest.mark.parametrize(("text", "python"), [
    ("1.2.3", "1.2.3"), ("0.0.0-rc.0", "0.0.0rc0"), ("1.2.0-alpha.1", "1.2.0a1"), ("1.2.0-beta.2", "1.2.0b2"),
    ("2.0.0-dev.3", "2.0.0.dev3"),
])
def test_a_release_version_is_semver_spelled_twice(text: str, python: str) -> None:
    version = plan.parse_version(text)
    assert (version.semver, version.python) == (text, python)
    assert version.prerelease == ("-" in text)


@pytest.mark.parametrize(("text", "says"), [
    ("v1.2.3", "without the leading 'v'"), ("1.2", "not semver"), ("01.2.3", "not semver"),
    ("1.2.3+build.5", "no build metadata"), ("0.0.0-test", "PEP 440"), ("1.2.3-rc.1.x", "PEP 440"), ("", "not semver"),
])
def test_a_version_that_cannot_be_released_says_why(text: str, says: str) -> None:
    with pytest.raises(ValueError, match=says.replace("'", ".").replace("+", r"\+")):
        plan.parse_version(text)


def test_the_copy_is_stamped_and_only_the_version_line_changes() -> None:
    stamped = plan.stamp_version(INIT, plan.parse_version("0.4.0-rc.1"))
    assert stamped == INIT.replace('"0.3.0"', '"0.4.0-rc.1"')
    assert plan.source_version(stamped) == "0.4.0-rc.1"
    with pytest.raises(ValueError, match="found 2"):
        plan.source_version(INIT + '__version__ = "9.9.9"\n')


def test_a_final_release_needs_its_version_in_the_source_and_the_changelog() -> None:
    ok = plan.release_problems(version=plan.parse_version("0.3.0"), source="0.3.0", changelog=CHANGELOG,
                               dirty=[], allow_dirty=False)
    assert ok == []
    problems = plan.release_problems(version=plan.parse_version("0.4.0"), source="0.3.0", changelog=CHANGELOG,
                                     dirty=[], allow_dirty=False)
    assert len(problems) == 2
    assert "__version__ = '0.3.0'" in problems[0] and "## [0.4.0]" in problems[1]


def test_a_prerelease_comes_from_any_commit() -> None:
    assert plan.release_problems(version=plan.parse_version("0.0.0-rc.0"), source="0.3.0", changelog="",
                                 dirty=[], allow_dirty=False) == []


def test_uncommitted_changes_refuse_a_release_unless_allowed() -> None:
    dirty = [f"file{i}.py" for i in range(7)]
    [problem] = plan.release_problems(version=plan.parse_version("0.0.0-rc.0"), source="0.3.0", changelog="",
                                      dirty=dirty, allow_dirty=False)
    assert "file0.py, file1.py, file2.py, file3.py, file4.py and 2 more" in problem and "ALLOW_DIRTY=1" in problem
    assert plan.release_problems(version=plan.parse_version("0.0.0-rc.0"), source="0.3.0", changelog="",
                                 dirty=dirty, allow_dirty=True) == []


def test_the_bundle_names_the_image_by_digest_and_keeps_other_images() -> None:
    digest = "sha256:" + "ab" * 32
    base = {"resources": ["deployment.yaml"], "images": [{"name": "sidecar", "newTag": "1"}]}
    pinned = plan.pin_image(base, repository="registry.example/claimwarden", digest=digest)
    assert pinned["images"] == [{"name": "sidecar", "newTag": "1"},
                                {"name": "claimwarden", "newName": "registry.example/claimwarden", "digest": digest}]
    assert base["images"] == [{"name": "sidecar", "newTag": "1"}], "the input is not changed"
    with pytest.raises(ValueError, match="not a sha256 digest"):
        plan.pin_image(base, repository="claimwarden", digest="latest")


def _manifest(media: str = "application/vnd.oci.image.manifest.v1+json") -> tuple[str, bytes]:
    blob = json.dumps({"schemaVersion": 2, "mediaType": media, "layers": []}).encode()
    return "sha256:" + hashlib.sha256(blob).hexdigest(), blob


def test_the_digest_is_the_image_manifests_checked_against_its_bytes() -> None:
    digest, blob = _manifest()
    index = {"schemaVersion": 2, "manifests": [{"digest": digest}]}
    assert plan.manifest_digest(index, {digest: blob}) == digest
    with pytest.raises(ValueError, match="does not hash to its name"):
        plan.manifest_digest(index, {digest: blob + b" "})
    with pytest.raises(ValueError, match="no blob"):
        plan.manifest_digest(index, {})
    with pytest.raises(ValueError, match="lists 2 manifests"):
        plan.manifest_digest({"manifests": [{"digest": digest}] * 2}, {digest: blob})
    other, other_blob = _manifest("application/vnd.oci.image.index.v1+json")
    with pytest.raises(ValueError, match="not an OCI image manifest"):
        plan.manifest_digest({"manifests": [{"digest": other}]}, {other: other_blob})


def test_checksums_are_written_as_sha256sum_reads_them() -> None:
    text = plan.sha256sums({"b.yaml": "2" * 64, "a.tar": "1" * 64})
    assert text == f"{'1' * 64}  a.tar\n{'2' * 64}  b.yaml\n"


def test_artifacts_carry_the_version_in_their_names() -> None:
    names = plan.artifact_names(plan.parse_version("1.0.0-rc.1"))
    assert all("1.0.0-rc.1" in name for name in names.values())
    assert names["image"].endswith(".oci.tar") and names["sbom"].endswith(".spdx.json")


VALUES = """# Values.
replicaCount: 2

image:
  # -- The image without tag.
  repository: claimwarden
  # -- The tag; empty means the chart's appVersion.
  tag: ""
  # -- A digest.
  digest: ""

run:
  digest: keep
"""


def test_the_chart_values_name_the_image_by_digest_and_keep_their_comments() -> None:
    digest = "sha256:" + "cd" * 32
    pinned = plan.pin_chart_values(VALUES, repository="registry.example/claimwarden", digest=digest)
    assert pinned == VALUES.replace("  repository: claimwarden", '  repository: "registry.example/claimwarden"') \
        .replace('  digest: ""', f'  digest: "{digest}"')
    assert "run:\n  digest: keep" in pinned, "only the image block changes"
    with pytest.raises(ValueError, match=r"no image\.digest"):
        plan.pin_chart_values(VALUES.replace('  digest: ""\n', ""), repository="claimwarden", digest=digest)
    with pytest.raises(ValueError, match="no top-level image"):
        plan.pin_chart_values("replicaCount: 2\n", repository="claimwarden", digest=digest)


def test_dist_is_refused_when_it_holds_the_checkout_or_files_no_release_wrote(tmp_path: Path) -> None:
    root = tmp_path / "claimwarden"
    assert plan.dist_problem(root / "dist" / "v1.2.0", root=root, entries=None) is None
    previous = ["claimwarden-1.2.0.oci.tar", "claimwarden-1.2.0.yaml", "claimwarden-monitoring-1.2.0.yaml",
                "claimwarden-1.2.0.tgz", "claimwarden-1.2.0.spdx.json", "SHA256SUMS"]
    assert plan.dist_problem(root / "dist" / "v1.2.0", root=root, entries=previous) is None
    for dist in (root, tmp_path, Path("/")):  # DIST=. or a parent: removing it would remove the checkout
        assert "holds the checkout itself" in (plan.dist_problem(dist, root=root, entries=["x"]) or "")
    # DIST=dist: `make manifests`' output and the other releases would go.
    problem = plan.dist_problem(root / "dist", root=root, entries=["claimwarden.yaml", "deploy-base", "v1.1.0"])
    assert problem is not None and "claimwarden.yaml, deploy-base, v1.1.0" in problem
