"""How many bytes the claims index holds per claim whose user filled its annotations (256 KiB, the
apiserver's limit) and labels, measured with tracemalloc while the projections are alive.

"whole" keeps the metadata maps as they come (what trimmed.py did before issue 20); "projected"
is trimmed.claim now. The same for a template with as much in spec.metadata.annotations.

    .venv/bin/python bench/projection_memory.py [--claims 200]
"""

from __future__ import annotations

import argparse
import copy
import gc
import tracemalloc
from collections.abc import Callable
from typing import Any

from claimwarden.objects import trimmed
from claimwarden.objects.claims import POD_CLAIM_NAME_ANNOTATION

KIB = 1024
ANNOTATIONS = {f"example.com/note-{i}": "x" * (KIB - 40) for i in range(255)}  # just under 256 KiB in all
LABELS = {f"example.com/l-{i}": "v" * 63 for i in range(100)}


def claim(i: int) -> dict[str, Any]:
    # Each string is built per object, as the JSON decoder of a watch event builds it.
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": f"c{i}", "namespace": "ns", "uid": f"uid-{i}", "resourceVersion": str(i),
                         "creationTimestamp": "2026-01-01T00:00:00Z",
                         "annotations": {k: "".join(v) for k, v in ANNOTATIONS.items()}
                         | {POD_CLAIM_NAME_ANNOTATION: "gpu"},
                         "labels": {k: "".join(v) for k, v in LABELS.items()},
                         "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": f"p{i}", "uid": f"p{i}",
                                              "controller": True}]},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu"}}]}},
            "status": {}}


def template(i: int) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": f"t{i}", "namespace": "ns", "uid": f"t-{i}"},
            "spec": {"metadata": {"annotations": {k: "".join(v) for k, v in ANNOTATIONS.items()}},
                     "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu"}}]}}}}


def whole_claim(body: dict[str, Any]) -> dict[str, Any]:
    projected = trimmed.claim(body)
    meta = body["metadata"]
    projected["metadata"].update({k: copy.deepcopy(meta[k]) for k in ("annotations", "labels") if k in meta})
    return projected


def whole_template(body: dict[str, Any]) -> dict[str, Any]:
    return {"metadata": dict(body["metadata"]), "spec": copy.deepcopy(body["spec"])}


def held(make: Callable[[int], dict[str, Any]], project: Callable[[dict[str, Any]], dict[str, Any]],
         count: int) -> float:
    """Bytes per object that stay allocated while `count` projections are kept (the events are dropped)."""
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    kept = [project(make(i)) for i in range(count)]
    gc.collect()
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    assert len(kept) == count
    return (after - before) / count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--claims", type=int, default=200)
    args = parser.parse_args()
    rows = [("claim, whole metadata maps", held(claim, whole_claim, args.claims)),
            ("claim, projected", held(claim, trimmed.claim, args.claims)),
            ("template, whole spec", held(template, whole_template, args.claims)),
            ("template, projected", held(template, trimmed.template, args.claims))]
    for what, per in rows:
        print(f"{what:28} {per / KIB:10.1f} KiB per object  {per * 2000 / KIB / KIB:8.1f} MiB for 2,000")


if __name__ == "__main__":
    main()
