"""Device health from the signals a cluster already emits (docs/concepts/health-from-signals.md, issue 21).

A device's signals become *observations* (source, signal, value, state, when), kept in the status of
one UnhealthyDevice per device (``spec.source: signals``); a HealthPolicy decides from them what the
record's effect is, and the health controller (``health/``) then acts on that effect exactly as on
any other record: breaker, drain modes, budget and approval are the same for every source.

Modules, by what they decide or do:

- ``observations``: the Observation and how a record's list of them is merged and bounded (pure).
- ``policy``: HealthPolicy parsing, durations, and the router that picks a device's policy (pure;
  CEL through ``claimwarden.cel``).
- ``decide``: a device's observations and history -> its effect, shadow or enforced, recovery and
  escalation, and the JSON of the decision and history (pure, deterministic); ``fires``: when one rule
  fires and when its mark recovers, per source, and the words of a decision; ``replay``: a trace decided
  with no cluster (replaying it gives the same decisions, across restarts too).
- ``taints``, ``podhealth``, ``nodes``: the level-based sources read from the caches (driver taints of
  complete pools, KEP-4680 ``allocatedResourcesStatus``, node conditions) as observations (pure).
- ``alerts``, ``webhook``: the pushed source, Alertmanager's webhook (authenticated; ``resolved`` is
  never recovery: a crashed exporter resolves its alerts too).
- ``records``: the signal record's name, body and status shape; ``keys``: observation keys bounded to what the
  record's schema holds, stable across restarts.
- ``controller``: one device at a time: the events that queue it, collect, route, merge, decide, write;
  and what a decision tells people (metrics, Events, a person's verified clear). Beside it, each with
  what it keeps in memory: ``sources`` (the level-based sources read from the caches for a device),
  ``routing`` (the router over the cached policies, rebuilt on a spec change), ``keeping`` (which
  observations a record keeps, pure), ``fleet`` (which devices saw which fault: workload faults),
  ``record_writes`` (create, patch on change, delete, through the lag of the watch), ``lifetime``
  (when a record may be deleted, when time alone changes a decision; pure).
- ``policy_status``: each HealthPolicy's status (rule counts, Accepted and why not), written on change.

What ``Unknown`` means: the kubelet lost the signal (KEP-4680). It is counted
(``claimwarden_signal_unknown_total``) and alerted on, never acted on.
"""
