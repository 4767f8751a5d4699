"""`make release VERSION=x.y.z`: every artifact of a release, written to one directory (dist/v<version>/).

    python -m release.build --version 1.2.0 [--dist DIR] [--repository registry.example/claimwarden]
                            [--allow-dirty] [--kubectl PATH]

The artifacts are built from a copy of the commit (git archive HEAD) whose __version__ is stamped with the
release's version; no tracked file changes. In order: the image (image/build.sh, as an OCI archive), the
kustomize bundles with the image pinned by the archive's manifest digest, the Helm chart when
charts/claimwarden exists (the Makefile's chart-package hook), the image's SBOM (syft, SPDX JSON), and
SHA256SUMS over all of them. The decisions are release/plan.py's.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import yaml

from release import plan

ROOT = Path(__file__).resolve().parents[1]
INIT = Path("operator/claimwarden/__init__.py")


def say(message: str) -> None:
    print(f"release: {message}", flush=True)


def run(argv: list[str], *, cwd: Path = ROOT, env: dict[str, str] | None = None, show: bool = False) -> str:
    """The command's stdout (shown as it comes instead with `show`); its stderr passes through. A failure ends
    the release with the command named."""
    result = subprocess.run(argv, cwd=cwd, env={**os.environ, **(env or {})},
                            stdout=None if show else subprocess.PIPE, text=True)
    if result.returncode != 0:
        raise SystemExit(f"release: {' '.join(argv)} failed with exit code {result.returncode}")
    return result.stdout or ""


def dirty_files() -> list[str]:
    """Tracked files with uncommitted changes (untracked files are never part of a release)."""
    out = run(["git", "status", "--porcelain", "--untracked-files=no"])
    return [line[3:] for line in out.splitlines() if line.strip()]


def stage_tree(stage: Path, *, working_tree: bool) -> None:
    """A copy of the commit (or, when allowed, of the tracked files as they are now) to build from."""
    stage.mkdir()
    if not working_tree:
        archive = subprocess.run(["git", "archive", "--format=tar", "HEAD"], cwd=ROOT, capture_output=True,
                                 check=True).stdout
        with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
            tar.extractall(stage, filter="tar")
        return
    for name in run(["git", "ls-files", "-z"]).split("\0"):
        source = ROOT / name
        if name and source.is_file():  # a deleted, uncommitted file is not copied
            (stage / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, stage / name)


def archive_digest(archive: Path) -> str:
    """The image manifest's digest in an OCI archive (podman save --format oci-archive)."""
    with tarfile.open(archive) as tar:
        members = {m.name.removeprefix("./"): m for m in tar.getmembers() if m.isfile()}
        index = json.loads(_read(tar, members["index.json"]))
        digests = [str(m["digest"]) for m in index.get("manifests", [])]
        blobs = {d: _read(tar, members[f"blobs/{d.replace(':', '/')}"]) for d in digests
                 if f"blobs/{d.replace(':', '/')}" in members}
    return plan.manifest_digest(index, blobs)


def _read(tar: tarfile.TarFile, member: tarfile.TarInfo) -> bytes:
    extracted = tar.extractfile(member)
    assert extracted is not None
    return extracted.read()


def write_bundles(stage: Path, dist: Path, names: dict[str, str], *, kubectl: str, repository: str,
                  digest: str) -> None:
    kustomization = stage / "manifests" / "base" / "kustomization.yaml"
    pinned = plan.pin_image(yaml.safe_load(kustomization.read_text()), repository=repository, digest=digest)
    kustomization.write_text(yaml.safe_dump(pinned, sort_keys=False))
    for role, directory in (("bundle", "base"), ("monitoring", "monitoring")):
        (dist / names[role]).write_text(run([kubectl, "kustomize", str(stage / "manifests" / directory)]))


def package_chart(stage: Path, dist: Path, version: plan.ReleaseVersion, *, repository: str, digest: str) -> None:
    """The chart, its values pinned to the release's image in the staged copy, packaged by the Makefile's hook
    (`make chart-package`: helm package into DIST at VERSION), when the commit has one."""
    chart = stage / "charts" / "claimwarden"
    if not chart.is_dir():
        say("no charts/claimwarden in this commit: no chart in the release")
        return
    values = chart / "values.yaml"
    values.write_text(plan.pin_chart_values(values.read_text(), repository=repository, digest=digest))
    run(["make", "--no-print-directory", "chart-package", f"VERSION={version.semver}", f"DIST={dist}"], cwd=stage,
        show=True)


