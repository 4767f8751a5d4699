"""Where the lab's binaries live and whether they are there."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from .processes import LabError

K8S_VERSION = "1.34.4"
COMPONENTS = ("etcd", "kube-apiserver", "kube-scheduler", "kube-controller-manager", "kubectl", "kwok")
STAGES_FILE = "kwok-stages.yaml"


def bin_dir() -> Path:
    """``$CLAIMWARDEN_BIN_DIR``, else ``~/.cache/claimwarden/bin/v<version>`` (as bins/build.sh)."""
    override = os.environ.get("CLAIMWARDEN_BIN_DIR")
    if override:
        return Path(override)
    return Path.home() / ".cache" / "claimwarden" / "bin" / f"v{K8S_VERSION}"


def require_binaries(directory: Path | None = None) -> Path:
    """Return the binary directory, or fail with the command that builds what is missing."""
    directory = directory or bin_dir()
    missing = [name for name in (*COMPONENTS, STAGES_FILE) if not (directory / name).is_file()]
    if not missing:
        return directory
    if shutil.which("go") is None:
        raise LabError(f"{', '.join(missing)} not built in {directory} and there is no Go toolchain on "
                       "PATH: install Go >= 1.24, then run 'make bins'")
    raise LabError(f"{', '.join(missing)} not built in {directory}: run 'make bins' "
                   "(or set CLAIMWARDEN_BIN_DIR to where they are)")
