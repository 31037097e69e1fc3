"""What the run detail and a resume read off a run's stored state (SPEC §3, §8).

The client and the in-process test environment (``celery_durable.testing``)
both show runs through these, so a run reads the same wherever it ran.
"""

from __future__ import annotations

from typing import Any

from celery_durable.broker import RunRecord, RunStore, schema
from celery_durable.broker.schema.profiles import ServedWorkflow
from celery_durable.errors import WorkflowResumeError
from celery_durable.workflows.calls import call_task_id
from celery_durable.workflows.definition import Workflow
from celery_durable.workflows.envelope import ChildRow, PhaseRow, StepRow, from_ms
from celery_durable.workflows.versions import last_code_hash


def phase_rows(definition: Workflow | ServedWorkflow, record: RunRecord) -> list[PhaseRow]:
    """Declared phases with their state: the current one active (done once the
    run completed), earlier ones done, the rest pending."""
    rows: list[PhaseRow] = []
    for phase in definition.phases:
        started, finished = record.phase_times.get(phase.phase_id, (None, None))
        if phase.phase_id == record.phase_id:
            state = "done" if record.status == "completed" else "active"
        else:
            state = "done" if started is not None else "pending"
        rows.append(PhaseRow(phase.phase_id, phase.title, phase.detail, state, from_ms(started), from_ms(finished)))
    return rows


def agent_row(raw: str) -> dict[str, Any]:
    """An agent row as SPEC §3 lists it, timestamps as aware datetimes."""
    row = schema.parse_agent_row(raw)
    row["started_at"] = from_ms(row["started_at"])
    row["completed_at"] = from_ms(row["completed_at"])
    return row


def step_rows_in_order(run_id: str, stored: dict[str, str]) -> list[StepRow]:
    """Stored step rows as the detail lists them: in the order they began, not the order they settled."""
    rows = [(key, schema.StepRow.parse(key, raw)) for key, raw in stored.items()]
    rows.sort(key=lambda pair: (pair[1].order(), pair[0]))
    return [_to_step_row(run_id, key, row) for key, row in rows]


def _to_step_row(run_id: str, key: str, row: schema.StepRow) -> StepRow:
    return StepRow(
        key=key,
        status=row.status,
        attempt=row.attempt,
        error=row.error,
        started_at=from_ms(row.started_at),
        finished_at=from_ms(row.finished_at),
        task=row.task,
        task_id=None if row.task is None else call_task_id(run_id, key),
    )


def refuse_same_divergence(record: RunRecord, registered: str) -> None:
    """A run stopped on nondeterminism is not resumed with the code that diverged
    (SPEC §8): the hash compared is that code's, not the one the run started
    with, so reverting the change that broke it is a way out."""
    if record.status == "error" and record.reason == "nondeterminism" and registered == last_code_hash(record):
        raise WorkflowResumeError(
            f"Run {record.run_id} stopped on nondeterminism; resuming the same code would fail the same way "
            f"(code hash {registered} diverged: deploy a fix, or the code the run started with)",
            code="non_resumable",
        )


def resume_verdict(record: RunRecord, *, alive: bool, force: bool) -> str:
    """The system message of an allowed resume; raises for a refused one (SPEC §8 table).
    A run stopped on nondeterminism was judged by ``refuse_same_divergence``."""
    status = record.status
    if status in ("completed", "cancelled"):
        raise WorkflowResumeError(f"Run {record.run_id} is {status} and cannot be resumed", code="non_resumable")
    if status in ("running", "pending"):
        if alive and not force:
            raise WorkflowResumeError(
                f"Run {record.run_id} is {status} and its attempt is alive (pass force=True to take over)",
                code="already_active",
            )
        return "Run taken over by force" if alive else "Run recovered after its attempt died"
    return f"Run resumed from {status}"


def child_rows(store: RunStore, record: RunRecord) -> list[ChildRow]:
    """The run's children, waited for and detached, with each one's status now
    (two round trips, whatever their number)."""
    entries = store.children(record.run_id)
    statuses = store.statuses([entry.run_id for entry in entries])
    return [
        ChildRow(entry.key, entry.run_id, entry.workflow, status, detached=not entry.waited_for)
        for entry, status in zip(entries, statuses, strict=True)
    ]
