"""What the plugin prints: -o json|yaml documents, -o name lines, tables, and explain's report in words.

Every verb formats through these, so that one flag means one shape everywhere: json and yaml are the
same document, `name` is one object a line (nothing for none) in the form another verb takes back.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

DETAIL_WIDTH = 110


def emit(data: Any, output: str | None) -> None:
    if output == "json":
        print(json.dumps(data, indent=2, default=str))
    else:
        import yaml

        print(yaml.safe_dump(data, sort_keys=False, default_flow_style=False).rstrip())


def print_names(found: Iterable[str]) -> None:
    """-o name: one per line, nothing at all for none."""
    for name in found:
        print(name)


def format_table(headers: list[str], rows: list[list[str]]) -> str:
    widths = [max([len(h), *(len(r[i]) for r in rows)]) for i, h in enumerate(headers)]
    lines = ["   ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in [headers, *rows]]
    return "\n".join(lines)


def explanation_data(explanation: Any) -> dict[str, Any]:
    verdict = explanation.verdict
    return {
        "target": explanation.target,
        "verdict": {"allocatable": verdict.allocatable, "allocated": verdict.allocated, "step": verdict.step,
                    "reason": verdict.reason, "nodes": verdict.nodes},
        "nodes": {"total": explanation.nodes_total, "fit": len(explanation.nodes_fit),
                  "excluded": explanation.nodes_excluded},
        "claims": [{
            "claim": c.ref, "podClaim": c.name, "source": c.source, "allocated": c.allocated,
            "devices": [f"{r.get('driver')}/{r.get('pool')}/{r.get('device')}" for r in c.results],
            "reservedFor": c.reserved_for, "problem": c.problem, "siblings": c.siblings,
            "requests": [[{"request": f.req.label, "class": f.req.class_name, "wants": f.req.wants,
                           "blockedAt": f.blocked_at,
                           "funnel": [{"step": r.step, "left": r.left, "detail": r.detail} for r in f.rows]}
                          for f in alts] for alts in c.funnels],
        } for c in explanation.claims],
    }


def explanation_text(explanation: Any, *, wide: bool) -> str:
    lines = [f"{explanation.target}"]
    excluded = "".join(f"; {why}: {n} excluded" for why, n in explanation.nodes_excluded.items())
    lines.append(f"nodes: {len(explanation.nodes_fit)} of {explanation.nodes_total} fit the pod{excluded}")
    for claim in explanation.claims:
        if not claim.ref:
            lines.append(f"claim {claim.name!r}: {claim.problem}")
            continue
        if claim.allocated:
            devices = ", ".join(f"{r.get('driver')}/{r.get('pool')}/{r.get('device')} (request {r.get('request')})"
                                for r in claim.results)
            lines.append(f"claim {claim.ref} (from {claim.source}): allocated: {devices or 'no devices'}")
            lines.append(f"  reserved for: {', '.join(claim.reserved_for) or 'nobody'}")
            lines += [f"  siblings of {device} (its fault domain): {', '.join(names)}"
                      for device, names in claim.siblings.items()]
            continue
        lines.append(f"claim {claim.ref} (from {claim.source}): not allocated" + (
            f" ({claim.problem})" if claim.problem else ""))
        for alts in claim.funnels:
            for number, funnel in enumerate(alts):
                req = funnel.req
                head = f"  request {req.request}" + (
                    f", subrequest {req.sub} ({number + 1} of {len(alts)})" if req.sub else "")
                lines.append(f"{head}: class {req.class_name}, {req.wants}")
                rows = []
                for row in funnel.rows:
                    cut = not wide and len(row.detail) > DETAIL_WIDTH
                    detail = row.detail[:DETAIL_WIDTH - 1] + "…" if cut else row.detail
                    rows.append([row.title, str(row.left), detail])
                lines += ["    " + line for line in format_table(["STEP", "LEFT", "DETAIL"], rows).splitlines()]
    lines.append(f"verdict: {explanation.verdict.reason}")
    return "\n".join(lines)
