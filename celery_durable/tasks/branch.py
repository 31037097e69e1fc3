"""The branch task: one thunk of a fan-out, on any worker of the fleet.

It replays the main body from the journal (every call a hit) until it reaches
its fan-out, runs its own thunk in the branch's sequence, journals the
outcome and, when it was the last one out, wakes the coordinator.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from celery_durable.errors import (
    FATAL_ERRORS,
    NonDeterminismError,
    StaleAttemptError,
    StorageCorruptError,
    StorageUnavailableError,
)
from celery_durable.tasks.coordinator import settle_unknown_workflow
from celery_durable.tasks.heartbeat import Heartbeat
from celery_durable.tasks.messages import BadMessage, parse_branches, parse_run_message
from celery_durable.workflows import outcomes
from celery_durable.workflows.context import WorkflowContext
from celery_durable.workflows.outcomes import Outcome
from celery_durable.workflows.replay import MAIN, BranchFinished, BranchTarget, Replay, Suspend

if TYPE_CHECKING:
    from celery_durable.engine import Engine

logger = logging.getLogger(__name__)


def run_branch_task(
    engine: Engine, *, run_id: Any, epoch: Any, workflow: Any, call: Any, branches: Any, extra: dict[str, Any]
) -> None:
    try:
        message = parse_run_message(run_id, epoch, workflow, extra)
        call_id, indices = parse_branches(call, branches)
    except BadMessage as exc:
        logger.error("rejected branch message: %s", exc)
        return
    store = engine.store
    record = store.load_run(message.run_id)
    if record is None or record.epoch != message.epoch or record.workflow != message.workflow:
        engine.count_refused()
        logger.warning("refused stale or forged branch message for run %s", message.run_id)
        return
    if record.status not in ("running", "paused"):
        return
    definition = engine.workflows.get(record.workflow)
    if definition is None:
        settle_unknown_workflow(engine, record)
        return

    def journal(index: int, outcome: Outcome) -> None:
        if store.complete_branch(record.run_id, record.epoch, call_id, index, outcome.encode()):
            engine.send_coordinator(record.run_id, record.epoch, record.workflow)

    replay = Replay(
        store=store,
        run=record,
        workflow=definition,
        epoch=record.epoch,
        max_fanout=engine.settings.max_fanout,
        max_payload_bytes=engine.settings.max_payload_bytes,
        target=BranchTarget(call_id, indices, journal),
        send_agent=functools.partial(engine.send_agent, record.run_id, record.epoch, record.workflow),
    )
    try:
        # Beat at once: a branch that waited in a busy queue renews the lease
        # of its run as soon as it starts, not one interval later.
        replay.apply_flags(store.heartbeat(record.run_id, record.epoch))
        with Heartbeat(store, replay, interval=engine.heartbeat_interval):
            _run_to_branches(replay, journal)
    except StaleAttemptError:
        engine.count_refused()
        logger.info("run %s: branches %s of %s belong to an older attempt", record.run_id, indices, call_id)
    except StorageUnavailableError as exc:
        logger.warning("run %s: storage unavailable in branches of %s, retrying: %s", record.run_id, call_id, exc)
        raise  # the task retries with backoff (tasks/app.py)
    except StorageCorruptError as exc:
        # The branch cannot journal its outcome. Wake the coordinator rather
        # than leave the run waiting a lease for the sweep: its pass meets the
        # same damage and stops the run as workflow_storage_corrupt.
        logger.error("run %s: storage corrupt in branches %s of %s: %s", record.run_id, indices, call_id, exc)
        engine.send_coordinator(record.run_id, record.epoch, record.workflow)


def _run_to_branches(replay: Replay, journal: Callable[[int, Outcome], None]) -> None:
    """Replay the main body up to the fan-out, where the target's thunks run.

    A replay that fails or ends before it gets there is a divergence from the
    coordinator's history: every target branch gets a fatal outcome, which
    wakes the coordinator to stop the run.
    """
    assert replay.target is not None
    cursor = replay.open_cursor(MAIN, writes=False)
    try:
        replay.run_in(cursor, lambda: replay.workflow.run(WorkflowContext(replay)))
    except BranchFinished:
        return
    except (StaleAttemptError, StorageUnavailableError):
        raise
    except Suspend:
        raise StaleAttemptError("branch replay reached an unfinished fan-out") from None
    except FATAL_ERRORS as exc:
        error: Exception = exc
    except Exception as exc:
        # Not necessarily a divergence: a volatile step before the fan-out
        # may have failed this time. An ordinary failure, retried on resume.
        failure = RuntimeError(
            f"Replaying the main body for fan-out {replay.target.call} raised {type(exc).__name__}: {exc}"
        )
        for index in replay.target.indices:
            journal(index, outcomes.failure(replay.epoch, failure))
        return
    else:
        error = NonDeterminismError(
            f"Replaying the main body for fan-out {replay.target.call} returned before reaching it; "
            "check that your workflow is deterministic"
        )
    for index in replay.target.indices:
        journal(index, outcomes.failure(replay.epoch, error, fatal=True))
