"""API errors as claimwarden's controllers need to tell them apart."""

from __future__ import annotations

import json


class ApiError(Exception):
    """A failed API request: HTTP status, the Status reason and message the server gave."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(f"{status} {reason}: {message}")
        self.status = status
        self.reason = reason
        self.message = message

    @classmethod
    def from_response(cls, status: int, text: str) -> ApiError:
        try:
            data = json.loads(text)
        except ValueError:
            return cls(status, "", text[:500])
        if not isinstance(data, dict):
            return cls(status, "", text[:500])
        return cls(status, str(data.get("reason", "")), str(data.get("message", "")))

    @property
    def not_found(self) -> bool:
        return self.status == 404

    @property
    def conflict(self) -> bool:
        return self.status == 409

    @property
    def too_many_requests(self) -> bool:
        return self.status == 429
