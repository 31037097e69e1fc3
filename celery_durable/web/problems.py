"""What a refusal looks like over HTTP: one mapping from the client's errors.

The client already says why it refuses, with a stable code where it has one;
the web view adds only the HTTP status. Pages show the message,
the JSON API returns ``{"error": {"code", "message"}}``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from celery_durable import (
    DurableError,
    RunNotFoundError,
    ScheduleNotFoundError,
    StorageCorruptError,
    StorageUnavailableError,
    ThrottleNotFoundError,
    WorkflowResumeError,
)

RESUME_STATUS = {
    "not_found": 404,
    "workflow_storage_unavailable": 503,
    "workflow_storage_corrupt": 500,
    "workflow_limits_invalid": 400,
}
"""Other resume codes (non_resumable, already_active, workflow_code_changed) are conflicts: 409."""


@dataclass(frozen=True, slots=True)
class Problem:
    status: int
    code: str
    message: str

    def to_dict(self) -> dict[str, Any]:
        return {"error": {"code": self.code, "message": self.message}}


class BadRequest(ValueError):
    """Input the web view itself refuses before calling the client (a form field, a query option)."""


class Forbidden(Exception):
    """A POST without a valid CSRF token, or any POST to a read-only server."""


def whole_number(name: str, text: str) -> int:
    """A query option that counts: digits only, else ``BadRequest``."""
    if not text.isdigit():
        raise BadRequest(f"{name} must be a whole number, got {text[:40]!r}")
    return int(text)


def problem(exc: BaseException) -> Problem | None:
    """The HTTP form of an error the client raises on purpose; None for a bug."""
    code = getattr(exc, "code", None)
    if isinstance(exc, RunNotFoundError | ScheduleNotFoundError | ThrottleNotFoundError):
        return Problem(404, "not_found", str(exc))
    if isinstance(exc, WorkflowResumeError):
        status = RESUME_STATUS.get(exc.code or "", 409)
        return Problem(status, exc.code or "resume_refused", str(exc))
    if isinstance(exc, StorageUnavailableError):
        return Problem(503, code or "workflow_storage_unavailable", str(exc))
    if isinstance(exc, StorageCorruptError):
        return Problem(500, code or "workflow_storage_corrupt", str(exc))
    if isinstance(exc, Forbidden):
        return Problem(403, "forbidden", str(exc))
    if isinstance(exc, ValueError):  # BadRequest, WorkflowDefinitionError, the client's checks
        return Problem(400, code or "invalid", str(exc))
    if isinstance(exc, DurableError):
        return Problem(409, code or "refused", str(exc))
    return None
