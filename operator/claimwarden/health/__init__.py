"""Device health: a device marked unhealthy empties itself and stays free of new work (DESIGN.md §2.3).

Modules, by what they decide or do:

- ``records``, ``tolerations``, ``plan``: pure decisions (marks, drain modes, eviction times, object bodies).
- ``breaker``, ``budget``: pure decisions on how much may be evicted: the blast-radius breaker per
  driver and the eviction budget, shared fairly over namespaces (README "What claimwarden will not do
  without asking"); ``breaker_view``: the breaker's per-driver totals, kept up to date as claims,
  records and evictions change.
- ``approval``: pure decision on which approvals count (an approver's, for the record's current
  generation, while the admission policy is installed); ``admission`` reads that policy every 15 s.
- ``marks``: slice annotations -> UnhealthyDevice records.
- ``controller``: one record at a time: quarantine, status, which pods to evict and when.
- ``quarantine``: the quarantine claims and DeviceTaintRules that keep new work off a device.
- ``evictions``: one pod at a time, through the Eviction API, after the drain mode, the breaker and
  the budget allow it.
- ``wave``: the bookkeeping (statuses, Events, releases on quarantined devices) that waits while a
  wave of evictions is under way, so that the evictions go first.

**The quarantine trap** (README "Keeping new work away"). A quarantine claim is a ResourceClaim in
claimwarden's namespace whose ``status.allocation`` names the device and no pod; schedulers never
hand out a device that an allocated claim holds. But kube-scheduler keeps allocated devices as a
plain set (``allocateddevices.go``) and removes a device from it whenever *any* claim holding it is
deallocated or deleted, even while the quarantine claim still holds it. Three rules follow, and the
code refers to them by number:

1. When another claim holding the device lets go, the quarantine is re-asserted with a *new*
   claim: clearing and re-writing the allocation of the old one would be a deallocation, and a
   deallocation makes the scheduler retry pending pods while the device looks free. The old claim
   is deleted first (the device is already forgotten, and a deletion wakes nobody), so one
   quarantine claim per record is the bound. It follows that a quarantine claim made while other
   claims hold the device protects nothing (they keep it allocated, and their release makes the
   scheduler forget it anyway): the first one is made when they let go (``plan.quarantine_step``).
2. A generated claim on a quarantined device is released by deleting it with its allocation
   rather than by deallocating it: in 1.34 a deletion does not wake pending pods.
3. On clearing, the quarantine claim is deallocated (waking waiting pods, which may now take the
   device) and then deleted.
"""
