"""The coordinator task: one pass of deterministic replay over a run.

A pass holds the run's activation lock; an activation that arrives while a
pass runs sets the lock's wake flag instead of running beside it, and the
holder runs one more pass before it lets go (see ``release.lua``).
"""

from __future__ import annotations

import contextlib
import logging
import uuid
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from celery_durable.broker import Flags, RunRecord
from celery_durable.errors import StaleAttemptError, StorageCorruptError, StorageUnavailableError
from celery_durable.tasks.heartbeat import Heartbeat
from celery_durable.tasks.messages import BadMessage, parse_run_message
from celery_durable.workflows import passes
from celery_durable.workflows.passes import Settlement, main_pass
from celery_durable.workflows.replay import Replay

if TYPE_CHECKING:
    from celery_durable.engine import Engine
    from celery_durable.workflows.definition import Workflow

logger = logging.getLogger(__name__)


def run_coordinator_task(
    engine: Engine, *, task_id: str, run_id: Any, epoch: Any, workflow: Any, extra: dict[str, Any]
) -> None:
    try:
        message = parse_run_message(run_id, epoch, workflow, extra)
    except BadMessage as exc:
        logger.error("rejected coordinator message: %s", exc)
        return
    store = engine.store
    try:
        record = store.load_run(message.run_id)
    except StorageCorruptError as exc:
        logger.error("run %s: not executed, its record is corrupt: %s", message.run_id, exc)
        return
    if record is None or record.epoch != message.epoch or record.workflow != message.workflow:
        engine.count_refused()
        logger.warning("refused stale or forged coordinator message for run %s", message.run_id)
        return
    definition = engine.workflows.get(record.workflow)
    if definition is None:
        settle_unknown_workflow(engine, record)
        return
    # The lock token is the task id, so a message redelivered after its worker
    # died re-enters its own lock instead of waiting for it to expire.
    token = task_id or uuid.uuid4().hex
    try:
        activation = store.activate(record.run_id, record.epoch, token, record.namespace)
    except StaleAttemptError:
        return
    if isinstance(activation, int):
        # Another pass holds the lock and was told to run once more. Should
        # that pass be dead, its lock expires: look again then.
        engine.send_coordinator(record.run_id, record.epoch, record.workflow, countdown=activation / 1000 + 0.1)
        return
    # One dispatch token per execution: a fan-out dispatched by an execution
    # that died halfway through sending is sent again by the next one.
    execution = uuid.uuid4().hex
    replay = _new_replay(engine, record, definition, execution)
    replay.apply_flags(activation)
    with Heartbeat(store, replay, token=token, interval=engine.heartbeat_interval):
        while True:
            try:
                _one_pass(engine, replay)
                if replay.rerun:
                    engine.send_coordinator(record.run_id, record.epoch, record.workflow)
            except StaleAttemptError:
                logger.info("run %s: attempt %s lost authority", record.run_id, record.epoch)
                return
            except StorageUnavailableError as exc:
                # Nothing can be written now. The task retries with backoff
                # under the same id, so it re-enters its own lock.
                logger.warning("run %s: storage unavailable during a pass, retrying: %s", record.run_id, exc)
                raise
            except StorageCorruptError as exc:
                _settle_corrupt(engine, record, exc)
                return
            if not store.release(record.run_id, token, record.epoch):
                return
            fresh = store.load_run(record.run_id)
            if fresh is None or fresh.epoch != record.epoch:
                return
            replay = _new_replay(engine, fresh, definition, execution)
            replay.apply_flags(Flags(cancel=fresh.cancel_requested, pause=fresh.pause_requested))


def _new_replay(engine: Engine, record: RunRecord, definition: Workflow, execution: str) -> Replay:
    settings = engine.settings

    def send(call: str, indices: Sequence[int]) -> list[str]:
        return engine.send_branches(record.run_id, record.epoch, record.workflow, call, indices)

    def send_agent(agent: str, owner: str, task_id: str) -> None:
        engine.send_agent(record.run_id, record.epoch, record.workflow, agent, owner, task_id=task_id)

    return Replay(
        journal=engine.store.journal(record.run_id, record.epoch, record.namespace),
        run=record,
        workflow=definition,
        max_fanout=settings.max_fanout,
        max_payload_bytes=settings.max_payload_bytes,
        send_branches=send,
        token=execution,
        send_agent=send_agent,
    )


def _one_pass(engine: Engine, replay: Replay) -> None:
    settlement = main_pass(replay)
    if settlement is not None:
        _finish(engine, replay.run, settlement)


def _finish(engine: Engine, record: RunRecord, settlement: Settlement) -> None:
    engine.store.finish(
        record.run_id,
        record.epoch,
        record.namespace,
        settlement.status,
        reason=settlement.reason,
        error=settlement.error,
        can_resume=settlement.can_resume,
        result_json=settlement.result_json,
        message=settlement.message,
    )


def _settle_corrupt(engine: Engine, record: RunRecord, exc: StorageCorruptError) -> None:
    """Stop a run whose journal holds what celery-durable did not write.

    Resumable: once the entry is repaired (or deleted, so that its op runs
    again), ``resume_workflow`` replays the run from its journal.
    """
    logger.error("run %s: storage corrupt, the run stops: %s", record.run_id, exc)
    try:
        _finish(engine, record, passes.corrupt(exc))
    except (StaleAttemptError, StorageCorruptError, StorageUnavailableError) as again:
        # The run record itself cannot take the write: nothing more to do here;
        # the recovery sweep looks at the run again when its lease runs out.
        logger.error("run %s: could not record the corruption: %s", record.run_id, again)


def settle_unknown_workflow(engine: Engine, record: RunRecord) -> None:
    """Stop a run this worker cannot execute, resumably, instead of dropping
    its message: a dropped message would leave the run to the recovery sweep,
    which could hand it straight back to a worker that does not know it."""
    error = f"Workflow {record.workflow!r} is not registered with this worker's engine"
    logger.error("run %s: %s", record.run_id, error)
    with contextlib.suppress(StaleAttemptError):
        engine.store.finish(
            record.run_id,
            record.epoch,
            record.namespace,
            "error",
            reason="unknown_workflow",
            error=error,
            can_resume=True,
            message=f"Run stopped: {error}",
        )
