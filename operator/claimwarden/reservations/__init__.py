"""The reservations controller: who holds a ResourceClaim, and releasing it when they are gone."""
