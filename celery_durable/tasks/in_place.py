"""Wakes that run where they are decided, instead of crossing the broker.

When a call's answer or an agent turn settles, what waited for it — the main
body or a branch — is continued by a message to the coordinator or the steps
queue. A worker that consumes that queue itself would only send the message
to receive it back, one broker round trip later: the wake runs here instead,
under the task id its message would have had (the run already counts that
id in flight, so liveness sees no difference between the two). A worker that
does not consume the queue — a GPU pool running a called task, an agents
pool — never runs workflow code: it sends, as before.

Nor does a thread that runs one of the user's tasks (a call's answer
journaled in place, right after the task returned) when that task's
options make the pass its business: ``acks_late`` (its message stays
unacknowledged until this returns, and a pass may run as long as its
inline steps take, past the visibility timeout of the user's app, which
would deliver the task again) or a time limit (the pass would count
against it, and a soft limit would be raised inside workflow code). Such a
wake is sent. The durable tasks' own messages carry a visibility timeout
above the longest step and no time limit.

Celery does the same for its own errbacks: a ``link_error`` whose task is
registered in the worker is called in place, not sent (``celery.backends``
``_call_task_errbacks``).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from kombu import Queue  # type: ignore[attr-defined]

from celery_durable.broker.journal import Activation, PassHere
from celery_durable.broker.schema import MAIN, branch_of
from celery_durable.tasks.app import DURABLE_TASK_PREFIX, new_task_id
from celery_durable.tasks.branch import run_branch_task
from celery_durable.tasks.coordinator import TakenPass, run_coordinator_task
from celery_durable.workflows.parking import ParkedBody

if TYPE_CHECKING:
    from celery_durable.engine import Engine

logger = logging.getLogger(__name__)

LET_GO_SECONDS = 5.0
"""How long an answer waits for the pass that kept the body to release the
run's lock, its very next step; past that, the answer wakes as any other."""


def consumes(engine: Engine, queue: str) -> bool:
    """True while this thread runs a task of a worker that consumes ``queue``.

    ``consume_from`` is what ``-Q``/``-X`` selected when the worker started
    (all the app's queues without them); a prefork child inherits it.
    """
    app = engine.celery
    if app.current_worker_task is None:
        return False
    return queue in app.amqp.queues.consume_from


def may_run_here(engine: Engine, queue: str) -> bool:
    """True when a wake for ``queue`` may run in this thread (module docstring)."""
    running = engine.celery.current_worker_task
    if running is not None and not str(running.name).startswith(DURABLE_TASK_PREFIX) and _binds_the_pass(running):
        return False
    return consumes(engine, queue)


def _binds_the_pass(task: Any) -> bool:
    """Whether a user's task's options would hold a pass run inside it."""
    conf = task.app.conf
    limits = (
        *(getattr(task.request, "timelimit", None) or ()),
        task.time_limit,
        task.soft_time_limit,
        conf.task_time_limit,
        conf.task_soft_time_limit,
    )
    return bool(task.acks_late) or any(limit for limit in limits)


def queue_of(engine: Engine, owner: str) -> str:
    """The queue of the message that continues ``owner``."""
    return engine.settings.coordinator_queue if owner == MAIN else engine.settings.steps_queue


def wake_owners(
    engine: Engine,
    run_id: str,
    epoch: int,
    workflow: str,
    owners: Sequence[str],
    prefix: str,
    home: Queue | None = None,
) -> None:
    """Continue each owner woken by a script (task ids ``<prefix>-<n>``):
    one of them in place when this worker consumes its queue, the rest by
    message; the main body's to ``home`` when given, the queue of the worker
    that keeps it (``tasks/home.py``), and in place only when that is this one."""
    woken = [(owner, f"{prefix}-{n}") for n, owner in enumerate(owners, start=1)]
    here = None
    if workflow in engine.workflows:
        local = [w for w in woken if home is None or home is engine.home or w[0] != MAIN]
        here = next((w for w in local if may_run_here(engine, queue_of(engine, w[0]))), None)
    for owner, task_id in woken:
        if (owner, task_id) != here:
            engine.wake(run_id, epoch, workflow, owner, task_id, home)
    if here is None:
        return
    _continue_here(engine, run_id, epoch, workflow, *here)


def kept_pass(
    engine: Engine, run_id: str, epoch: int, workflow: str, prefix: str
) -> tuple[ParkedBody, PassHere] | None:
    """The main body's pass a wake ``<prefix>-1`` would run in this thread,
    for a body this process keeps parked at a call: what the script that
    wakes it needs to take that pass's lock itself (``call_done``), saving
    the pass's own activation. None when the wake would not run here."""
    if workflow not in engine.workflows or not may_run_here(engine, queue_of(engine, MAIN)):
        return None
    body = engine.parked.peek(run_id, epoch)
    cursor = body.cursor if body is not None else None
    if body is None or cursor is None or body.replay.run.workflow != workflow:
        return None
    # The pass that parked the body may not have released the lock yet (the
    # answer came quickly): then a busy lock is left alone, and the answer
    # waits for that pass (wait_for_the_pass) instead of enlisting it.
    soft = engine.parked.holds(run_id)
    return body, PassHere(f"{prefix}-1", body.replay.run.namespace, new_task_id(), cursor.seq, cursor.index, soft)


def wait_for_the_pass(engine: Engine, run_id: str, owners: Sequence[str]) -> None:
    """Before a call's answer wakes the main body: let the pass of the run
    still running in this process (the one that sent the call) release the
    lock first, else the wake finds it busy (``ParkedRuns.wait_let_go``)."""
    if MAIN in owners:
        engine.parked.wait_let_go(run_id, LET_GO_SECONDS)


def run_taken_pass(
    engine: Engine, run_id: str, epoch: int, workflow: str, kept: tuple[ParkedBody, PassHere], activation: Activation
) -> None:
    """Run the pass whose lock the waking script took (``kept_pass``), here."""
    body, here = kept
    _continue_here(engine, run_id, epoch, workflow, MAIN, here.token, TakenPass(body, here, activation))


def _continue_here(
    engine: Engine, run_id: str, epoch: int, workflow: str, owner: str, task_id: str, taken: TakenPass | None = None
) -> None:
    try:
        _run_here(engine, run_id, epoch, workflow, owner, task_id, taken)
    except Exception:
        # The message this replaced was never sent: send it now, under the
        # same id, and a worker picks the work up where this one stopped.
        logger.exception("run %s: continuing %s in place failed; its message is sent instead", run_id, owner)
        engine.wake(run_id, epoch, workflow, owner, task_id)


def _run_here(
    engine: Engine, run_id: str, epoch: int, workflow: str, owner: str, task_id: str, taken: TakenPass | None
) -> None:
    if owner == MAIN:
        run_coordinator_task(
            engine, task_id=task_id, run_id=run_id, epoch=epoch, workflow=workflow, extra={}, taken=taken
        )
        return
    call, branch = branch_of(owner)
    run_branch_task(
        engine, task_id=task_id, run_id=run_id, epoch=epoch, workflow=workflow, call=call, branches=[branch], extra={}
    )
