"""Experiment 4 of the walkthrough: generated claims go with their pods, a standalone claim stays."""

from __future__ import annotations

from ..options import NAMESPACE
from ..stage import Stage

TITLE = "Experiment 4: deleting the pods"


def play(stage: Stage) -> None:
    stage.kubectl("Delete every pod (kubectl waits until they are gone):",
                  "delete", "pods", "--all", "-n", NAMESPACE)

    def settled() -> bool:
        claims = stage.claims()
        stage.seen = ", ".join(f"{c.metadata.name}: {'allocated' if stage.devices_of(c) else 'pending'}"
                               for c in claims)
        return [c.metadata.name for c in claims] == ["shared-gpu"] and not stage.devices_of(claims[0])

    stage.wait("the generated claims to be deleted and shared-gpu to be deallocated", settled)
    stage.kubectl("The generated claims went with their pods; the standalone claim stays, pending (its device "
                  "is free again); the template stays:",
                  "get", "resourceclaims,resourceclaimtemplates", "-n", NAMESPACE)
