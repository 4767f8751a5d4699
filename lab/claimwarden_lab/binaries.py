"""Where the lab's binaries live, per Kubernetes version, and whether they are there."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from .processes import LabError

VERSIONS = {"1.34": "1.34.4", "1.35": "1.35.4", "1.36": "1.36.3", "1.37": "1.37.2"}
"""The Kubernetes versions the lab runs (the patch releases the Go module proxy here serves)."""
K8S_VERSION = VERSIONS["1.34"]
"""The default: the version of the seed walkthrough."""
COMPONENTS = ("etcd", "kube-apiserver", "kube-scheduler", "kube-controller-manager", "kubectl", "kwok")
STAGES_FILE = "kwok-stages.yaml"


def resolve_version(wanted: str) -> str:
    """``1.37``, ``v1.37`` or ``1.37.2`` -> ``1.37.2``; anything else is a LabError naming what exists."""
    text = wanted.strip().removeprefix("v")
    minor = ".".join(text.split(".")[:2])
    full = VERSIONS.get(minor)
    if full is None or text not in (minor, full):
        raise LabError(f"Kubernetes {wanted!r} is not one the lab runs; give one of "
                       f"{', '.join(VERSIONS)} (patch releases {', '.join(VERSIONS.values())})")
    return full


def bin_dir(version: str = K8S_VERSION) -> Path:
    """``~/.cache/claimwarden/bin/v<version>`` (as bins/build.sh); ``$CLAIMWARDEN_BIN_DIR`` overrides the default
    version's directory only, so that a lab of another version never runs the wrong binaries."""
    override = os.environ.get("CLAIMWARDEN_BIN_DIR")
    if override and version == K8S_VERSION:
        return Path(override)
    return Path.home() / ".cache" / "claimwarden" / "bin" / f"v{version}"


def require_binaries(directory: Path | None = None, version: str = K8S_VERSION) -> Path:
    """Return the binary directory, or fail with the command that builds what is missing."""
    directory = directory or bin_dir(version)
    missing = [name for name in (*COMPONENTS, STAGES_FILE) if not (directory / name).is_file()]
    if not missing:
        return directory
    build = "make bins" if version == K8S_VERSION else f"make bins K8S_VERSION={version}"
    if shutil.which("go") is None:
        raise LabError(f"{', '.join(missing)} not built in {directory} and there is no Go toolchain on "
                       f"PATH: install Go >= 1.24, then run '{build}'")
    raise LabError(f"{', '.join(missing)} not built in {directory}: run '{build}' "
                   "(or set CLAIMWARDEN_BIN_DIR to where they are)")


HELM_VERSION = "3.22.0"
"""The helm that bins/build-helm.sh builds (`make helm`), for the chart's tests."""


def helm_binary() -> Path:
    """``~/.cache/claimwarden/bin/helm-v<version>/helm`` (``$CLAIMWARDEN_HELM_DIR`` overrides the directory), or a
    LabError naming the command that builds it."""
    default = Path.home() / ".cache" / "claimwarden" / "bin" / f"helm-v{HELM_VERSION}"
    directory = Path(os.environ.get("CLAIMWARDEN_HELM_DIR") or default)
    helm = directory / "helm"
    if not helm.is_file():
        raise LabError(f"helm v{HELM_VERSION} is not built in {directory}: run 'make helm'")
    return helm
