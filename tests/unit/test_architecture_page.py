"""docs/concepts/architecture.md names every product module, and no module that does not exist.

Product modules are the files under operator/claimwarden/ (except __init__.py), named on the page as
backticked paths relative to operator/claimwarden (`health/plan.py`, `app.py`). A backticked path that
starts with `lab/`, `tests/`, `bench/` or `operator/` is read from the repository's root instead."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "operator" / "claimwarden"
PAGE = ROOT / "docs" / "concepts" / "architecture.md"
FROM_ROOT = ("lab/", "tests/", "bench/", "operator/")
BACKTICKED_PY = re.compile(r"`([\w./-]+\.py)`")


def product_modules(package: Path = PACKAGE) -> set[str]:
    return {path.relative_to(package).as_posix() for path in package.rglob("*.py") if path.name != "__init__.py"}


def named_paths(text: str) -> set[str]:
    return set(BACKTICKED_PY.findall(text))


def problems(text: str, *, package: Path = PACKAGE, root: Path = ROOT) -> list[str]:
    named = named_paths(text)
    unnamed = [f"not named: {module}" for module in sorted(product_modules(package) - named)]
    missing = [f"no such module: {path}" for path in sorted(named)
               if not (root / path if path.startswith(FROM_ROOT) else package / path).is_file()]
    return unnamed + missing


def test_the_architecture_page_names_every_product_module_and_only_modules_that_exist() -> None:
    assert len(product_modules()) > 100
    assert problems(PAGE.read_text()) == []


def test_an_unnamed_module_and_a_stale_path_are_found(tmp_path: Path) -> None:
    package = tmp_path / "operator" / "claimwarden"
    (package / "health").mkdir(parents=True)
    for name in ("__init__.py", "app.py", "health/__init__.py", "health/plan.py"):
        (package / name).write_text("")
    (tmp_path / "lab").mkdir()
    (tmp_path / "lab" / "demo.py").write_text("")
    page = "`app.py`, `health/controller.py`, `lab/demo.py`, `lab/gone.py` and health/plan.py"
    assert problems(page, package=package, root=tmp_path) == [
        "not named: health/plan.py", "no such module: health/controller.py",
        "no such module: lab/gone.py"]
