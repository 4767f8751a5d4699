"""Device health: a device marked unhealthy empties itself and stays free of new work (DESIGN.md §2.3).

Modules, by what they decide or do:

- ``records``, ``tolerations``, ``plan``: pure decisions (a record's name and fields, the drain grammar,
  drain modes, eviction times, object bodies); ``slice_marks``: pure: slice annotations -> the records
  that match them; ``record_status``: pure: a record's status conditions.
- ``breaker``, ``budget``: pure decisions on how much may be evicted: the blast-radius breaker per
  driver and the eviction budget, shared fairly over namespaces (docs/concepts/safety.md "What claimwarden will not do
  without asking"); ``breaker_view``: the breaker's per-driver totals, kept up to date as claims,
  records and evictions change, and each driver's decisions (``Breakers``).
- ``approval``: pure decision on which approvals count (an approver's, for the record's current
  generation, while the admission policy is installed); ``admission`` reads that policy every 15 s;
  ``approval_judge``: each record's verdict as it counts now (confirmed, distrusted, removed, reported).
- ``marks``: slice annotations -> UnhealthyDevice records.
- ``domains``: pure: a device's fault domain, the devices that share its counter sets or its parent, and
  which devices are whole; ``siblings``: pure: the records derived for the siblings of a marked whole
  device (or of a mark with scope FaultDomain); ``sibling_records``: keeps them in step, one pool at a time.
- ``controller``: one record at a time, composing the modules below it: plan, approval, breaker,
  evictions, quarantine, status. ``holder_index``: which claims held each record's device (a claim that
  lets go wakes its records); ``status_writes``: the record's status, written when it changed, paced.
- ``quarantine``: the quarantine claims and DeviceTaintRules that keep new work off a device;
  ``device_sync``: the device's one quarantine claim, synced by whichever of its records asks (rule 1 below).
- ``evictions``: one pod at a time, through the Eviction API, after the drain mode, the breaker and
  the budget allow it; each attempt's parts: ``eviction_reads`` (what it reads, shared in a burst),
  ``breaker_room`` (the breaker's room in flight), ``refusals`` (PodDisruptionBudget refusals and their
  back-off), ``eviction_counts`` (each record's counts and window, paced or written ahead: ``counts``,
  ``window``, ``ahead``) and ``event_poster`` (Events beside the work).
- ``groups``: pure: pods holding a device through their PodGroup's reservation; ``node_drain``: pure: a
  drain Node record's evictions, in the drain order; ``taint_rules``: counts DeviceTaintRules that select
  every device.
- ``wave``: the bookkeeping (statuses, Events, releases on quarantined devices) that waits while a
  wave of evictions is under way, so that the evictions go first.

**The quarantine trap** (docs/concepts/device-health.md "Keeping new work away"). A quarantine claim is a
ResourceClaim in claimwarden's namespace whose ``status.allocation`` names the device and no pod; schedulers never
hand out a device that an allocated claim holds. But kube-scheduler keeps allocated devices as a
plain set (``allocateddevices.go``) and removes a device from it whenever *any* claim holding it is
deallocated or deleted, even while the quarantine claim still holds it. Hence **one quarantine claim
per device**, whichever and however many records mark it (an annotation record and an admin's, say):
it carries the device's label (``plan.device_label``), and it is released only when no record of the
device is left. With a claim per record, clearing one record released its claim, and the scheduler
forgot the device while the other record's claim still held it. The rules, referred to by number:

1. When another claim holding the device lets go, the quarantine is re-asserted with a *new*
   claim: clearing and re-writing the allocation of the old one would be a deallocation, and a
   deallocation makes the scheduler retry pending pods while the device looks free. The old claim
   is deleted first (the device is already forgotten, and a deletion wakes nobody up to 1.36), so
   one quarantine claim per device is the bound. It follows that a quarantine claim made while other
   claims hold the device protects nothing (they keep it allocated, and their release makes the
   scheduler forget it anyway): the first one is made when they let go (``plan.quarantine_step``).
   Which holders were seen is the device's memory, so that of its records only one re-asserts.
2. A generated claim (its pod's, its PodGroup's, or the scheduler's extended-resource claim) on a
   quarantined device is released by deleting it with its allocation rather than by deallocating
   it: up to 1.36 a deletion does not wake pending pods.
3. On clearing, the quarantine claim is deallocated (waking waiting pods, which may now take the
   device) and then deleted.
4. From 1.37 kube-scheduler also retries pending pods when an allocated claim is deleted
   (``preQueueingHint`` in its dynamicresources plugin), so rule 2's deletion opens the same window
   as a deallocation: the waiting pod takes the device before the new quarantine claim is
   allocated. Where no DeviceTaintRule keeps pending pods off the device meanwhile, a generated
   claim on a quarantined device keeps its allocation and its delete-protection finalizer (its
   reservations go) until the mark is cleared; the scheduler never sees the device let go, and no
   quarantine claim is needed while it holds it. Where DeviceTaintRule is served, its rule is
   written at once (not after the evictions) and keeps pending pods off through the window.
"""
