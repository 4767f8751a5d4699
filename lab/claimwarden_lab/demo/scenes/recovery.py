"""Recovery: the mark is cleared, the waiting pod gets the repaired device, record and quarantine go."""

from __future__ import annotations

from ..options import MARK_PREFIX, NAMESPACE, DemoError
from ..stage import Stage

TITLE = "Recovery"


def play(stage: Stage) -> None:
    node, device = stage.broken
    assert stage.marked is not None
    slice_name, _ = stage.marked
    stage.kubectl(f"{device} is repaired. Clear the mark:",
                  "annotate", "resourceslice", slice_name, f"{MARK_PREFIX}{device}-")
    stage.marked = None
    [pod] = stage.wait("trainer-2 Running", lambda: stage.running("trainer-2"), 90)
    got = stage.devices_of(stage.claim_of(pod))
    if got != [(node, device)]:
        raise DemoError(f"recovery: trainer-2 should have {node}/{device}, it has {got}")
    stage.wait("the record and its quarantine claim to be removed",
               lambda: not stage.record_of(node, device) and not stage.quarantined(node, device))
    stage.kubectl("claimwarden removed the record, and with it the quarantine claim:", "get", "unhealthydevices")
    stage.claim_table(f"The waiting pod got {device}:")
    stage.kubectl("Every pod runs:", "get", "pods", "-n", NAMESPACE, "-o", "wide")
