"""Observation keys that fit a record (``observations.KEY_MAX``, the CRD's maxLength).

Sources build keys from names the cluster chooses (a pool name alone may have 253 characters), so a
long key keeps its head, readable, and ends in a hash of the whole: the same input, the same key.
"""

from __future__ import annotations

from claimwarden.health.records import short_hash
from claimwarden.signals.observations import KEY_MAX


def bounded(key: str) -> str:
    """``key`` itself when it fits, else its first characters, '~' and the hash of all of it."""
    if len(key) <= KEY_MAX:
        return key
    digest = short_hash(key)
    return f"{key[:KEY_MAX - len(digest) - 1]}~{digest}"
