"""`/readyz`: this replica is leading or standing by, and connected.

Ready means two things, for the leader and a standby alike (a standby is ready: it takes over without a
re-list, and a rollout must be able to wait for it):
- Kopf has listed every watched resource once: its indices hold the cluster, so the controllers would
  decide from the whole picture (kopf_toggles.indexed);
- the last round trip to the API server succeeded recently: every replica reads the Lease every retry period
  (2 s by default), so a read older than a lease duration (15 s) means this replica is cut off. Without
  leader election there is no such read, and only the first condition counts.
Not ready is not dead: the liveness endpoint answers apart from this, so a replica cut off from the API
server leaves the Service's endpoints (and `kubectl rollout status`) without being restarted.

`server.py` serves the answer at the `--readiness` URL.
"""

from __future__ import annotations

import urllib.parse
from dataclasses import dataclass


@dataclass(frozen=True)
class Readiness:
    ready: bool
    reason: str


def decide(*, indexed: bool, last_contact: float | None, now: float, max_age: float | None) -> Readiness:
    """Ready when Kopf has indexed everything and (with leader election, max_age set) the last successful
    API contact is younger than max_age seconds. Times are monotonic seconds."""
    if not indexed:
        return Readiness(False, "not all watched resources are listed yet")
    if max_age is None:
        return Readiness(True, "indexed")
    if last_contact is None:
        return Readiness(False, "the Lease has not been read yet")
    age = now - last_contact
    if age >= max_age:
        return Readiness(False, f"the last successful API request (the Lease) was {age:.0f} s ago")
    return Readiness(True, "indexed and connected")


def split_url(url: str) -> tuple[str, int, str]:
    """(host, port, path) of an http:// endpoint URL such as http://0.0.0.0:8082/readyz; ValueError otherwise."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme != "http" or not parts.port or not parts.path:
        raise ValueError(f"{url!r} is not an http://host:port/path URL")
    return parts.hostname or "0.0.0.0", parts.port, parts.path
