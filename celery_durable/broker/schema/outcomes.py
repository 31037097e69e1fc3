"""Outcomes: how a step's, a branch's, an agent turn's or a call's result is journaled.

``o<json>`` a value; ``e<epoch>|<json>`` an ordinary failure and
``f<epoch>|<json>`` a fatal one, tagged with the attempt that saw them, so
failures replay identically within that attempt and are retried after it
(SPEC §4). One-character tags let Lua tell them apart without decoding JSON.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from typing import Any

from celery_durable.errors import (
    ChildWorkflowFailed,
    StepFailed,
    StorageCorruptError,
    WorkflowLimitReached,
    fatal_from_code,
)

_dumps = functools.partial(json.dumps, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
"""Compact, exact JSON, as ``workflows.jsonvalue.dumps`` writes it; values
reach this module already checked and plain (no ``JSON_NULL``)."""



@dataclass(frozen=True, slots=True)
class Outcome:
    """A journaled outcome: a value, or a failure tagged with its attempt.

    ``error_type`` is the original exception's class name for an ordinary
    failure and the error's stable code for a fatal one; ``detail`` is the
    one extra field a fatal error needs (the limit's name).
    """

    kind: str  # "o" value, "e" ordinary failure, "f" fatal failure
    epoch: int
    value: Any = None
    error_type: str = ""
    message: str = ""
    found_by_engine: bool = False
    detail: str = ""
    key: str = ""
    """For a failure that was a ``StepFailed`` (a branch's too): the step's key,
    so a fan-out slot can give the failure back as it was raised."""
    origin: str = ""
    """For any other failure of a type that is not a builtin: where the type
    is defined (``module:qualname``), so a fan-out slot can give back the
    thunk's own exception."""
    args: tuple[Any, ...] | None = None
    """For any other failure: the exception's arguments, where they are JSON
    values and say more than its message (``KeyError('k')``, two arguments),
    so the exception a slot gives back is built as it was raised."""

    def is_live(self, epoch: int) -> bool:
        """A value always is; a failure only within the attempt that saw it."""
        return self.kind == "o" or self.epoch == epoch

    def encode(self) -> str:
        if self.kind == "o":
            return "o" + _dumps(self.value)
        body: dict[str, Any] = {"type": self.error_type, "message": self.message}
        if self.found_by_engine:
            body["engine"] = True
        if self.detail:
            body["detail"] = self.detail
        if self.key:
            body["key"] = self.key
        if self.origin:
            body["class"] = self.origin
        if self.args is not None:
            body["args"] = list(self.args)
        return f"{self.kind}{self.epoch}|{_dumps(body)}"

    def step_result(self, key: str) -> Any:
        """The value, or the failure raised as the workflow sees it."""
        if self.kind == "o":
            return self.value
        if self.kind == "f":
            raise self.fatal_error()
        raise StepFailed(key, self.error_type, self.message, found_by_engine=self.found_by_engine)

    def fatal_error(self) -> Exception:
        return fatal_from_code(self.error_type, self.message, self.detail)

    @property
    def result(self) -> Any:
        """What a branch, an agent turn or a fan-out slot yields: the value, or None for a failure."""
        return self.value if self.kind == "o" else None


def value_outcome(result: Any) -> Outcome:
    """A value outcome of a plain JSON value (already checked; ``JSON_NULL`` already None)."""
    return Outcome("o", 0, value=result)


def failure_outcome(epoch: int, error: BaseException, *, fatal: bool = False) -> Outcome:
    """An exception as a journaled failure: a fatal one by its stable code."""
    if fatal:
        code = getattr(error, "code", None) or type(error).__name__
        detail = error.limit if isinstance(error, WorkflowLimitReached) else ""
        return Outcome("f", epoch, error_type=str(code), message=str(error), detail=detail)
    if isinstance(error, ChildWorkflowFailed):
        detail = _dumps({"run_id": error.child_run_id, "status": error.child_status, "reason": error.child_reason})
        return Outcome(
            "e", epoch, error_type=error.error_type, message=error.error_message, found_by_engine=True,
            detail=detail, key=error.key,
        )
    if isinstance(error, StepFailed):
        return Outcome(
            "e", epoch, error_type=error.error_type, message=error.error_message, found_by_engine=error.found_by_engine,
            key=error.key,
        )
    kind = type(error)
    origin = "" if kind.__module__ == "builtins" else f"{kind.__module__}:{kind.__qualname__}"
    message = str(error)
    return Outcome("e", epoch, error_type=kind.__name__, message=message, origin=origin, args=_own_args(error, message))


def _own_args(error: BaseException, message: str) -> tuple[Any, ...] | None:
    """``error.args`` where rebuilding from the message alone would change them."""
    if error.args == (message,):
        return None
    try:
        _dumps(list(error.args))
    except (TypeError, ValueError):
        return None
    return tuple(error.args)


def decode_outcome(raw: str) -> Outcome:
    try:
        kind = raw[0]
        if kind == "o":
            return Outcome("o", 0, value=json.loads(raw[1:]))
        if kind in ("e", "f"):
            epoch, body = raw[1:].split("|", 1)
            data = json.loads(body)
            return Outcome(
                kind,
                int(epoch),
                error_type=str(data["type"]),
                message=str(data["message"]),
                found_by_engine=bool(data.get("engine", False)),
                detail=str(data.get("detail", "")),
                key=str(data.get("key", "")),
                origin=str(data.get("class", "")),
                args=tuple(data["args"]) if isinstance(data.get("args"), list) else None,
            )
    except (IndexError, ValueError, KeyError, TypeError):
        pass
    raise StorageCorruptError(f"Journal entry is not an outcome celery-durable wrote: {raw[:80]!r}")
