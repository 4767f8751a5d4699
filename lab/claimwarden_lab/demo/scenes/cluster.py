"""The cluster the walkthrough runs on: nodes, the DeviceClass, the slices and their devices."""

from __future__ import annotations

from ..stage import Stage

TITLE = "The cluster"

# Devices with their models, one line per device (plain kubectl: `kubectl claimwarden devices` needs the plugin).
DEVICE_ROW = '{{printf "%-12s %-7s %-17s %s\\n" '
DEVICES_TEMPLATE = (f'go-template={DEVICE_ROW}"NODE" "DEVICE" "MODEL" "MEMORY"}}}}'
                    '{{range .items}}{{$node := .spec.nodeName}}{{range .spec.devices}}'
                    f'{DEVICE_ROW}$node .name .attributes.model.string .capacity.memory.value}}}}'
                    '{{end}}{{end}}')


def play(stage: Stage) -> None:
    stage.kubectl("Nodes: kwok plays their kubelets, so pods on them become Running without containers.",
                  "get", "nodes")
    stage.kubectl("The DeviceClass: an admin's frame that selects devices by CEL, here all of one driver.",
                  "get", "deviceclasses", "-o",
                  "custom-columns=NAME:.metadata.name,SELECTOR:.spec.selectors[*].cel.expression")
    stage.kubectl("The fake driver publishes one ResourceSlice per node, listing that node's GPUs.",
                  "get", "resourceslices")
    stage.kubectl("Their devices with model and memory ('kubectl claimwarden devices' shows them too).",
                  "get", "resourceslices", "-o", DEVICES_TEMPLATE)
