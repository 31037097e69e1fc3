"""What clients see of a run: the envelope, pages of runs and of progress."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from datetime import UTC, datetime
from typing import Any, cast

from celery_durable.broker import TERMINAL_STATUSES, ProgressRecord, RunRecord


def is_terminal_status(status: str) -> bool:
    """True for every status but ``pending`` and ``running``: a paused run has settled."""
    return status in TERMINAL_STATUSES


def from_ms(value: int | None) -> datetime | None:
    return datetime.fromtimestamp(value / 1000, tz=UTC) if value is not None else None


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


def _json_field(value: Any) -> Any:
    """A row's field as JSON: datetimes as ISO 8601 text, rows by their own ``to_dict``."""
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, list):
        return [_json_field(item) for item in value]
    return value.to_dict() if isinstance(value, _Row) else value


class _Row:
    """A row whose JSON form is its fields, in order, as ``_json_field`` writes them."""

    __slots__ = ()

    def to_dict(self) -> dict[str, Any]:
        return {item.name: _json_field(getattr(self, item.name)) for item in fields(cast(Any, self))}


def _waiting_for(record: RunRecord) -> dict[str, Any] | None:
    """SPEC §5: {"kind", "name", "until"}, ``until`` ISO 8601 text or None; only
    while running, or pending for a throttle's slot (SPEC §5e)."""
    waiting = record.waiting_for
    if waiting is None:
        return None
    if record.status != "running" and not (record.status == "pending" and waiting["kind"] == "throttle"):
        return None
    return {"kind": waiting["kind"], "name": waiting["name"], "until": _iso(from_ms(waiting["until"]))}


@dataclass(frozen=True, slots=True)
class RunEnvelope:
    """The durable state of one run, as the seed API's envelope."""

    run_id: str
    workflow: str
    namespace: str
    status: str
    reason: str | None
    error: str | None
    can_resume: bool
    attempt: int
    args: Any
    limits: dict[str, Any]
    has_result: bool
    result: Any
    snapshot: dict[str, Any]
    created_at: datetime | None
    started_at: datetime | None
    finished_at: datetime | None
    parent_run_id: str | None = None
    """The run that started this one with ``ctx.child``/``ctx.start_child`` (SPEC §5b)."""
    schedule_id: str | None = None
    """The schedule whose tick started this run (SPEC §5d)."""
    scheduled_at: datetime | None = None
    """That tick, an aware UTC datetime."""

    @classmethod
    def from_record(cls, record: RunRecord, snapshot_extra: dict[str, Any] | None = None) -> RunEnvelope:
        snapshot: dict[str, Any] = {
            "phase": record.phase,
            "steps_done": record.steps_done,
            "steps_running": record.steps_running,
            "agents_done": record.agents_done,
            "agents_running": record.agents_running,
            "subagents_used": record.subagents_used,
            "ai_credits": record.credits_nano / 1e9,
            "waiting_for": _waiting_for(record),
        }
        snapshot.update(snapshot_extra or {})
        return cls(
            run_id=record.run_id,
            workflow=record.workflow,
            namespace=record.namespace,
            status=record.status,
            reason=None if record.status == "completed" else record.reason,
            error=record.error,
            can_resume=record.can_resume and record.status != "running",
            attempt=record.attempt,
            args=record.args,
            limits=record.limits,
            has_result=record.has_result,
            result=record.result,
            snapshot=snapshot,
            created_at=from_ms(record.created_at),
            started_at=from_ms(record.started_at),
            finished_at=from_ms(record.finished_at),
            parent_run_id=record.parent_run_id,
            schedule_id=record.schedule_id,
            scheduled_at=from_ms(record.scheduled_at),
        )

    @property
    def is_terminal(self) -> bool:
        return is_terminal_status(self.status)

    def to_dict(self) -> dict[str, Any]:
        """The JSON form; ``result`` is present only when the run has one (JSON null included)."""
        data: dict[str, Any] = {
            "run_id": self.run_id,
            "workflow": self.workflow,
            "namespace": self.namespace,
            "status": self.status,
            "reason": self.reason,
            "error": self.error,
            "can_resume": self.can_resume,
            "attempt": self.attempt,
            "args": self.args,
            "limits": self.limits,
            "has_result": self.has_result,
            "snapshot": self.snapshot,
            "created_at": _iso(self.created_at),
            "started_at": _iso(self.started_at),
            "finished_at": _iso(self.finished_at),
            "parent_run_id": self.parent_run_id,
            "schedule_id": self.schedule_id,
            "scheduled_at": _iso(self.scheduled_at),
        }
        if self.has_result:
            data["result"] = self.result
        return data


