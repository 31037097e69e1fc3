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
        return (_rebuild, (type(self), str(self.args[0]) if self.args else "", self.__dict__.copy()))


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

    def __init__(self, message: str = "", *, code: str) -> None:
        if code not in RESUME_ERROR_CODES:
            raise ValueError(f"Unknown resume error code: {code}")
        super().__init__(message or f"Run cannot be resumed: {code}", code=code)


class RunNotFoundError(DurableError, LookupError):
    """No run with this id exists in the client's namespace."""

    code = "not_found"


class ScheduleExistsError(DurableError, ValueError):
    """``create_schedule`` named a schedule that exists, without ``replace=True`` (SPEC §5d)."""

    code = "schedule_exists"


class ScheduleNotFoundError(DurableError, LookupError):
    """No schedule with this id exists in the client's namespace (SPEC §5d)."""

    code = "not_found"


class ThrottleNotFoundError(DurableError, LookupError):
    """No throttle with this name exists in the client's namespace (SPEC §5e)."""

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
    """A step's producer (or a called task) raised, or its result broke a rule.

    ``error_type`` and ``message`` are the original exception's (the text
    says which step, too). A failure the engine itself found (a result that
    is not JSON, too large, a call that timed out) already names the step in
    its message, which is then the whole text: the contract gives it
    verbatim ("Step result must be a JSON value: <key>").
    """

    code = "step_failed"

    def __init__(self, key: str, error_type: str, message: str, *, found_by_engine: bool = False) -> None:
        super().__init__(message if found_by_engine else f"Step {key!r} failed: {error_type}: {message}")
        self.key = key
        self.error_type = error_type
        self.error_message = message
        self.found_by_engine = found_by_engine

    @property
    def message(self) -> str:
        return self.error_message


class ChildWorkflowFailed(StepFailed):
    """A child run (``ctx.child``, SPEC §5b) ended ``error`` or ``cancelled``.

    A ``StepFailed`` whose ``key`` is the call's key and whose ``error_type``
    is ``"ChildWorkflowFailed"``; ``child_run_id``, ``child_status`` and
    ``child_reason`` say which child and how it ended, and the message names
    them with the child's own error. Like a failed step, it is not cached
    across attempts: a resumed parent looks at the child again.
    """

    code = "child_workflow_failed"

    def __init__(self, key: str, child_run_id: str, child_status: str, child_reason: str | None, message: str) -> None:
        super().__init__(key, "ChildWorkflowFailed", message, found_by_engine=True)
        self.child_run_id = child_run_id
        self.child_status = child_status
        self.child_reason = child_reason


class CompensationFailed(StepFailed):
    """One or more compensations of a saga raised (SPEC §5c).

    Raised after the last compensation ran, with the exception that started
    the compensation as ``__cause__``. ``failures`` lists each one that
    raised, in the order they ran: ``{"key", "error_type", "message"}``,
    ``error_type`` being the compensation's own exception type; ``key`` is
    the first of them.
    """

    code = "compensation_failed"

    def __init__(self, failures: list[dict[str, str]]) -> None:
        detail = "; ".join(f"{f['key']}: {f['error_type']}: {f['message']}" for f in failures)
        message = f"Compensation failed: {detail}"
        super().__init__(failures[0]["key"] if failures else "", "CompensationFailed", message, found_by_engine=True)
        self.failures = failures


class NonDeterminismError(DurableError):
    """Replay asked for calls in an order the journal contradicts."""

    code = "nondeterminism"


class StorageError(DurableError):
    """The journal store failed: catch this for either of its two kinds."""


class StorageUnavailableError(StorageError):
    """Redis could not be reached (or not in time); the same call can succeed later."""

    code = "workflow_storage_unavailable"


class StorageCorruptError(StorageError):
    """Redis answered with data that is not what celery-durable wrote."""

    code = "workflow_storage_corrupt"


class StaleAttemptError(DurableError):
    """This attempt lost execution authority: a newer epoch owns the run.

    Raised when a fenced write is refused. It is fatal and is never shown as a
    run's error: the attempt that owns the run decides the run's fate.
    """

    code = "stale_attempt"


# -- classification: the one place that says which errors end what -------------------

EXECUTION_LOST: tuple[type[Exception], ...] = (StorageError, StaleAttemptError)
"""This execution cannot go on: the store failed, or a newer attempt owns the
run. Sticky inside a replay: once raised, every later call raises it again,
so workflow code that catches it with ``except Exception`` cannot journal
past it."""

FATAL_ERRORS: tuple[type[Exception], ...] = (
    WorkflowCancelled,
    WorkflowLimitReached,
    NonDeterminismError,
    *EXECUTION_LOST,
)
"""Errors that abort a whole ``parallel``/``pipeline`` instead of filling a slot."""


def fatal_from_code(code: str, message: str, detail: str = "") -> Exception:
    """Rebuild a fatal error journaled as a branch outcome, from its stable code.

    Codes, not class names, are what the journal keeps (``schema.Outcome``):
    a renamed class must not turn an old journal's cancellation into
    corruption. ``detail`` carries the one field an error needs beyond its
    message (the limit a ``WorkflowLimitReached`` names). An unknown code is
    corruption: the journal holds what this version did not write.
    """
    if code == WorkflowLimitReached.code:
        return WorkflowLimitReached(detail)
    rebuilt: tuple[type[DurableError], ...] = (
        WorkflowCancelled, NonDeterminismError, StorageUnavailableError, StorageCorruptError, StaleAttemptError
    )
    for cls in rebuilt:
        if cls.code == code:
            return cls(message)
    return StorageCorruptError(f"Journal holds a fatal outcome of unknown kind {code[:40]!r}: {message[:200]}")
