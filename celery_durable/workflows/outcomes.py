"""How a step's or a branch's outcome is written in the journal.

``o<json>`` is a value; ``e<epoch>|<json>`` an ordinary failure and
``f<epoch>|<json>`` a fatal one, both tagged with the attempt that saw them:
failures replay identically within that attempt and are retried after it
(SPEC §4). The tags are one character so the Lua side can tell them apart
without decoding JSON.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from celery_durable.errors import (
    NonDeterminismError,
    StaleAttemptError,
    StepFailed,
    StorageCorruptError,
    StorageUnavailableError,
    WorkflowCancelled,
    WorkflowLimitReached,
)
from celery_durable.workflows import jsonvalue

_FATAL_TYPES: dict[str, type[Exception]] = {
    cls.__name__: cls
    for cls in (WorkflowCancelled, NonDeterminismError, StorageUnavailableError, StorageCorruptError, StaleAttemptError)
}


def _limit_reached(message: str) -> Exception:
    return WorkflowLimitReached(message.rsplit(" ", 1)[-1])


_FATAL_BUILDERS = {"WorkflowLimitReached": _limit_reached}


@dataclass(frozen=True, slots=True)
class Outcome:
    kind: str  # "o" value, "e" ordinary failure, "f" fatal failure
    epoch: int
    value: Any = None
    error_type: str = ""
    message: str = ""

    def is_live(self, epoch: int) -> bool:
        """A value always is; a failure only within the attempt that saw it."""
        return self.kind == "o" or self.epoch == epoch

    def encode(self) -> str:
        if self.kind == "o":
            return "o" + jsonvalue.dumps(self.value)
        body = jsonvalue.dumps({"type": self.error_type, "message": self.message})
        return f"{self.kind}{self.epoch}|{body}"

    def step_result(self, key: str) -> Any:
        """The value, or the failure raised as the workflow sees it."""
        if self.kind == "o":
            return self.value
        if self.kind == "f":
            raise self.fatal_error()
        raise StepFailed(key, self.error_type, self.message)

    def fatal_error(self) -> Exception:
        builder = _FATAL_BUILDERS.get(self.error_type)
        if builder is not None:
            return builder(self.message)
        return _FATAL_TYPES.get(self.error_type, StorageCorruptError)(self.message)


def value(result: Any) -> Outcome:
    return Outcome("o", 0, value=None if result is jsonvalue.JSON_NULL else result)


def failure(epoch: int, error: BaseException, *, fatal: bool = False) -> Outcome:
    error_type = type(error).__name__
    message = error.error_message if isinstance(error, StepFailed) else str(error)
    return Outcome("f" if fatal else "e", epoch, error_type=error_type, message=message)


def decode(raw: str) -> Outcome:
    try:
        kind = raw[0]
        if kind == "o":
            return Outcome("o", 0, value=jsonvalue.loads(raw[1:]))
        if kind in ("e", "f"):
            epoch, body = raw[1:].split("|", 1)
            data = jsonvalue.loads(body)
            return Outcome(kind, int(epoch), error_type=str(data["type"]), message=str(data["message"]))
    except (IndexError, ValueError, KeyError, TypeError):
        pass
    raise StorageCorruptError(f"Journal entry is not an outcome celery-durable wrote: {raw[:80]!r}")
