"""Task calls on the fleet's side: publishing a called task, and its answer.

A called task is the user's own; it runs wherever Celery sends it, on a
worker that may know nothing of celery-durable. It answers through Celery's
own callbacks: ``link`` sends its return value to ``celery_durable.call_result``
on the coordinator queue, ``link_error`` reaches ``celery_durable.call_failed``
— in place, with the exception, on a worker that has the engine's tasks, or
as a message with only the failed task's id on one that does not (Celery's
old-style errback), when the exception is read from the app's result backend
if it has one. Both carry the run, the epoch that published the call and its
key; the answer is journaled fenced by that epoch (``call_done.lua``), so a
stale attempt's answer changes nothing, and what waits for the call is woken:
a main body, by its next pass run right there (the answer came on the
coordinator queue), a branch by a message to its branch task.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from celery import Celery

from celery_durable.broker import RunRecord, now_ms, schema
from celery_durable.errors import StaleAttemptError, StepFailed
from celery_durable.tasks.app import CALL_FAILED_TASK, CALL_RESULT_TASK, new_task_id
from celery_durable.tasks.coordinator import run_coordinator_task
from celery_durable.tasks.messages import BadMessage, parse_run_message
from celery_durable.tasks.retrying import retry_storage
from celery_durable.workflows.calls import CallRequest, failure_error, result_outcome

if TYPE_CHECKING:
    from celery_durable.engine import Engine

logger = logging.getLogger(__name__)


def publish_call(app: Celery, engine: Engine, record: RunRecord, request: CallRequest) -> None:
    """Send the called task, linked to the engine's answer tasks."""
    fields = {"run_id": record.run_id, "epoch": record.epoch, "workflow": record.workflow, "key": request.key}
    queue = engine.settings.coordinator_queue
    answer = {**fields, "task_name": request.task_name}
    link = app.signature(CALL_RESULT_TASK, kwargs=answer, queue=queue, serializer="json")
    link_error = app.signature(CALL_FAILED_TASK, kwargs=answer, queue=queue, serializer="json")
    app.send_task(
        request.task_name,
        args=request.args,
        kwargs=request.kwargs,
        task_id=request.task_id,
        queue=request.queue,
        link=link,
        link_error=link_error,
        serializer="json",
        **request.options,
    )


def call_succeeded(engine: Engine, args: tuple[Any, ...], fields: dict[str, Any]) -> None:
    """The called task returned ``args[0]``: journal it as the call's outcome."""
    try:
        run_id, epoch, workflow, key, _ = _parse(fields)
        if len(args) != 1:
            raise BadMessage(f"expected the task's result as the one positional argument, got {len(args)}")
    except BadMessage as exc:
        logger.error("rejected call result message: %s", exc)
        return
    outcome = result_outcome(key, args[0], epoch, engine.settings.max_payload_bytes)
    _journal(engine, run_id, epoch, workflow, key, outcome, inline=True)


def call_failed(engine: Engine, args: tuple[Any, ...], fields: dict[str, Any]) -> None:
    """The called task raised: in place ``(request, exception, traceback)``,
    or by message ``(task_id,)`` from a worker without the engine's tasks."""
    try:
        run_id, epoch, workflow, key, task = _parse(fields)
    except BadMessage as exc:
        logger.error("rejected call error message: %s", exc)
        return
    if len(args) == 3 and isinstance(args[1], BaseException):
        error_type, message = type(args[1]).__name__, str(args[1])
    elif len(args) == 1 and isinstance(args[0], str):
        error_type, message = _stored_exception(engine, args[0], task)
    else:
        logger.error("rejected call error message for run %s: unexpected arguments %.80r", run_id, args)
        return
    outcome = schema.failure_outcome(epoch, StepFailed(key, error_type, message))
    _journal(engine, run_id, epoch, workflow, key, outcome)


def _stored_exception(engine: Engine, task_id: str, task: str) -> tuple[str, str]:
    """The exception of a failed task, as the app's result backend keeps it."""
    backend = engine.celery.backend
    if type(backend).__name__ == "DisabledBackend":
        return (
            "TaskFailed",
            f"Task {task} failed on a worker that has not celery-durable's tasks, and the Celery app has no "
            "result backend to tell its exception (configure one, or mount the engine on the app that worker runs)",
        )
    try:
        meta = backend.get_task_meta(task_id)
        error = backend.exception_to_python(meta.get("result"))
    except Exception as exc:  # a backend's own errors have no common base
        return "TaskFailed", f"Task {task} failed; its exception could not be read from the result backend: {exc}"
    if isinstance(error, BaseException):
        return type(error).__name__, str(error)
    return "TaskFailed", f"Task {task} failed: {error!r:.200}"


def _journal(
    engine: Engine, run_id: str, epoch: int, workflow: str, key: str, outcome: schema.Outcome, *, inline: bool = False
) -> None:
    """Journal the call's answer and continue what waited for it.

    ``inline``: this task came on the coordinator queue, so a main body woken
    by it runs its next pass here, under the wake's task id, instead of
    sending that as one more message (a call's round trip was three
    messages; this makes it two). An errback called in place runs on the
    called task's own worker (a GPU pool, say), which must not run workflow
    code: it sends.
    """
    error = failure_error(outcome)
    prefix = new_task_id()

    def write() -> list[str] | None:
        return engine.store.call_done(run_id, epoch, key, outcome.encode(), error, prefix)

    try:
        owners = retry_storage(f"run {run_id}: the answer of call {key!r}", write)
    except StaleAttemptError:
        engine.count_refused()
        logger.info("run %s: the answer of call %r belongs to an older attempt; refused", run_id, key)
        return
    here: str | None = None
    for n, owner in enumerate(owners or [], start=1):
        if inline and owner == schema.MAIN and workflow in engine.workflows:
            here = f"{prefix}-{n}"
        else:
            engine.wake(run_id, epoch, workflow, owner, f"{prefix}-{n}")
    if owners:
        engine.store.schedule_check(run_id, now_ms() + engine.store.lease_ms)
    if here is not None:
        run_coordinator_task(engine, task_id=here, run_id=run_id, epoch=epoch, workflow=workflow, extra={})


def _parse(fields: dict[str, Any]) -> tuple[str, int, str, str, str]:
    known = {name: fields.pop(name, None) for name in ("key", "task_name")}
    key, task = known["key"], known["task_name"]
    run_id, epoch, workflow = (fields.pop(name, None) for name in ("run_id", "epoch", "workflow"))
    message = parse_run_message(run_id, epoch, workflow, fields)
    if not isinstance(key, str) or not key:
        raise BadMessage(f"key is not a call key: {key!r:.80}")
    if not isinstance(task, str):
        raise BadMessage(f"task is not a task name: {task!r:.80}")
    return message.run_id, message.epoch, message.workflow, key, task
