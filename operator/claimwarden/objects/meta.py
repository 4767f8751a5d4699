"""Accessors every object shares: metadata, spec, status, deletion and finalizers."""

from __future__ import annotations

from typing import Any


def metadata(obj: dict[str, Any] | None) -> dict[str, Any]:
    """The object's metadata, or an empty dict."""
    return (obj or {}).get("metadata") or {}


def spec(obj: dict[str, Any] | None) -> dict[str, Any]:
    """The object's spec, or an empty dict."""
    return (obj or {}).get("spec") or {}


def status(obj: dict[str, Any] | None) -> dict[str, Any]:
    """The object's status, or an empty dict."""
    return (obj or {}).get("status") or {}


def is_being_deleted(obj: dict[str, Any] | None) -> bool:
    """True when the object has a deletionTimestamp."""
    return bool(metadata(obj).get("deletionTimestamp"))


def has_finalizer(obj: dict[str, Any] | None, finalizer: str) -> bool:
    """True when the object's metadata.finalizers lists `finalizer`."""
    return finalizer in (metadata(obj).get("finalizers") or [])
