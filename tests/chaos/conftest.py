"""The chaos suite: faults injected into a lab with two claimwarden replicas, checked by checker.py.

`make chaos` runs every scenario at full scale (CHAOS_SCALE=full); `make test` (and CI) runs the same
scenarios at a reduced scale. The table of each run is printed at the end of the session.
"""

from __future__ import annotations

from typing import Any

RESULTS: list[dict[str, Any]] = []


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not RESULTS:
        return
    from .checker import INVARIANTS

    write = terminalreporter.write_line
    write("")
    write("chaos: | scenario | load | faults | next leader p50 / max | converged in | violations of I1 / ... / I12 |")
    write("chaos: | --- | --- | --- | --- | --- | --- |")
    for row in RESULTS:
        write(f"chaos: | {row['scenario']} | {row['load']} | {row['faults']} | {row['leader']} | "
              f"{row['converged']} | {row['violations']} |")
    for number, invariant in enumerate(INVARIANTS, start=1):
        write(f"chaos: I{number}: {invariant}")
