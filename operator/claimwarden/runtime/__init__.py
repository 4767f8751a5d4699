"""claimwarden's controller runtime, on top of Kopf.

Two layers run an event to a write:

- **Kopf watches and indexes.** It lists and watches each resource, keeps the in-memory indices
  (declared in `app.py`, one per kind, each with the question it answers; `cache.py` reads them),
  and calls `app.py`'s event handlers. Kopf writes nothing: no annotations, finalizers or
  diff-bases on the objects it watches (`kopf_diffbase.py`, `kopf_toggles.py`).
- **This runtime decides when work happens and how it may write.** An event handler only
  resolves the event once into a view (`objects/`) and hands it to each controller's
  `enqueue_for_*`, which puts keys on that controller's work queue. Workers then reconcile each key
  from the indices, never from the event.

What each module does:

- `workqueue.py`: one level-based queue per concern (client-go's semantics): a key is queued at
  most once and never worked on by two workers at once, failures back off per key, `Requeue`
  looks again after a delay. Priorities come from the split: each queue has its own workers
  (health's records and evictions their own count), so a burst of one kind never starves another.
- `operator.py`: the `Runtime`, holding the controllers, their queues and workers; `lead` starts
  the workers, `drain` lets them finish at shutdown, and a periodic resync queues every key
  again so that nothing depends on a single event.
- `staleness.py`: at each resync, objects deleted while a watch was down are forgotten.
- `assembly.py`: builds the Runtime once at start-up, with every collaborator passed in.
- `ending.py`: how the process ends when Kopf does not end it (a lost lease, a stuck shutdown).
- `readiness.py`: whether this replica may serve (`/readyz`).

What feeds the queues: Kopf's events of pods, claims, templates and PodGroups (the claims,
PodGroups and reservations queues); of ResourceSlices, UnhealthyDevice records, HealthPolicies,
DeviceClasses and Nodes (health, signals and the hand-off); the resync; a leader's first moments
(`lead` queues everything a standby's warm indices hold); and controllers themselves (a created
PodGroup claim queues its member pods, a cleared repair its device's signals).

Writes go through `kube/`, fenced by the leader election (`leader/`): a replica that may have lost
its lease writes nothing. Status writes are paced (a write is skipped while the last one applied is
fresh), and back-off and the client-side QPS budget keep a burst from flooding the API server.
"""