@dataclass(frozen=True, slots=True)
class RunPage:
    """One page of a namespace's runs, newest first.

    ``corrupt`` lists runs of the page whose stored record cannot be read
    (each ``{"run_id", "code": "workflow_storage_corrupt", "error"}``): one
    damaged run is reported, not allowed to hide the others.
    """

    runs: list[RunEnvelope]
    next_cursor: str | None
    corrupt: list[dict[str, str]] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class ProgressEntry(_Row):
    seq: int
    kind: str
    phase_id: str | None
    message: str
    attempt: int
    at: datetime

    @classmethod
    def from_record(cls, record: ProgressRecord) -> ProgressEntry:
        at = from_ms(record.at)
        assert at is not None
        return cls(record.seq, record.kind, record.phase_id, record.message, record.attempt, at)



@dataclass(frozen=True, slots=True)
class ProgressPage(_Row):
    records: list[ProgressEntry]
    oldest_seq: int | None
    newest_seq: int | None
    has_more_older: bool
    has_more_newer: bool
    revision: int



@dataclass(frozen=True, slots=True)
class PhaseRow(_Row):
    phase_id: str
    title: str
    detail: str | None
    state: str
    started_at: datetime | None
    finished_at: datetime | None



@dataclass(frozen=True, slots=True)
class StepRow(_Row):
    """One journaled or running step: ``started_at``/``finished_at`` give its
    duration (``finished_at`` is None while it runs)."""

    key: str
    status: str
    attempt: int
    error: str | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None
    task: str | None = None
    """A task call's (``ctx.call``): the task's name; None for a step."""
    task_id: str | None = None
    """A task call's: the Celery task id it is sent with, the same on every attempt."""

    @property
    def duration_ms(self) -> int | None:
        if self.started_at is None or self.finished_at is None:
            return None
        return int((self.finished_at - self.started_at).total_seconds() * 1000)



@dataclass(frozen=True, slots=True)
class ChildRow(_Row):
    """One child run of a run (SPEC §5b): waited for (``ctx.child``) or
    detached (``ctx.start_child``); ``status`` None when it is gone (its
    retention ran out) or not created yet."""

    key: str
    run_id: str
    workflow: str
    status: str | None
    detached: bool = False


@dataclass(frozen=True, slots=True)
class RunDetail:
    run: RunEnvelope
    phases: list[PhaseRow]
    steps: list[StepRow]
    progress: list[ProgressEntry]
    agents: list[dict[str, Any]] = field(default_factory=list)
    children: list[ChildRow] = field(default_factory=list)
    started_code_hash: str = ""
    """The hash of the workflow code the run started with (SPEC §8a)."""
    last_attempt_code_hash: str = ""
    """The hash of the code its latest attempt ran: after a deploy, the new
    code's; for a run stopped on nondeterminism, the code that diverged."""

    def to_dict(self) -> dict[str, Any]:
        """The JSON form: the envelope's, and datetimes in agent rows as ISO 8601."""
        return {
            "run": self.run.to_dict(),
            "phases": [phase.to_dict() for phase in self.phases],
            "agents": [
                {name: _iso(value) if isinstance(value, datetime) else value for name, value in agent.items()}
                for agent in self.agents
            ],
            "steps": [step.to_dict() for step in self.steps],
            "progress": [record.to_dict() for record in self.progress],
            "children": [child.to_dict() for child in self.children],
            "started_code_hash": self.started_code_hash,
            "last_attempt_code_hash": self.last_attempt_code_hash,
        }
