"""claimwarden's controller runtime, on top of Kopf.

Two layers run an event to a write:

- **Kopf** is the watch and index layer: it lists and watches each resource, keeps the in-memory
  indices that `cache.py` reads, and calls `app.py`'s handlers with each event.
- **This runtime** decides when work happens. Handlers only enqueue keys; per-controller work queues
  (`workqueue.py`) run reconcilers with back-off, a periodic resync and priorities; `staleness.py`
  forgets objects deleted while a watch was down; `operator.py` holds the controllers and starts
  their workers when this replica leads; `readiness.py` says whether the replica may serve.
"""
