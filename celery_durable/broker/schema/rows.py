"""Step rows (``P:{R}:steps``/``running``) and agent rows (``P:{R}:agents``):
JSON objects the run detail lists; Lua changes only their ``status``."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from celery_durable.broker.schema.outcomes import Outcome, _dumps
from celery_durable.errors import StorageCorruptError

STEP_STATUSES = frozenset({"running", "completed", "failed", "interrupted"})


@dataclass(frozen=True, slots=True)
class StepRow:
    """What the run detail lists of one step: running, or how it settled."""

    status: str
    attempt: int
    started_at: int | None
    finished_at: int | None
    error: str | None
    op: str = ""
    """Where the step stands, "<seq>:<index>": it orders steps begun in the same ms."""
    task: str | None = None
    """A task call's (``ctx.call``): the task's name, for the run's history."""
    queue: str | None = None
    """A task call's: the queue it was sent to (None: the task's own route)."""

    def encode(self) -> str:
        """Defaults left out (attempt 1, no error): a run keeps a row per step,
        and at a thousand steps those bytes are most of its footprint."""
        row: dict[str, Any] = {"status": self.status}
        if self.attempt != 1:
            row["attempt"] = self.attempt
        row |= {"started_at": self.started_at, "finished_at": self.finished_at}
        if self.error is not None:
            row["error"] = self.error
        row["op"] = self.op
        if self.task is not None:
            row["task"] = self.task
        if self.queue is not None:
            row["queue"] = self.queue
        return _dumps(row)

    @classmethod
    def running(
        cls, attempt: int, now: int, op: str = "", *, task: str | None = None, queue: str | None = None
    ) -> StepRow:
        return cls("running", attempt, now, None, None, op, task, queue)

    def settled(self, outcome: Outcome, now: int) -> StepRow:
        if outcome.kind == "o":
            return StepRow("completed", self.attempt, self.started_at, now, None, self.op, self.task, self.queue)
        error = f"{outcome.error_type}: {outcome.message}"
        return StepRow("failed", self.attempt, self.started_at, now, error, self.op, self.task, self.queue)

    def order(self) -> tuple[int, int, tuple[int, ...]]:
        """Begun first, first: by start time, then by position (``op``), numerically."""
        seq, _, index = self.op.rpartition(":")
        position = tuple(int(part) for part in [*seq.split(".")[1:], index] if part.isdigit())
        return (self.started_at is None, self.started_at or 0, position)

    @classmethod
    def parse(cls, key: str, raw: str) -> StepRow:
        try:
            row = json.loads(raw)
            status = row["status"]
            if status not in STEP_STATUSES:
                raise ValueError(f"status {status!r}")
            return cls(
                status=status,
                attempt=int(row.get("attempt", 1)),
                started_at=optional_ms(row.get("started_at")),
                finished_at=optional_ms(row.get("finished_at")),
                error=None if row.get("error") is None else str(row["error"]),
                op=str(row.get("op") or ""),
                task=None if row.get("task") is None else str(row["task"]),
                queue=None if row.get("queue") is None else str(row["queue"]),
            )
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise StorageCorruptError(
                f"The row of step {key[:200]!r} is not one celery-durable wrote ({exc!r:.80}): {raw[:80]!r}"
            ) from None


def optional_ms(value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"time {value!r}")
    return int(value)


AGENT_STATUSES = frozenset({"queued", "running", "completed", "failed", "interrupted"})


def agent_row_key(agent_id: str, epoch: int) -> str:
    """One row per turn and attempt: a turn interrupted with its attempt keeps its row."""
    return f"{agent_id}@{epoch}"


def queued_agent_row(
    agent_id: str, label: str | None, model: str | None, attempt: int, now: int, task_id: str | None = None
) -> str:
    """``task_id``: the Celery task that runs the turn (the web view links it to Flower)."""
    return _dumps(
        {
            "agent_id": agent_id,
            "task_id": task_id,
            "label": label,
            "model": model,
            "status": "queued",
            "attempt": attempt,
            "queued_at": now,
            "started_at": None,
            "completed_at": None,
            "active_ms": 0,
            "usage": {"prompt_tokens": 0, "completion_tokens": 0, "ai_credits": 0.0},
            "error": None,
        }
    )


def finished_agent_row(
    current: str | None, *, failed: bool, started_at: int, completed_at: int, active_ms: int,
    usage: Mapping[str, Any], error: str | None,
) -> str:
    """The queued row of a turn, settled; the fields the turn did not change are kept."""
    try:
        row = json.loads(current) if current else {}
    except ValueError:
        row = {}
    if not isinstance(row, dict):
        row = {}
    row.update(
        status="failed" if failed else "completed",
        started_at=started_at,
        completed_at=completed_at,
        active_ms=active_ms,
        usage=dict(usage),
        error=error,
    )
    return _dumps(row)


def parse_agent_row(raw: str) -> dict[str, Any]:
    """An agent row as stored (timestamps in ms); corruption said as such."""
    try:
        row = json.loads(raw)
        if not isinstance(row, dict):
            raise TypeError("not an object")
        status = row.get("status")
        if status not in AGENT_STATUSES:
            raise ValueError(f"status {status!r}")
        usage = row.get("usage") or {}
        if not isinstance(usage, dict):
            raise TypeError("usage is not an object")
        return {
            "agent_id": row.get("agent_id"),
            "label": row.get("label"),
            "model": row.get("model"),
            "status": status,
            "started_at": optional_ms(row.get("started_at")),
            "completed_at": optional_ms(row.get("completed_at")),
            "active_ms": int(row.get("active_ms") or 0),
            "usage": usage,
            "error": row.get("error"),
            "attempt": row.get("attempt"),
            "task_id": row.get("task_id"),
        }
    except (ValueError, TypeError, AttributeError, OverflowError) as exc:
        raise StorageCorruptError(f"An agent row is not one celery-durable wrote: {exc!r:.200}") from None
