"""uninstall --hand-over's writes: the DeviceTaintRules of ``uninstall.hand_over_rules``, one POST each."""

from __future__ import annotations

from typing import Any

from .read import ClusterError
from .uninstall import DEVICE_ANNOTATION, Plan, Release, hand_over_rules


class HandOverError(Exception):
    """The hand-over cannot be done here; the message says why and what to do instead."""


def hand_over(cluster: Any, found: Plan) -> tuple[list[str], list[Release]]:
    """Write the hand-over rules; return the names written and the devices a lasting rule already kept off.

    A rule of the same name made since the snapshot (a concurrent run) is accepted when its spec is the hand-over
    rule's; any other rule of that name is an error, never overwritten."""
    path = cluster.taint_rule_path()
    if path is None:
        raise HandOverError("this cluster serves no DeviceTaintRule (1.34 to 1.36: feature gate DRADeviceTaints and "
                            "the resource.k8s.io version that serves it; served by default from 1.37), so nothing "
                            "can outlive claimwarden here: repair the marked devices, or keep claimwarden installed")
    api_version = "resource.k8s.io/" + path.split("/")[3]
    written = []
    for rule in hand_over_rules(found, api_version):
        name = rule["metadata"]["name"]
        status, body = cluster.call("POST", path, rule)
        if status == 409:
            if not _same(cluster.get(f"{path}/{name}"), rule):
                raise HandOverError(f"devicetaintrule {name} exists and is not the hand-over rule of "
                                    f"{rule['metadata']['annotations'][DEVICE_ANNOTATION]}; rename or delete it, "
                                    "then run again")
            continue
        if not 200 <= status <= 299:
            message = body.get("message") if isinstance(body, dict) else None
            raise ClusterError(f"POST {path}: {status} {message or 'refused'}")
        written.append(name)
    return written, [r for r in found.releases if r.lasting_rules]


def _same(existing: dict[str, Any] | None, rule: dict[str, Any]) -> bool:
    """Same selector and taint (the server adds fields, such as the taint's timeAdded)."""
    if existing is None:
        return False
    spec, wanted = existing.get("spec") or {}, rule["spec"]
    taint = spec.get("taint") or {}
    return spec.get("deviceSelector") == wanted["deviceSelector"] and all(
        taint.get(key) == value for key, value in wanted["taint"].items())
