"""The durable tasks' messages, and the one seam that sends them.

Each message is JSON, sent to its queue with a task id chosen by the caller
(the run counts it as in flight in the same script that decides to send it,
see liveness in ``_prelude.lua``). Flower shows what a message is for: the
task's displayed name (Celery's ``shadow``) says the workflow and what the
message does, and its arguments say the run, the fan-out and its branches'
sequences, so Flower's search finds a run's tasks by run id or sequence; a
branch task renames itself after the steps it ran (``flower_names``).

What a message says is built here once (``coordinator_message``,
``agent_message``, ``branch_messages``); how it travels is a ``Sender``:
``CelerySender`` publishes through the engine's Celery app, and the
in-process test fleet (``celery_durable.testing``) delivers the same
messages to the same task bodies (``tasks.entry.run_durable_task``) from a
queue in memory. Nothing else differs between the two.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from celery import Celery
from kombu import Queue  # type: ignore[attr-defined]

from celery_durable import telemetry
from celery_durable.config import Settings
from celery_durable.tasks.app import AGENT_TASK, BRANCH_TASK, COORDINATOR_TASK, destination, new_task_id
from celery_durable.tasks.flower_names import branch_shown

if TYPE_CHECKING:
    from celery_durable.broker import RunRecord
    from celery_durable.engine import Engine
    from celery_durable.workflows.calls import CallRequest


class SentMessage:
    """What ``send_task`` returns for a message the engine sends: only its id.

    Celery's default, ``AsyncResult``, looks up the app's result backend,
    which Celery builds once per thread. A kept main body runs on a thread of
    its own, so every run it sent from built a whole backend (a Redis client,
    and package metadata read from disk): 7% of a busy worker's time in the
    many-runs benchmark (py-spy). Nothing waits on these results.
    """

    __slots__ = ("id", "ignored")

    def __init__(self, task_id: str, **_: Any) -> None:
        self.id = task_id
        self.ignored = True


@dataclass(frozen=True, slots=True)
class Outgoing:
    """One durable task's message: the task, its keyword arguments, where it goes."""

    task: str
    kwargs: dict[str, Any]
    task_id: str
    queue: str | Queue
    shadow: str
    """The name Flower shows."""
    shown: dict[str, Any]
    """The arguments Flower shows (``kwargsrepr``)."""
    countdown: float | None = None


class Sender(Protocol):
    """How the engine's messages travel: ``CelerySender`` on a fleet."""

    def send(self, messages: Sequence[Outgoing]) -> None:
        """Send each message, in order."""

    def send_call(self, engine: Engine, record: RunRecord, request: CallRequest) -> None:
        """Send a called task of the user's (``ctx.call``), linked to its answer."""


class CelerySender:
    """Publishes through the engine's Celery app: several messages on one
    connection, in one batch (kombu's Redis transport sends a batch as one
    pipeline, where each message alone is a round trip; other transports
    publish each at once, as before)."""

    def __init__(self, app: Celery) -> None:
        self.app = app

    def send(self, messages: Sequence[Outgoing]) -> None:
        if len(messages) == 1:
            self._publish(messages[0], None)
            return
        with self.app.producer_or_acquire() as producer, producer.batch():
            for message in messages:
                self._publish(message, producer)

    def send_call(self, engine: Engine, record: RunRecord, request: CallRequest) -> None:
        from celery_durable.tasks.calls import publish_call

        publish_call(self.app, engine, record, request)

    def _publish(self, message: Outgoing, producer: Any) -> None:
        due = time.time() + (message.countdown or 0)
        self.app.send_task(
            message.task,
            kwargs=message.kwargs,
            **destination(self.app, message.queue),
            task_id=message.task_id,
            countdown=message.countdown,
            serializer="json",
            shadow=message.shadow,
            kwargsrepr=repr(message.shown),
            producer=producer,
            # Durable tasks keep no result (their own option); said here too, the
            # sender does not subscribe to a result that never comes.
            ignore_result=True,
            # Not a child of whatever task this thread runs (a pass run in place
            # inside a called task): that task's stored result would list it.
            add_to_parent=False,
            result_cls=SentMessage,
            # When it is due, for the receiving worker's queue-wait histogram; every version ignores a header it
            # does not know.
            headers={telemetry.DUE_HEADER: int(due * 1000)},
        )


