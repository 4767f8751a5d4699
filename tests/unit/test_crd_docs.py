"""docs/reference/crds.md is what the CRDs' schemas say now (lab/claimwarden_lab/crddocs.py)."""

from __future__ import annotations

from claimwarden_lab import crddocs


def test_the_crd_reference_is_current() -> None:
    assert crddocs.PAGE.read_text() == crddocs.render(), "run 'make crd-docs'"


def test_every_field_is_listed_with_its_type_and_whether_it_is_required() -> None:
    schema = {"properties": {"spec": {"type": "object", "required": ["effect"], "description": "the spec",
                                      "properties": {"effect": {"type": "string", "enum": ["A", "B"],
                                                                "description": "what | happens"},
                                                     "items": {"type": "array", "items": {
                                                         "type": "object",
                                                         "properties": {"n": {"type": "integer"}}}}}}}}
    assert list(crddocs.fields(schema)) == [
        ("spec", "object", False, "the spec"),
        ("spec.effect", "string: `A` \\| `B`", True, "what \\| happens"),
        ("spec.items", "[]object", False, ""),
        ("spec.items[].n", "integer", False, "")]


def test_both_kinds_have_a_section() -> None:
    page = crddocs.render()
    for kind in ("UnhealthyDevice", "HealthPolicy"):
        assert f"## {kind} (claimwarden.io/v1alpha1)" in page
    assert "| `spec.effect` |" in page
