"""Rendering both installs: `helm template` of charts/claimwarden and `kubectl kustomize` of manifests/.

Both binaries are built from the Go module proxy (`make helm`, `make bins`); a missing one fails the test with
the command that builds it.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import pytest
import yaml

import claimwarden
from claimwarden_lab.binaries import bin_dir, helm_binary
from claimwarden_lab.processes import LabError

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "claimwarden"
NAMESPACE = "claimwarden-system"

Key = tuple[str, str]


def project_version() -> str:
    """The version the chart's version and appVersion follow: the project's one version source."""
    return claimwarden.__version__


def helm() -> Path:
    try:
        return helm_binary()
    except LabError as error:
        pytest.fail(str(error), pytrace=False)


def run(*argv: str | Path, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run([str(a) for a in argv], capture_output=True, text=True, timeout=120)
    if check:
        assert result.returncode == 0, f"{' '.join(map(str, argv))}:\n{result.stdout}{result.stderr}"
    return result


def helm_template(*sets: str, namespace: str = NAMESPACE, values: dict[str, Any] | None = None,
                  check: bool = True) -> subprocess.CompletedProcess[str]:
    """`helm template claimwarden charts/claimwarden -n NAMESPACE --set S ...`, with `values` as a values file."""
    options = [item for s in sets for item in ("--set", s)]
    with tempfile.NamedTemporaryFile("w", suffix=".yaml") as values_file:
        yaml.safe_dump(values or {}, values_file)
        values_file.flush()
        return run(helm(), "template", "claimwarden", CHART, "--namespace", namespace, "--values", values_file.name,
                   *options, check=check)


def helm_objects(*sets: str, namespace: str = NAMESPACE, values: dict[str, Any] | None = None,
                 ) -> dict[Key, dict[str, Any]]:
    return by_key(helm_template(*sets, namespace=namespace, values=values).stdout)


def kustomize_objects(*directories: str) -> dict[Key, dict[str, Any]]:
    """`kubectl kustomize manifests/D` of each directory, merged (as `make manifests` renders them)."""
    kubectl = bin_dir() / "kubectl"
    if not kubectl.is_file():
        pytest.fail(f"no kubectl in {kubectl.parent}: run 'make bins'", pytrace=False)
    found: dict[Key, dict[str, Any]] = {}
    for directory in directories:
        # manifests/ names the image without a tag; `make manifests` pins it to the source version through an
        # overlay, and so does this.
        with tempfile.TemporaryDirectory(dir=ROOT / "dist" if (ROOT / "dist").is_dir() else None) as overlay:
            base = os.path.relpath(ROOT / "manifests" / directory, overlay)
            (Path(overlay) / "kustomization.yaml").write_text(yaml.safe_dump({
                "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization", "resources": [base],
                "images": [{"name": "claimwarden", "newTag": project_version()}]}))
            found.update(by_key(run(kubectl, "kustomize", overlay).stdout))
    return found


def by_key(text: str) -> dict[Key, dict[str, Any]]:
    objects: dict[Key, dict[str, Any]] = {}
    for document in yaml.safe_load_all(text):
        if document:
            key = (document["kind"], document["metadata"]["name"])
            assert key not in objects, f"{key} rendered twice"
            objects[key] = document
    return objects