def coordinator_message(
    settings: Settings,
    run_id: str,
    epoch: int,
    workflow: str,
    countdown: float | None = None,
    task_id: str | None = None,
    queue: Queue | None = None,
    namespace: str | None = None,
) -> Outgoing:
    """A coordinator pass, to the coordinator queue or to a worker's ``queue``
    (its home); naming the run's ``namespace`` when the sender knows it
    saves the pass a read (``RunMessage.namespace``)."""
    kwargs: dict[str, Any] = {"run_id": run_id, "epoch": epoch, "workflow": workflow}
    if namespace is not None:
        kwargs["namespace"] = namespace
    return Outgoing(
        COORDINATOR_TASK,
        kwargs,
        task_id or new_task_id(),
        queue if queue is not None else settings.coordinator_queue,
        shadow=f"{workflow} · coordinator",
        shown=kwargs,
        countdown=countdown,
    )


def agent_message(
    settings: Settings,
    run_id: str,
    epoch: int,
    workflow: str,
    agent: str,
    owner: str,
    countdown: float | None = None,
    task_id: str | None = None,
) -> Outgoing:
    kwargs = {"run_id": run_id, "epoch": epoch, "workflow": workflow, "agent": agent, "owner": owner}
    return Outgoing(
        AGENT_TASK,
        kwargs,
        task_id or new_task_id(),
        settings.agents_queue,
        shadow=f"{workflow} · agent turn",
        shown=kwargs,
        countdown=countdown,
    )


def _branch_kwargs(run_id: str, epoch: int, workflow: str, call: str, branches: list[int]) -> dict[str, Any]:
    return {"run_id": run_id, "epoch": epoch, "workflow": workflow, "call": call, "branches": branches}


def first_chunks(indices: Sequence[int], settings: Settings) -> int:
    """How many branch tasks a fan-out's dispatch sends.

    A branch task replays the main body before it runs its thunks, and that
    replay rebuilds the whole list of thunks: one task per branch would make
    a fan-out of n cost n replays of size n. With ``branch_batch_ms`` a
    fan-out starts as one task per ``fanout_tasks`` branches, and tasks hand
    on what runs slow (``BranchWork``); without, it starts as wide as it may.
    """
    n, cap = len(indices), settings.fanout_tasks
    if settings.branch_batch_ms <= 0:
        return min(n, cap)
    return min(cap, -(-n // cap))


def branch_messages(
    settings: Settings,
    run_id: str,
    epoch: int,
    workflow: str,
    call: str,
    indices: Sequence[int],
    task_ids: Sequence[str],
    countdown: float | None = None,
) -> list[Outgoing]:
    """The branches as ``len(task_ids)`` tasks (at most one per branch),
    branch j in task j mod that count; a task that continues one branch
    (a branch that waited) is named after it."""
    chunks = max(1, min(len(indices), len(task_ids)))
    if len(task_ids) != chunks:
        raise ValueError(f"{chunks} branch tasks need as many task ids, got {len(task_ids)}")
    messages = []
    for chunk, task_id in enumerate(task_ids):
        branches = list(indices[chunk::chunks])
        kwargs = _branch_kwargs(run_id, epoch, workflow, call, branches)
        one = len(indices) == 1
        shadow = f"{workflow} · branch {call}/{branches[0]}" if one else f"{workflow} · branches of {call}"
        messages.append(
            Outgoing(
                BRANCH_TASK,
                kwargs,
                task_id,
                settings.steps_queue,
                shadow=shadow,
                shown=branch_shown(kwargs),
                countdown=countdown,
            )
        )
    return messages
