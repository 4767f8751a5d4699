"""Experiment 3 of the walkthrough: a standalone claim, reserved for the two pods that name it."""

from __future__ import annotations

from typing import Any

from ..manifests import CLAIM_INDENT, claim_yaml, documents, one_gpu, pod_yaml
from ..options import NAMESPACE, DemoError
from ..stage import Stage

TITLE = "Experiment 3: two pods, one standalone claim"


def play(stage: Stage) -> None:
    manifest = documents(claim_yaml("shared-gpu", one_gpu(CLAIM_INDENT)),
                         pod_yaml("pod4", "gpu", "resourceClaimName: shared-gpu"),
                         pod_yaml("pod5", "gpu", "resourceClaimName: shared-gpu"))
    stage.apply("A standalone ResourceClaim, created by the user, and two pods naming it:", manifest)
    stage.wait("pod4 and pod5 Running", lambda: stage.running("pod4", "pod5"))
    claim: Any = stage.resource.read_namespaced_resource_claim("shared-gpu", NAMESPACE)
    holders = sorted(r.name for r in claim.status.reserved_for or [])
    if len(stage.devices_of(claim)) != 1 or holders != ["pod4", "pod5"]:
        raise DemoError(f"experiment 3: shared-gpu should hold one device reserved for pod4 and pod5: {holders}")
    stage.claim_table("One device; reservedFor lists both pods:")
