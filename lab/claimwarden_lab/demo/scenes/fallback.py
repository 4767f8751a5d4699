"""With ``--models``: a prioritized list (firstAvailable) falling back from H100 to A100 once H100s are taken."""

from __future__ import annotations

from ..manifests import CLAIM_INDENT, claim_yaml, documents, first_available, gpus, pod_yaml, template_yaml
from ..options import FALLBACK, NAMESPACE, DemoError
from ..stage import Stage

TITLE = f"A prioritized list: {', else '.join(FALLBACK)}"


def play(stage: Stage) -> None:
    preferred, fallback = FALLBACK
    free = [(node, len([m for _, m in devices if m == preferred]))
            for node, devices in stage.free_devices().items()]
    free = [(node, count) for node, count in free if count]
    manifests = []
    for i, (node, count) in enumerate(free):
        manifests += [claim_yaml(f"{preferred.lower()}-jobs-{i}", gpus(count, CLAIM_INDENT)),
                      pod_yaml(f"{preferred.lower()}-job-{i}", "gpus",
                               f"resourceClaimName: {preferred.lower()}-jobs-{i}", node=node)]
    taken_by = "the pods above"
    if manifests:
        taken_by = "these pods and the ones above"
        stage.apply(f"Take the {preferred}s that are still free:", documents(*manifests))
        names = [f"{preferred.lower()}-job-{i}" for i in range(len(free))]
        stage.wait(" and ".join(names) + " Running", lambda: stage.running(*names))
    if not any(model == fallback for devices in stage.free_devices().values() for _, model in devices):
        raise DemoError(f"the fallback scene needs a free {fallback}; none is left in the lab")
    stage.apply(f"Every {preferred} is in use ({taken_by} hold them). A template asking for an {preferred}, "
                f"else an {fallback} (firstAvailable), and a pod using it:",
                documents(template_yaml(f"{preferred.lower()}-or-{fallback.lower()}", first_available(FALLBACK)),
                          pod_yaml("inference", "gpu",
                                   f"resourceClaimTemplateName: {preferred.lower()}-or-{fallback.lower()}")))
    [pod] = stage.wait("inference Running", lambda: stage.running("inference"))
    claim = stage.claim_of(pod)
    [result] = claim.status.allocation.devices.results
    if result.request != f"gpu/{fallback.lower()}":
        raise DemoError(f"fallback: inference's claim should be allocated by gpu/{fallback.lower()}, "
                        f"not {result.request}")
    stage.kubectl(f"The claim was allocated by its second choice, subrequest gpu/{fallback.lower()}:",
                  "get", "resourceclaim", claim.metadata.name, "-n", NAMESPACE, "-o",
                  "custom-columns=CLAIM:.metadata.name,REQUEST:.status.allocation.devices.results[*].request,"
                  "NODE:.status.allocation.devices.results[*].pool,"
                  "DEVICE:.status.allocation.devices.results[*].device")
