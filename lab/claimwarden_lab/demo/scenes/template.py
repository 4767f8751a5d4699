"""Experiment 1 of the walkthrough: a template stamps out one claim per pod, each on its own device."""

from __future__ import annotations

from ..manifests import documents, one_gpu, pod_yaml, template_yaml
from ..options import NAMESPACE, DemoError
from ..stage import Stage

TITLE = "Experiment 1: two pods, one ResourceClaimTemplate"


def play(stage: Stage) -> None:
    manifest = documents(template_yaml("single-gpu", one_gpu()),
                         pod_yaml("pod1", "gpu", "resourceClaimTemplateName: single-gpu"),
                         pod_yaml("pod2", "gpu", "resourceClaimTemplateName: single-gpu"))
    stage.apply("A template stamps out one claim per pod; claimwarden creates them, the scheduler allocates.",
                manifest)
    pods = stage.wait("pod1 and pod2 Running", lambda: stage.running("pod1", "pod2"))
    devices = [stage.devices_of(stage.claim_of(p)) for p in pods]
    if len({d[0] for d in devices if d}) != 2:
        raise DemoError(f"experiment 1: pod1 and pod2 should hold two different devices, not {devices}")
    stage.kubectl("Each pod has its own claim, named <pod>-<pod claim>-<random>, allocated and reserved:",
                  "get", "resourceclaims", "-n", NAMESPACE)
    stage.claim_table("...on two different devices, each reserved for its pod:")
