"""What Kubernetes objects look like to claimwarden: plain reads of their bodies.

Every function takes plain dicts in the raw Kubernetes JSON shape (camelCase keys) and tolerates
missing keys: a pod without status, a claim without metadata, and so on. `meta` reads any object,
`pods` a pod and the claims it names, `claims` a ResourceClaim, and `trimmed` makes the small copies
the in-memory indices keep.
"""
