"""Per-version presets: the feature gates and runtime-config that turn a DRA feature on in the lab.

The facts come from each release's kube_features.go and controlplane/instance.go (gate defaults and
which API versions are served by default). A preset that a version cannot serve is refused with the
reason, so a test or a user never gets a lab that silently lacks what it asked for.
"""

from __future__ import annotations

from dataclasses import dataclass

from .processes import LabError


@dataclass(frozen=True)
class Preset:
    gates: tuple[str, ...] = ()
    runtime_config: tuple[str, ...] = ()


# minor version -> preset name -> what it needs; a missing entry means "not available", with the reason below.
PRESETS: dict[str, dict[str, Preset]] = {
    "1.34": {
        "device-taints": Preset(("DRADeviceTaints=true",), ("resource.k8s.io/v1alpha3=true",)),
        "extended-resources": Preset(("DRAExtendedResource=true",)),
        # KEP-4680 (pod.status...allocatedResourcesStatus): alpha; the apiserver drops the field while it is
        # off. kwok plays the kubelet, so only the control plane needs it. Messages (ResourceHealthStatusMessage)
        # first exist in 1.36: before, the apiserver drops resources[].message.
        "resource-health": Preset(("ResourceHealthStatus=true",)),
    },
    "1.35": {
        "device-taints": Preset(("DRADeviceTaints=true", "DRADeviceTaintRules=true"),
                                ("resource.k8s.io/v1alpha3=true",)),
        "extended-resources": Preset(("DRAExtendedResource=true",)),
        "resource-health": Preset(("ResourceHealthStatus=true",)),
        # KEP-4815: alpha (since 1.33); from 1.35 counter sets may sit in their own slices of a pool.
        "partitionable-devices": Preset(("DRAPartitionableDevices=true",)),
    },
    "1.36": {
        # DRADeviceTaints is beta and on; the rules' beta API (v1beta2) is off by default.
        "device-taints": Preset(("DRADeviceTaintRules=true",), ("resource.k8s.io/v1beta2=true",)),
        "extended-resources": Preset(),  # beta, on by default
        "resource-health": Preset(),  # ResourceHealthStatus and ResourceHealthStatusMessage beta, on
        "partitionable-devices": Preset(),  # DRAPartitionableDevices beta, on by default
        "podgroups": Preset(("GenericWorkload=true", "DRAWorkloadResourceClaims=true"),
                            ("scheduling.k8s.io/v1alpha2=true",)),
    },
    "1.37": {
        "device-taints": Preset(),  # GA: resource.k8s.io/v1 DeviceTaintRule, on by default
        "extended-resources": Preset(),  # GA
        "resource-health": Preset(),  # still beta (not GA in 1.37.2), on by default
        "partitionable-devices": Preset(),  # still beta, on by default
        "podgroups": Preset(("GenericWorkload=true", "DRAWorkloadResourceClaims=true"),
                            ("scheduling.k8s.io/v1beta1=true",)),
    },
}
UNAVAILABLE = {
    "podgroups": "PodGroup reservations (KEP-5729, gate DRAWorkloadResourceClaims) first appear in 1.36",
    "partitionable-devices": "the lab publishes counter sets in their own slices of a pool (KEP-4815), which "
                             "the apiserver accepts from 1.35 (gate DRAPartitionableDevices; on by default from "
                             "1.36); choose --kubernetes 1.35 or later",
}


def names() -> list[str]:
    return sorted({name for presets in PRESETS.values() for name in presets})


def resolve(version: str, wanted: str, gates: str = "", runtime_config: str = "") -> tuple[str, str]:
    """Merge the presets named in ``wanted`` (comma-separated) for ``version`` (e.g. 1.37.2) into the given
    --feature-gates and --runtime-config values; explicit values come last, so they win."""
    minor = ".".join(version.split(".")[:2])
    all_gates = [g for g in gates.split(",") if g]
    all_config = [c for c in runtime_config.split(",") if c]
    preset_gates: list[str] = []
    preset_config: list[str] = []
    for name in (n.strip() for n in wanted.split(",") if n.strip()):
        if name not in names():
            raise LabError(f"unknown preset {name!r}; give one or more of {', '.join(names())}")
        preset = PRESETS.get(minor, {}).get(name)
        if preset is None:
            reason = UNAVAILABLE.get(name, "not served by this version")
            raise LabError(f"preset {name!r} is not available on Kubernetes {version}: {reason}")
        preset_gates += [g for g in preset.gates if g not in preset_gates]
        preset_config += [c for c in preset.runtime_config if c not in preset_config]
    return ",".join(preset_gates + all_gates), ",".join(preset_config + all_config)
