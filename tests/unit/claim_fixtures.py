"""Building blocks for claim objects in the unit tests."""

from __future__ import annotations

from typing import Any


def pod_owner_reference(owner_uid: str, pod_name: str = "owner") -> dict[str, Any]:
    """The controller ownerReference a generated claim carries for its pod."""
    return {"apiVersion": "v1", "kind": "Pod", "name": pod_name, "uid": owner_uid, "controller": True}
