"""The thin adapter between claimwarden and the Kubernetes API."""
