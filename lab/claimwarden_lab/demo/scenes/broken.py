"""A broken GPU: a device in use is marked unhealthy; claimwarden evicts its pod, records it and quarantines it.

The scene fills one node, marks the device the last pod got, and shows the eviction (its Event), the
UnhealthyDevice record and the quarantine claim; then the pod comes back and waits, because the only
free device on its node is the broken one. It leaves the broken device and its mark on the stage for
the recovery scene.
"""

from __future__ import annotations

from ..manifests import CLAIM_INDENT, claim_yaml, documents, gpus, pod_yaml
from ..options import CLAIMWARDEN_NAMESPACE, MARK_PREFIX, NAMESPACE, DemoError
from ..stage import Stage

TITLE = "A broken GPU"
BROKEN_REASON = "XID 79: fell off the bus"


def play(stage: Stage) -> None:
    free = stage.free_devices()
    node = next((n for n, devices in free.items() if devices), None)
    if node is None:
        raise DemoError("no GPU is free in the lab for the broken-GPU scene; free one (kubectl get "
                        "resourceclaims -A) or run the demo on a fresh lab")
    others = len(free[node]) - 1
    manifests = []
    if others:
        manifests += [claim_yaml("batch-gpus", gpus(others, CLAIM_INDENT)),
                      pod_yaml("batch", "gpus", "resourceClaimName: batch-gpus", node=node)]
    manifests.append(pod_yaml("trainer", "gpu", "resourceClaimTemplateName: single-gpu", node=node))
    stage.apply(f"Fill {node}: 'batch' takes {others} of its {others + 1} GPUs, 'trainer' the last one.",
                documents(*manifests))
    names = ("batch", "trainer") if others else ("trainer",)
    pods = stage.wait(" and ".join(names) + " Running", lambda: stage.running(*names))
    [(pool, device)] = stage.devices_of(stage.claim_of(pods[-1]))
    stage.broken = (node, device)
    stage.claim_table(f"trainer runs on {pool}/{device}:")

    slice_name = next(s.metadata.name for s in stage.slices() if s.spec.node_name == node)
    stage.marked = (slice_name, device)
    stage.kubectl(f"{device} breaks. Mark it unhealthy by annotating the slice that lists it:",
                  "annotate", "resourceslice", slice_name, f"{MARK_PREFIX}{device}={BROKEN_REASON}")
    trainer_uid = pods[-1].metadata.uid

    def evicted() -> bool:
        pod = stage.pod("trainer")
        record = stage.record_of(pool, device)
        status = (record or {}).get("status") or {}
        stage.seen = f"trainer {'gone' if pod is None else pod.status.phase}, record status {status}"
        return ((pod is None or pod.metadata.uid != trainer_uid) and status.get("podsEvicted") == 1
                and bool(stage.events("trainer", "EvictedUnhealthyDevice")))

    stage.wait("claimwarden to evict trainer and count it in the UnhealthyDevice record", evicted)
    stage.kubectl("claimwarden evicted trainer through the Eviction API and said why:",
                  "get", "events", "-n", NAMESPACE,
                  "--field-selector", "involvedObject.name=trainer,reason=EvictedUnhealthyDevice")
    stage.kubectl("The record of the broken device counts the evicted and the still pending pods:",
                  "get", "unhealthydevices")

    stage.wait(f"a quarantine claim on {pool}/{device}", lambda: stage.quarantined(pool, device))
    stage.kubectl("A quarantine claim holds the device, so the scheduler hands it to no one:",
                  "get", "resourceclaims", "-n", CLAIMWARDEN_NAMESPACE)

    stage.apply(f"trainer comes back (as its Job would re-create it), again on {node}, where only "
                f"{device} is not in use:",
                pod_yaml("trainer-2", "gpu", "resourceClaimTemplateName: single-gpu", node=node))

    def waiting() -> bool:
        pod = stage.pod("trainer-2")
        conditions = {c.type: c for c in (pod.status.conditions or [])} if pod else {}
        scheduled = conditions.get("PodScheduled")
        stage.seen = f"trainer-2 {pod.status.phase if pod else 'absent'}"
        return (scheduled is not None and scheduled.status == "False" and scheduled.reason == "Unschedulable"
                and bool(stage.events("trainer-2", "FailedScheduling")))

    stage.wait("the scheduler to find no device for trainer-2", waiting)
    stage.kubectl("It does not land on the broken device: nothing else is free there, so it waits.",
                  "get", "events", "-n", NAMESPACE,
                  "--field-selector", "involvedObject.name=trainer-2,reason=FailedScheduling")
