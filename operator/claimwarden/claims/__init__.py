"""The claims controller: ResourceClaims generated for pods from ResourceClaimTemplates."""
