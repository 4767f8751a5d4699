"""Observation keys that fit a record (``observations.KEY_MAX``, the CRD's maxLength).

Sources build keys from names the cluster chooses. The longest the API allows fit (a pod's key, with
a 253-character pool, a 128-character device and 63-character driver and container names, is about
550 characters), but should one not, a plain cut (``observations`` cuts what is too long) could make
two different keys one; here a long key keeps its readable head and ends in a hash of all of it.
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
