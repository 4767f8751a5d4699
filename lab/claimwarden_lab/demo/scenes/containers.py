"""Experiment 2 of the walkthrough: two containers of one pod share the pod's one claim."""

from __future__ import annotations

from ..manifests import pod_yaml
from ..options import NAMESPACE, DemoError
from ..stage import Stage

TITLE = "Experiment 2: two containers, one claim"


def play(stage: Stage) -> None:
    stage.apply("One pod, two containers naming the same pod claim:",
                pod_yaml("pod3", "gpu", "resourceClaimTemplateName: single-gpu", containers=("ctr0", "ctr1")))
    [pod] = stage.wait("pod3 Running", lambda: stage.running("pod3"))
    claim = stage.claim_of(pod)
    if len(stage.devices_of(claim)) != 1 or [r.name for r in claim.status.reserved_for] != ["pod3"]:
        raise DemoError(f"experiment 2: pod3's claim should hold one device for pod3: {claim.status}")
    stage.kubectl("Both containers use the pod's one claim...", "get", "pod", "pod3", "-n", NAMESPACE, "-o",
                  "custom-columns=POD:.metadata.name,CONTAINERS:.spec.containers[*].name,"
                  "CLAIMS:.spec.containers[*].resources.claims[*].name")
    stage.claim_table("...which holds one device:")
