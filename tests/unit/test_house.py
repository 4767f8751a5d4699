"""The house rules of issue 24, read from the code: no import cycle among product modules and no product
module over 450 lines."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "operator" / "claimwarden"
MAX_LINES = 450


def _modules() -> dict[str, Path]:
    return {".".join(("claimwarden", *path.relative_to(PACKAGE).with_suffix("").parts)).removesuffix(".__init__"):
            path for path in sorted(PACKAGE.rglob("*.py"))}


def _imported(module: str, path: Path, known: set[str]) -> set[str]:
    """Product modules `module` imports, anywhere in the file (function-local imports count too)."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")
                parent = parent[: len(parent) - node.level + 1]
                base = ".".join([*parent, *([base] if base else [])])
            found.add(base)
            found |= {f"{base}.{alias.name}" for alias in node.names}
    return {name for name in found if name in known and name != module}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt):], nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        state[node] = 2
        stack.pop()
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_no_product_module_imports_itself_round_a_circle() -> None:
    modules = _modules()
    # a package's __init__ runs before its modules; edges into it are edges into its docstring
    graph = {name: {dep for dep in _imported(name, path, set(modules)) if not _is_package(modules[dep])}
             for name, path in modules.items()}
    assert _cycle(graph) is None, f"import cycle: {' -> '.join(_cycle(graph) or [])}"


def _is_package(path: Path) -> bool:
    return path.name == "__init__.py"


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def test_no_product_module_is_over_450_lines() -> None:
    over = {name: len(path.read_text().splitlines()) for name, path in _modules().items()
            if len(path.read_text().splitlines()) > MAX_LINES}
    assert not over, f"over {MAX_LINES} lines: {over}"