def write_sbom(archive: Path, sbom: Path) -> None:
    syft = run([str(ROOT / "bins" / "build-syft.sh")]).strip().splitlines()[-1]
    run([syft, "scan", f"oci-archive:{archive}", "--quiet", "-o", f"spdx-json={sbom}"],
        env={"SYFT_CHECK_FOR_APP_UPDATE": "false"})


def write_checksums(dist: Path) -> None:
    digests = {}
    for path in sorted(dist.iterdir()):
        if path.is_file() and path.name != "SHA256SUMS":
            h = hashlib.sha256()
            with path.open("rb") as f:
                for chunk in iter(lambda: f.read(1 << 20), b""):
                    h.update(chunk)
            digests[path.name] = h.hexdigest()
    (dist / "SHA256SUMS").write_text(plan.sha256sums(digests))


def release(args: argparse.Namespace) -> int:
    started = time.monotonic()
    try:
        version = plan.parse_version(args.version)
        source = plan.source_version((ROOT / INIT).read_text())
    except ValueError as exc:
        print(f"release: {exc}", file=sys.stderr)
        return 2
    dirty = dirty_files()
    changelog = ROOT / "CHANGELOG.md"
    problems = plan.release_problems(version=version, source=source, dirty=dirty, allow_dirty=args.allow_dirty,
                                     changelog=changelog.read_text() if changelog.exists() else "")
    dist = Path(args.dist or ROOT / "dist" / f"v{version.semver}").resolve()
    if dist.exists() and not dist.is_dir():
        problems.append(f"DIST={dist} is a file, not a directory")
    elif problem := plan.dist_problem(dist, root=ROOT, entries=[p.name for p in dist.iterdir()]
                                      if dist.is_dir() else None):
        problems.append(problem)
    if problems:
        for problem in problems:
            print(f"release: refused: {problem}", file=sys.stderr)
        return 2
    commit = run(["git", "rev-parse", "HEAD"]).strip() + ("-dirty" if dirty else "")
    say(f"{version.semver} (Python {version.python}) from {commit} into {dist}")
    # Written next to DIST and renamed into place once whole: a failed release leaves no half-written DIST, and
    # the previous one stays until then.
    dist.parent.mkdir(parents=True, exist_ok=True)
    partial = Path(tempfile.mkdtemp(prefix=f".{dist.name}.partial-", dir=dist.parent))
    partial.chmod(0o755)  # mkdtemp's 0700 would otherwise be the release directory's mode
    try:
        build(partial, version, commit=commit, dirty=bool(dirty), repository=args.repository, kubectl=args.kubectl)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    shutil.rmtree(dist, ignore_errors=True)
    partial.rename(dist)
    say(f"wrote {', '.join(sorted(p.name for p in dist.iterdir()))} in {time.monotonic() - started:.0f} s")
    return 0


def build(dist: Path, version: plan.ReleaseVersion, *, commit: str, dirty: bool, repository: str,
          kubectl: str) -> None:
    """Every artifact into the empty directory `dist`, SHA256SUMS last."""
    names = plan.artifact_names(version)
    image = f"{repository}:{version.semver}"
    with tempfile.TemporaryDirectory(prefix="claimwarden-release-") as tmp:
        stage = Path(tmp) / "src"
        stage_tree(stage, working_tree=dirty)
        (stage / INIT).write_text(plan.stamp_version((stage / INIT).read_text(), version))
        archive = dist / names["image"]
        run([str(stage / "image" / "build.sh")], cwd=stage,
            env={"IMAGE": image, "ARCHIVE": str(archive), "REVISION": commit}, show=True)
        digest = archive_digest(archive)
        say(f"image {image}, manifest {digest}")
        write_bundles(stage, dist, names, kubectl=kubectl, repository=repository, digest=digest)
        package_chart(stage, dist, version, repository=repository, digest=digest)
    write_sbom(archive, dist / names["sbom"])
    write_checksums(dist)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="release", description=__doc__.split("\n\n")[0])
    parser.add_argument("--version", required=True, help="semver X.Y.Z[-pre], without a leading v")
    parser.add_argument("--dist", help="where the artifacts go (default dist/v<version>; replaced once the release "
                        "is whole; refused when it holds anything a release did not write)")
    parser.add_argument("--repository", default="claimwarden",
                        help="the image's name in the bundle, without tag (default claimwarden)")
    parser.add_argument("--allow-dirty", action="store_true",
                        help="build the tracked files as they are, uncommitted changes included")
    parser.add_argument("--kubectl", default=shutil.which("kubectl") or "kubectl", help="kubectl for kustomize")
    return release(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
