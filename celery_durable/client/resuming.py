"""Taking execution authority of a run (``Client.resume_workflow``).

Kept apart from the client because it is one decision with its own failure
vocabulary: whether the code may change under the run, whether the old
attempt still looks alive, and which ``WorkflowResumeError`` code each
refusal or storage failure becomes (SPEC §8).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from celery_durable import telemetry
from celery_durable.broker import RunRecord
from celery_durable.client.run_views import refuse_same_divergence, resume_verdict
from celery_durable.errors import (
    RunNotFoundError,
    StorageCorruptError,
    StorageUnavailableError,
    WorkflowResumeError,
)
from celery_durable.workflows import jsonvalue
from celery_durable.workflows.limits import ceilings_argument, merge_limits

if TYPE_CHECKING:
    from celery_durable.engine import Engine

TRIES = 5
"""A run that changes this many times between its read and the resume is left alone (``already_active``)."""


def take_authority(
    engine: Engine,
    record: RunRecord,
    limits: dict[str, Any] | None,
    message: str,
    *,
    force: bool,
    allow_code_change: bool,
    reload: Callable[[str], RunRecord],
    alive: Callable[[RunRecord], bool],
) -> int:
    """The run's new epoch, its first coordinator message ``message`` counted in flight."""
    for _ in range(TRIES):
        definition = engine.workflows.get(record.workflow)
        if definition is None:
            raise WorkflowResumeError(
                f"Workflow {record.workflow!r} is not registered with this engine", code="non_resumable"
            )
        refuse_same_divergence(record, definition.code_hash)
        # The run's state first: a completed run is non_resumable whatever
        # its code, and allow_code_change=True must not be suggested for it.
        running = record.status in ("pending", "running") and alive(record)
        note = resume_verdict(record, alive=running, force=force)
        if definition.code_hash != record.code_hash and not allow_code_change:
            raise WorkflowResumeError(
                f"Workflow {record.workflow!r} code changed since run {record.run_id} started "
                "(pass allow_code_change=True to resume it with the new code)",
                code="workflow_code_changed",
            )
        merged = merge_limits(record.limits, limits)
        epoch = engine.store.resume(
            record,
            limits_json=jsonvalue.dumps(merged),
            message=note,
            code_hash="",  # the run keeps the hash it started with; its passes note theirs
            message_id=message,
            ceilings=ceilings_argument(merged),
            trace_attempt=telemetry.resume_traceparent(),  # the resuming caller's span, if any
        )
        if epoch is not None:
            return epoch
        record = reload(record.run_id)
    raise WorkflowResumeError(f"Run {record.run_id} kept changing while resuming it", code="already_active")


@contextmanager
def resume_errors() -> Iterator[None]:
    """Resume reports every failure as a ``WorkflowResumeError`` with its code."""
    try:
        yield
    except RunNotFoundError as exc:
        raise WorkflowResumeError(str(exc), code="not_found") from None
    except StorageUnavailableError as exc:
        raise WorkflowResumeError(str(exc), code="workflow_storage_unavailable") from None
    except StorageCorruptError as exc:
        raise WorkflowResumeError(str(exc), code="workflow_storage_corrupt") from None
