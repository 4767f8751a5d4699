"""The CRD field reference, docs/reference/crds.md, generated from the OpenAPI schemas in crds/.

One table per kind and version: every field's path, type (with its enum or pattern), whether it is required,
and its description from the schema. ``python -m claimwarden_lab.crddocs`` (``make crd-docs``) writes the
page; tests/unit/test_crd_docs.py checks that the committed page is what this module would write.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
CRDS = ROOT / "crds"
PAGE = ROOT / "docs" / "reference" / "crds.md"
HEADER = """# CRD fields

<!-- generated from crds/*.yaml by `make crd-docs` (lab/claimwarden_lab/crddocs.py); do not edit:
     tests/unit/test_crd_docs.py fails when this page is stale -->

The custom resources claimwarden serves, field by field, from their OpenAPI schemas (the descriptions are the
schemas'). What they mean in use: [device health](../concepts/device-health.md) (UnhealthyDevice),
[health policies](../guides/policies.md) (HealthPolicy).
"""


def _type(schema: dict[str, Any]) -> str:
    kind = str(schema.get("type") or ("int-or-string" if schema.get("x-kubernetes-int-or-string") else "object"))
    if kind == "array":
        kind = f"[]{_type(schema.get('items') or {})}"
    if "enum" in schema:
        kind += ": " + " \\| ".join(f"`{value}`" for value in schema["enum"])
    if "pattern" in schema:
        kind += f" (pattern `{schema['pattern']}`)".replace("|", "\\|")
    return kind


def fields(schema: dict[str, Any], path: str = "") -> Iterator[tuple[str, str, bool, str]]:
    """(path, type, required, description) of every field below schema, depth first in the schema's order."""
    required = set(schema.get("required") or ())
    for name, child in (schema.get("properties") or {}).items():
        here = f"{path}.{name}" if path else name
        text = " ".join(str(child.get("description", "")).split()).replace("|", "\\|")
        yield here, _type(child), name in required, text
        inner = child.get("items") if child.get("type") == "array" else child
        yield from fields(inner or {}, here + ("[]" if child.get("type") == "array" else ""))


def render(crd_dir: Path = CRDS) -> str:
    sections = [HEADER]
    for file in sorted(crd_dir.glob("*.claimwarden.io.yaml")):
        crd = yaml.safe_load(file.read_text())
        names = crd["spec"]["names"]
        for version in crd["spec"]["versions"]:
            schema = version["schema"]["openAPIV3Schema"]
            rows = ["| field | type | required | description |", "| --- | --- | --- | --- |"]
            rows += [f"| `{p}` | {t} | {'yes' if r else ''} | {d} |" for p, t, r, d in fields(schema)
                     if p.split(".")[0] in ("spec", "status")]
            sections.append(f"## {names['kind']} ({crd['spec']['group']}/{version['name']})\n\n"
                            f"{crd['spec']['scope']}-scoped; `kubectl get {names['plural']}`; "
                            f"file `crds/{file.name}`.\n\n" + "\n".join(rows) + "\n")
    return "\n".join(sections)


def main(page: Path = PAGE) -> int:
    page.write_text(render())
    print(f"wrote {page}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
