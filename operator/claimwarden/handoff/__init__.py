"""Hand-off to repair (issue 22, part 3): claimwarden evicts and quarantines; repair systems reset and reboot.

claimwarden never resets a GPU or reboots a node. It says what it would ask for, and, where the cluster
runs a repair system it can talk to, asks:

- ``actions``: a record's recommended action (None, GpuReset, NodeReboot, Drain), from a person's
  ``spec.recommendedAction``, the deciding HealthPolicy rule's ``recommendedAction``, or the signal's
  documented default (a known XID, an NVML recovery action, the driver's gpu-lost taint), in that order.
  Written to ``status.recommendedAction`` on change, with an Event and a gauge, so any repair system can act.
- ``externalfaults``: NVIDIA NVSentinel's entry door, the cluster-scoped ``ExternalFault``
  (``nvsentinel.dgxc.nvidia.com/v1``, NVSentinel ADR-049). Opt-in (``--nvsentinel-handoff``). A fault is
  *node-scoped* when its repair takes the node (NodeReboot, Drain) or its signal is a node's condition;
  for those claimwarden opens one ExternalFault per node at a time (NVSentinel's webhook refuses a second
  active one for a node) naming the GPUs' UUIDs, and a verified recovery of the records it covers waits for
  its ``FaultCleared`` condition: NVSentinel's repair, not a person's word alone, ends the fault.
- ``controller``: one record at a time: decide, write on change, hand off, and the recovery gate the
  signals controller asks before it applies a verified clear.
"""
