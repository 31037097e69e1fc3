"""The exception tree: one base, a few branches, stable codes.

Every error carries the arguments it was built from in ``args`` and rebuilds
itself from them in ``__reduce__``: Celery pickles exception info between the
worker and the caller, and an exception whose ``__init__`` takes keyword-only
fields would otherwise fail to unpickle on the far side.
"""

from __future__ import annotations

from typing import Any

RESUME_ERROR_CODES = frozenset(
    {
        "not_found",
        "non_resumable",
        "already_active",
        "workflow_code_changed",
        "workflow_limits_invalid",
        "workflow_storage_unavailable",
        "workflow_storage_corrupt",
    }
)


class DurableError(Exception):
    """Base of every error celery-durable raises on purpose."""

    code: str | None = None

    def __init__(self, message: str = "", *, code: str | None = None) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code

    @property
    def message(self) -> str:
        return str(self.args[0]) if self.args else ""

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (type(self), self.message, self.__dict__.copy()))


def _rebuild(cls: type[DurableError], message: str, state: dict[str, Any]) -> DurableError:
    error = cls.__new__(cls)
    Exception.__init__(error, message)
    error.__dict__.update(state)
    return error


class WorkflowDefinitionError(DurableError, ValueError):
    """A workflow's meta, phases or limits break the rules of SPEC §2 and §6."""

    code = "workflow_definition_invalid"


class WorkflowResumeError(DurableError):
    """A run could not be resumed; ``code`` says why (SPEC §8)."""

    def __init__(self, message: str, *, code: str) -> None:
        if code not in RESUME_ERROR_CODES:
            raise ValueError(f"Unknown resume error code: {code}")
        super().__init__(message, code=code)


class RunNotFoundError(DurableError, LookupError):
    """No run with this id exists in the client's namespace."""

    code = "not_found"


class WorkflowWaitCancelled(DurableError):
    """The caller's ``cancel_event`` ended a wait; the run itself goes on."""

    code = "wait_cancelled"


class WorkflowCancelled(DurableError):
    """Raised inside a run whose cancellation was requested.

    It is fatal: ``parallel`` and ``pipeline`` propagate it instead of turning
    it into a ``None`` slot. It stays an ``Exception`` (not a
    ``BaseException``) so user clean-up code written as ``except Exception``
    still runs; the engine remembers the cancellation, so swallowing it does
    not keep the run alive.
    """

    code = "cancelled"


class WorkflowLimitReached(DurableError):
    """The run reached one of its ceilings (SPEC §6); ``limit`` names it.

    Fatal inside a run: the run stops with status ``error``, reason
    ``workflow_limit_reached``, and can be resumed with a higher limit.
    """

    code = "workflow_limit_reached"

    def __init__(self, limit: str) -> None:
        super().__init__(f"Run reached its limit {limit}")
        self.limit = limit


class StepFailed(DurableError):
    """A step's producer raised, or returned something that is not JSON."""

    code = "step_failed"

    def __init__(self, key: str, error_type: str, message: str) -> None:
        super().__init__(f"Step {key!r} failed: {error_type}: {message}")
        self.key = key
        self.error_type = error_type
        self.error_message = message


class NonDeterminismError(DurableError):
    """Replay asked for calls in an order the journal contradicts."""

    code = "nondeterminism"


class StorageUnavailableError(DurableError):
    """Redis could not be reached; nothing was written."""

    code = "workflow_storage_unavailable"


class StorageCorruptError(DurableError):
    """Redis answered with data that is not what celery-durable wrote."""

    code = "workflow_storage_corrupt"


class StaleAttemptError(DurableError):
    """This attempt lost execution authority: a newer epoch owns the run.

    Raised when a fenced write is refused. It is fatal and is never shown as a
    run's error: the attempt that owns the run decides the run's fate.
    """

    code = "stale_attempt"


FATAL_ERRORS: tuple[type[Exception], ...] = (
    WorkflowCancelled,
    WorkflowLimitReached,
    NonDeterminismError,
    StorageUnavailableError,
    StorageCorruptError,
    StaleAttemptError,
)
"""Errors that abort a whole ``parallel``/``pipeline`` instead of filling a slot."""
