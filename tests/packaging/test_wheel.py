"""The wheel installs and runs from a clean virtualenv, as the Dockerfile's build stage does it.

This is the image's recipe without the image: `pip wheel --no-deps .`, a fresh venv, `pip
install` of the wheel (dependencies from the index), then the entry point.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

from claimwarden import __version__

ROOT = Path(__file__).resolve().parents[2]


def _run(*argv: str | Path, cwd: Path | None = None) -> str:
    result = subprocess.run([str(a) for a in argv], capture_output=True, text=True, cwd=cwd, timeout=900)
    assert result.returncode == 0, f"{argv} failed:\n{result.stdout}\n{result.stderr}"
    return result.stdout


def test_wheel_installs_in_a_clean_virtualenv_and_runs(tmp_path: Path) -> None:
    wheels = tmp_path / "dist"
    _run(sys.executable, "-m", "pip", "wheel", "--no-deps", "--wheel-dir", wheels, ROOT)
    [wheel] = list(wheels.glob("claimwarden-*.whl"))
    venv = tmp_path / "venv"
    _run(sys.executable, "-m", "venv", venv)
    _run(venv / "bin" / "pip", "install", "--quiet", wheel)
    assert _run(venv / "bin" / "claimwarden", "--version").strip() == f"claimwarden {__version__}"
    help_text = _run(venv / "bin" / "claimwarden", "run", "--help")
    assert "--controllers" in help_text and "--metrics-port" in help_text
    # Only the operator goes into the wheel: no tests, and no lab (code or dependencies).
    listing = _run(venv / "bin" / "python", "-c",
                   "import importlib.metadata as m; print('\\n'.join(str(f) for f in m.files('claimwarden')))")
    assert "claimwarden/cli.py" in listing and "tests/" not in listing
    assert "lab" not in listing.replace("claimwarden/", ""), listing
    requires = _run(venv / "bin" / "python", "-c",
                    "import importlib.metadata as m; print([r for r in m.requires('claimwarden') if 'extra' not in r])"
                    ).lower()
    assert "pyyaml" not in requires and "cryptography" not in requires, requires  # the lab's, not ours
    installed = _run(venv / "bin" / "pip", "list", "--format=freeze").lower()
    assert "cryptography" not in installed, installed  # (PyYAML still comes with the kubernetes client)
    # The kubectl plugin ships with the wheel: kubectl finds `kubectl-claimwarden` on PATH.
    plugin_help = _run(venv / "bin" / "kubectl-claimwarden", "--help")
    assert all(verb in plugin_help for verb in ("explain", "doctor", "devices", "mark", "clear")), plugin_help
    # kubectl 1.26+ completes `kubectl claimwarden ...` by running `kubectl_complete-claimwarden` from PATH.
    assert _run(venv / "bin" / "kubectl_complete-claimwarden", "do") == "doctor\n:4\n"
    assert "--kubeconfig" in _run(venv / "bin" / "claimwarden", "explain", "--help")
    refused = subprocess.run([str(venv / "bin" / "claimwarden"), "lab", "up"], capture_output=True, text=True)
    assert refused.returncode == 2 and "pip install ./lab" in refused.stderr, refused.stderr


def test_claimwarden_run_never_imports_the_lab_even_where_it_is_installed() -> None:
    # In the development venv the lab is installed; `run` must still not load it.
    probe = ("import sys; from claimwarden import cli\n"
             "try:\n    cli.main(['run', '--help'])\nexcept SystemExit:\n    pass\n"
             "assert 'claimwarden_lab' not in sys.modules, sorted(m for m in sys.modules if 'lab' in m)\n"
             "assert 'yaml' not in sys.modules and 'cryptography' not in sys.modules\n"
             "assert not [m for m in sys.modules if m.startswith(('claimwarden.plugin', 'cel_expr_python'))]\n")
    _run(sys.executable, "-c", probe)


def test_dockerfile_runs_as_a_numeric_non_root_user_without_compilers() -> None:
    text = (ROOT / "Dockerfile").read_text()
    froms = [line for line in text.splitlines() if line.startswith("FROM ")]
    assert len(froms) == 2 and " AS build" in froms[0], "a builder stage and a final stage"
    final = text[text.rindex("\nFROM "):]
    assert "USER 65532:65532" in final
    assert 'ENTRYPOINT ["claimwarden", "run"]' in final
    assert "apt-get" not in final and "gcc" not in final and "pip install" not in final
    # The base is an argument (python:3.11-slim with a registry, the local mmdebstrap base without).
    assert text.count("FROM ${BASE}") == 2 and "ARG BASE=python:3.11-slim" in text
    # Dependencies come only from the lock, hash-checked; the wheel adds nothing unpinned.
    build = text[:text.rindex("\nFROM ")]
    assert "--require-hashes --no-deps" in build and "-r requirements.lock" in build
    assert "install --no-cache-dir --no-deps /dist/*.whl" in build


def _pins() -> dict[str, list[str]]:
    """requirements.lock as {name: [sha256, ...]}."""
    pins: dict[str, list[str]] = {}
    name = ""
    for line in (ROOT / "requirements.lock").read_text().splitlines():
        line = line.strip()
        if "==" in line and not line.startswith("#"):
            name = re.split(r"[=\[ ]", line, maxsplit=1)[0].lower()
            pins[name] = []
        elif line.startswith("--hash=sha256:"):
            pins[name].append(line.split(":", 1)[1].rstrip(" \\"))
    return pins


def test_the_lock_pins_every_runtime_dependency_with_hashes_and_nothing_of_the_lab() -> None:
    pins = _pins()
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    for requirement in project["dependencies"]:
        name = re.split(r"[~=<>!\[ ]", requirement, maxsplit=1)[0].lower()
        assert name in pins, f"{name} is not in requirements.lock: run image/lock.sh"
    assert all(hashes and all(len(h) == 64 for h in hashes) for hashes in pins.values()), pins
    lab = tomllib.loads((ROOT / "lab" / "pyproject.toml").read_text())["project"]
    assert "cryptography" not in pins and "claimwarden-lab" not in pins, sorted(pins)
    assert any("cryptography" in r for r in lab["dependencies"]), "the lab's own dependency, not ours"
