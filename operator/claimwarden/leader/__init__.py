"""Leader election on a coordination.k8s.io Lease: only the leader runs the controllers (DESIGN.md §2.6)."""
