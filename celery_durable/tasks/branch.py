"""The branch task: one thunk of a fan-out, on any worker of the fleet.

It replays the main body from the journal (every call a hit) until it reaches
its fan-out, or takes the thunks this process kept of it, runs its own thunk
in the branch's sequence, journals the outcome and, when it was the last one
out, wakes the coordinator. Its start (``RunStore.branch_start``) checks its
message against the run, counts it running and reads what the pass opens
first, in one round trip.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from typing import TYPE_CHECKING, Any

from celery_durable import telemetry
from celery_durable.broker import RunRecord, schema
from celery_durable.broker.replies.run import BranchStart
from celery_durable.broker.replies.shape import Refusal
from celery_durable.broker.schema import MAIN
from celery_durable.errors import StaleAttemptError, StorageCorruptError, StorageError
from celery_durable.tasks import flower_names
from celery_durable.tasks.app import new_task_id
from celery_durable.tasks.heartbeat import Heartbeat
from celery_durable.tasks.messages import BadMessage, RunMessage, knows, parse_branches, parse_run_message, pass_on
from celery_durable.tasks.port import execution
from celery_durable.tasks.retrying import retry_storage
from celery_durable.workflows.branch_work import BranchTarget, BranchWork
from celery_durable.workflows.branches import READ_AHEAD
from celery_durable.workflows.completion import CompletionRoute
from celery_durable.workflows.passes import branch_pass

if TYPE_CHECKING:
    from celery_durable.engine import Engine

logger = logging.getLogger(__name__)


def run_branch_task(
    engine: Engine,
    *,
    task_id: str,
    run_id: Any,
    epoch: Any,
    workflow: Any,
    call: Any,
    branches: Any,
    extra: dict[str, Any],
) -> None:
    try:
        message = parse_run_message(run_id, epoch, workflow, extra)
        call_id, indices = parse_branches(call, branches)
    except BadMessage as exc:
        logger.error("rejected branch message: %s", exc)
        return
    token = task_id or new_task_id()
    retry_storage(
        f"run {message.run_id}: branches {indices} of {call_id}",
        lambda: _run_branches(engine, message, call_id, indices, token),
    )


def _run_branches(engine: Engine, message: RunMessage, call_id: str, indices: tuple[int, ...], token: str) -> None:
    try:
        _branches(engine, message, call_id, indices, token)
    except StorageCorruptError as exc:
        # The branch cannot start (its start reads the sequences it opens)
        # or journal its outcome. Wake the coordinator rather than leave the
        # run waiting a lease for the sweep: its pass meets the same damage
        # and stops the run as workflow_storage_corrupt, in this attempt.
        logger.error("run %s: storage corrupt in branches %s of %s: %s", message.run_id, indices, call_id, exc)
        engine.send_coordinator(message.run_id, message.epoch, message.workflow)


def _branches(engine: Engine, message: RunMessage, call_id: str, indices: tuple[int, ...], token: str) -> None:
    store = engine.store
    if not knows(engine, message):

        def send_again(new: str, countdown: float) -> None:
            engine.send_branches(
                message.run_id, message.epoch, message.workflow, call_id, indices, task_ids=[new], countdown=countdown
            )

        pass_on(engine, message, token, "s", send_again)
        return
    kept = engine.kept_fanouts.get(message.run_id, message.epoch, call_id)
    started = _start(engine, message, call_id, indices, token, replays_body=kept is None)
    if started is None:
        return
    record = started.record

    run_journal = store.journal(record.run_id, record.epoch, record.namespace)

    wake = functools.partial(engine.wake_main, record)

    def hand_off(branches: list[int], tasks: int) -> bool:
        if store.steps_queue_busy():
            return False
        # Counted in flight first: the run must never look idle between the
        # two, and a redelivery of this message must know what it gave away.
        task_ids = [new_task_id() for _ in range(min(tasks, engine.settings.fanout_tasks, len(branches)))]
        run_journal.hand_off(call_id, token, branches, task_ids)
        try:
            engine.send_branches(
                record.run_id, record.epoch, record.workflow, call_id, branches, len(task_ids), task_ids
            )
        except Exception:
            # Refused by the broker (and forgotten, Engine._publish): no longer
            # given away, so this task runs them itself (BranchWork.tick).
            with contextlib.suppress(StorageError):
                run_journal.unsent([], call=call_id, giver=token)
            raise
        return True

    work = BranchWork(token, hand_off, engine.settings.branch_batch_ms / 1000)
    own = _OwnMessage(token, work)
    route = CompletionRoute(new_wake=new_task_id, send_wake=wake, ending=own.ending, ended=own.end)
    target = BranchTarget(call_id, indices, route, work, started)
    replay = execution(engine, record, "", target=target, keeps=kept is None)
    try:
        # Its message runs from now (branch_start): a branch that waited in a
        # busy queue renewed its run at once, not one interval later.
        replay.prime(started.sequences)
        replay.apply_flags(started.flags)
        try:
            with (
                Heartbeat(store, replay, token=token, interval=engine.heartbeat_interval, wake=wake),
                telemetry.task(replay, "branches", token),
            ):
                branch_pass(replay, kept)
            flower_names.announce(record.run_id, record.epoch, record.workflow, call_id, indices, replay.steps.ran)
        finally:
            # However it ends, its message is no longer in flight; an outage is
            # retried in place (retry_storage), under the same id.
            if not own.ended:
                _end_quietly(engine, record, token)
    except StaleAttemptError:
        engine.count_refused()
        logger.info("run %s: branches %s of %s belong to an older attempt", record.run_id, indices, call_id)


class _OwnMessage:
    """The task's message: the completion of its last branch ends it in the
    same script (``complete_branch``), unless it wakes the coordinator: the
    task then ends its message after the wake is sent, so a worker that dies
    in between leaves a lease to run out."""

    def __init__(self, token: str, work: BranchWork) -> None:
        self._token = token
        self._work = work
        self.ended = False

    def ending(self) -> str:
        """The message a completion journaled now ends: this one, with the task's last branch."""
        return self._token if self._work.finishing() else ""

    def end(self) -> None:
        self.ended = True


def _start(
    engine: Engine, message: RunMessage, call_id: str, indices: tuple[int, ...], token: str, *, replays_body: bool
) -> BranchStart | None:
    """Check the message against the run and count it running, reading what
    the task opens first: the main body's sequence when it replays the body
    to reach the fan-out, and its first branches'. None: refused."""
    seqs = [schema.branch_seq_of(call_id, j) for j in indices[:READ_AHEAD]]
    if replays_body:
        seqs.insert(0, MAIN)
    started = engine.store.branch_start(message.run_id, message.epoch, message.workflow, token, call_id, indices, seqs)
    if isinstance(started, Refusal):
        if started is not Refusal.SETTLED:
            engine.count_refused()
            logger.warning(
                "refused stale or forged branch message for run %s (%s): it is not one the run sent, "
                "or it was delivered again after it ended",
                message.run_id,
                started,
            )
        return None
    return started


def _end_quietly(engine: Engine, record: RunRecord, token: str) -> None:
    wake = new_task_id()
    with contextlib.suppress(StorageError):
        if engine.store.task_end(record.run_id, record.epoch, token, wake):
            engine.wake_main(record, wake)
