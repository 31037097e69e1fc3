"""Carrying out where a wake runs: here, in this thread, or by message.

When a call's answer or an agent turn settles, what waited for it — the main
body or a branch — is continued by a message to the coordinator or the steps
queue. A worker that consumes that queue itself would only send the message
to receive it back, one broker round trip later: the wake runs here instead,
under the task id its message would have had (the run already counts that
id in flight, so liveness sees no difference between the two). A worker that
does not consume the queue — a GPU pool running a called task, an agents
pool — never runs workflow code: it sends, as before. Celery does the same
for its own errbacks: a ``link_error`` whose task is registered in the
worker is called in place, not sent (``celery.backends``
``_call_task_errbacks``).

Where each wake goes is decided by ``tasks/wake_route.py`` alone; this
module gathers what that decision needs (``gather``) and carries it out
(``wake_owners``, ``run_taken_pass``).
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Collection, Iterator, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any, cast

from kombu import Queue  # type: ignore[attr-defined]

from celery_durable.broker.replies.run import Activation, PassHere
from celery_durable.broker.schema import MAIN, branch_of
from celery_durable.tasks.app import BRANCH_TASK, COORDINATOR_TASK, DURABLE_TASK_PREFIX, new_task_id
from celery_durable.tasks.coordinator import TakenPass
from celery_durable.tasks.retrying import shutting_down
from celery_durable.tasks.wake_route import Home, Owner, WakeFacts, Where, route
from celery_durable.tasks.wakes import Wake, woken
from celery_durable.workflows.parking import ParkedBody

if TYPE_CHECKING:
    from celery_durable.engine import Engine

logger = logging.getLogger(__name__)

LET_GO_SECONDS = 5.0
"""How long a wake waits for the pass that kept the body to release the
run's lock, its very next step; past that, the wake goes on as it would."""


_in_process = threading.local()
"""What the in-process test fleet's worker delivering in this thread consumes (``consuming``)."""


@contextlib.contextmanager
def consuming(queues: Collection[str]) -> Iterator[None]:
    """This thread runs a task of an in-process worker that consumes
    ``queues`` (the test fleet, ``testing/fleet.py``), for the block. A
    thread-local, as Celery's ``current_worker_task`` is: a kept body's own
    thread, or a context of its own (``answer_in_place``), sees the same."""
    previous = getattr(_in_process, "queues", None)
    _in_process.queues = frozenset(queues)
    try:
        yield
    finally:
        _in_process.queues = previous


def consumed(engine: Engine) -> Collection[str]:
    """The queues of the worker whose task this thread runs; none outside a task.

    The one answer to "may this thread run what comes on that queue": a
    Celery worker's is what ``-Q``/``-X`` selected when it started (all the
    app's queues without them; a prefork child inherits it), the in-process
    fleet's is the one its delivery set (``consuming``). Both take every
    decision below through it, so a test runs the same decisions a worker does.
    """
    queues: frozenset[str] | None = getattr(_in_process, "queues", None)
    if queues is not None:
        return queues
    app = engine.celery
    if app.current_worker_task is None:
        return ()
    return cast(Collection[str], app.amqp.queues.consume_from)


def consumes(engine: Engine, queue: str) -> bool:
    """True while this thread runs a task of a worker that consumes ``queue``."""
    return queue in consumed(engine)


def _user_task_binds(engine: Engine) -> bool:
    """Whether this thread runs a user's task whose options would hold a pass
    run inside it (``WakeFacts.user_task_binds``). The durable tasks' own
    messages carry a visibility timeout above the longest step and no time
    limit."""
    task = engine.celery.current_worker_task
    if task is None or str(task.name).startswith(DURABLE_TASK_PREFIX):
        return False
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


def gather(
    engine: Engine,
    run_id: str,
    epoch: int,
    workflow: str,
    owner: str,
    home: Home = Home.NONE,
    *,
    takeable: bool = False,
    slot_taken: bool = False,
) -> WakeFacts:
    """What ``route`` needs to know about waking ``owner`` of the run from this thread."""
    main = owner == MAIN
    return WakeFacts(
        owner=Owner.MAIN if main else Owner.BRANCH,
        home=home,
        consumes=consumes(engine, queue_of(engine, owner)),
        knows_workflow=workflow in engine.workflows,
        user_task_binds=_user_task_binds(engine),
        shutting_down=shutting_down(),
        kept=main and engine.parked.peek(run_id, epoch, workflow) is not None,
        pass_here=main and engine.parked.holds(run_id),
        takeable=takeable,
        slot_taken=slot_taken,
    )


def wake_owners(
    engine: Engine,
    run_id: str,
    epoch: int,
    workflow: str,
    owners: Sequence[str],
    prefix: str,
    home: Home = Home.NONE,
    home_queue: Queue | None = None,
    namespace: str | None = None,
) -> None:
    """Continue each owner woken by a script (task ids ``<prefix>-<n>``) where
    ``route`` says: at most one of them here, after the others are sent.
    ``home_queue`` is the queue of the home the answer named."""
    here: tuple[str, str] | None = None
    sent: list[Wake] = []
    for wake in woken(run_id, epoch, workflow, owners, prefix, namespace):
        verdict = route(gather(engine, run_id, epoch, workflow, wake.owner, home, slot_taken=here is not None))
        if verdict.wait_let_go:
            engine.parked.wait_let_go(run_id, LET_GO_SECONDS)
        if verdict.where is Where.HERE:
            here = wake.owner, wake.task_id
        else:
            sent.append(replace(wake, home=home_queue) if verdict.where is Where.HOME else wake)
    engine.deliver(sent)
    if here is not None:
        _continue_here(engine, run_id, epoch, workflow, *here)


def take_request(
    engine: Engine, run_id: str, epoch: int, workflow: str, prefix: str, soft: bool
) -> tuple[ParkedBody, PassHere] | None:
    """The body kept here and what the answer's script needs to take its
    pass for the wake ``<prefix>-1`` (``Where.TAKE``); None when no body is
    kept any more."""
    body = engine.parked.peek(run_id, epoch, workflow)
    if body is None or body.cursor is None:
        return None
    cursor = body.cursor
    return body, PassHere(f"{prefix}-1", body.replay.run.namespace, new_task_id(), cursor.seq, cursor.index, soft)


def run_taken_pass(
    engine: Engine, run_id: str, epoch: int, workflow: str, kept: tuple[ParkedBody, PassHere], activation: Activation
) -> None:
    """Run the pass whose lock the answer's script took (``take_request``), here."""
    body, here = kept
    engine.parked.count_taken()
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
        engine.deliver([Wake(run_id, epoch, workflow, owner, task_id)])


def _run_here(
    engine: Engine, run_id: str, epoch: int, workflow: str, owner: str, task_id: str, taken: TakenPass | None
) -> None:
    run: dict[str, Any] = {"run_id": run_id, "epoch": epoch, "workflow": workflow}
    if owner == MAIN:
        engine.run_here(COORDINATOR_TASK, task_id, run, taken=taken)
        return
    call, branch = branch_of(owner)
    engine.run_here(BRANCH_TASK, task_id, {**run, "call": call, "branches": [branch]})
