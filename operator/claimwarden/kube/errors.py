"""API errors as claimwarden's controllers need to tell them apart.

Two different refusals share HTTP 429:

- the Eviction API refusing because of a PodDisruptionBudget
  (``pkg/registry/core/pod/storage/eviction.go``): a Status with reason ``TooManyRequests`` and a
  cause ``{"reason": "DisruptionBudget"}`` in ``details.causes`` (the Go field ``StatusCause.Type``
  is serialised as ``reason``), sometimes with ``details.retryAfterSeconds`` while the budget is
  still being processed;
- API Priority and Fairness (or max-in-flight) shedding load: a plain-text body "Too many
  requests, please try again later." with a ``Retry-After`` header, no Status and no cause.

Two different answers share HTTP 404 (bodies recorded from kube-apiserver v1.37.2, in
tests/unit/test_kube_errors.py):

- the object is missing: a Status with reason ``NotFound`` whose ``details`` name it
  (``{"name": "x", "group": "scheduling.k8s.io", "kind": "podgroups"}``);
- the server does not serve the resource at that group and version (a version an upgrade or a
  ``--runtime-config`` change dropped, a CRD not installed): a Status "the server could not find
  the requested resource" with empty ``details``, or plain text "404 page not found". That says
  nothing about the object, so it is `NotServed`, never "missing".
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

DISRUPTION_BUDGET_CAUSE = "DisruptionBudget"


class ApiError(Exception):
    """A failed API request: HTTP status, the Status reason and message the server gave."""

    def __init__(self, status: int, reason: str, message: str, *, causes: tuple[str, ...] = (),
                 retry_after: float | None = None) -> None:
        super().__init__(f"{status} {reason}: {message}")
        self.status = status
        self.reason = reason
        self.message = message
        self.causes = causes  # details.causes[].reason, e.g. "DisruptionBudget"
        self.retry_after = retry_after  # seconds, from the Retry-After header or details.retryAfterSeconds

    @classmethod
    def from_response(cls, status: int, text: str, headers: Mapping[str, str] | None = None) -> ApiError:
        retry_after = _seconds((headers or {}).get("Retry-After"))
        try:
            data = json.loads(text)
        except ValueError:
            data = None
        if not isinstance(data, dict):
            if status == 404:
                return NotServed("", text.strip()[:500])
            return cls(status, "", text.strip()[:500], retry_after=retry_after)
        details = data.get("details")
        if not isinstance(details, dict):
            details = {}
        causes = tuple(str(c.get("reason") or c.get("type") or "") for c in details.get("causes") or []
                       if isinstance(c, dict))
        if retry_after is None:
            retry_after = _seconds(details.get("retryAfterSeconds"))
        reason, message = str(data.get("reason", "")), str(data.get("message", ""))
        if status == 404 and not (reason == "NotFound" and details.get("name")):
            return NotServed(reason, message)
        return cls(status, reason, message, causes=causes, retry_after=retry_after)

    @property
    def not_found(self) -> bool:
        """The object the request named does not exist (a 404 whose Status names it; not `NotServed`)."""
        return self.status == 404 and not isinstance(self, NotServed)

    @property
    def conflict(self) -> bool:
        return self.status == 409

    @property
    def too_many_requests(self) -> bool:
        """Any 429: a PodDisruptionBudget refusal or throttling; tell them apart with the two below."""
        return self.status == 429

    @property
    def disruption_budget(self) -> bool:
        """An eviction refused because a PodDisruptionBudget allows no disruption now."""
        return self.status == 429 and DISRUPTION_BUDGET_CAUSE in self.causes

    @property
    def throttled(self) -> bool:
        """A 429 that is not about a budget: the API server shedding load (API Priority and Fairness)."""
        return self.status == 429 and not self.disruption_budget


class NotServed(ApiError):
    """HTTP 404 for the resource, not the object: the server does not serve that group, version and
    resource now. Nothing may be concluded about the object; the served version may be looked up again."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(404, reason, message or "the server could not find the requested resource")


class NotLeader(ApiError):
    """A write refused before it was sent: this process does not hold an unexpired leader lease."""

    def __init__(self, method: str, path: str) -> None:
        super().__init__(0, "NotLeader", f"{method} {path}: not sent, this replica does not hold the lease")


class ApiUnreachable(ApiError):
    """No answer at all: the connection was refused or broken (an apiserver restarting, a network fault)."""

    def __init__(self, method: str, path: str, cause: BaseException) -> None:
        super().__init__(0, "Unreachable", f"{method} {path}: {type(cause).__name__}: {cause}")


class ApiTimeout(ApiError):
    """No complete answer within the request timeout (for a write, at most the time the fence had left);
    retried like any other API error."""

    def __init__(self, method: str, path: str, timeout: float) -> None:
        super().__init__(0, "Timeout", f"{method} {path}: no answer within {timeout:.3g} s")


def _seconds(value: Any) -> float | None:
    """Retry-After as delay-seconds (the HTTP-date form is not used by kube-apiserver)."""
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        return None
    return seconds if seconds >= 0 else None
