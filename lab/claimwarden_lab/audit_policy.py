"""The lab apiserver's audit policies: what the test suite's auditor and the benchmarks read."""

from __future__ import annotations

CLAIMWARDEN_USER = "system:serviceaccount:claimwarden-system:claimwarden"
AUDIT_POLICY = f"""\
# The lab's apiserver audit policy: every write claimwarden makes, and every eviction by anyone,
# at Metadata level (who, verb, object, response code, user agent; no bodies), except the leader
# Lease, whose request bodies show who held it when, and the quarantine claims in claimwarden's
# namespace, whose bodies show which device each one holds (the chaos checker follows them).
# Nothing else, so the log stays small and the test suite's auditor reads only what it needs.
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
rules:
  - level: Request
    users: ["{CLAIMWARDEN_USER}"]
    verbs: ["create", "update", "patch", "delete"]
    resources:
      - group: "coordination.k8s.io"
        resources: ["leases"]
  - level: Request
    users: ["{CLAIMWARDEN_USER}"]
    verbs: ["create", "update", "patch", "delete"]
    namespaces: ["claimwarden-system"]
    resources:
      - group: "resource.k8s.io"
        resources: ["resourceclaims", "resourceclaims/status"]
  - level: Metadata
    users: ["{CLAIMWARDEN_USER}"]
    verbs: ["create", "update", "patch", "delete", "deletecollection"]
  - level: Metadata
    verbs: ["create"]
    resources:
      - group: ""
        resources: ["pods/eviction"]
  - level: None
"""
# For benchmarks that count API calls (LabOptions.audit_all): every request by anyone, reads too, at
# Metadata level; the auditor's rules still read only what they need from it.
AUDIT_POLICY_ALL = AUDIT_POLICY.replace('  - level: None\n', '  - level: Metadata\n')
