"""Publishing the durable tasks' messages.

Each message is JSON, sent to its queue with a task id chosen by the caller
(the run counts it as in flight in the same script that decides to send it,
see liveness in ``_prelude.lua``). Flower shows what a message is for: the
task's displayed name (Celery's ``shadow``) says the workflow and what the
message does, and its arguments say the run, the fan-out and its branches'
sequences, so Flower's search finds a run's tasks by run id or sequence.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from celery import Celery
from kombu import Queue  # type: ignore[attr-defined]

from celery_durable.broker import schema
from celery_durable.config import Settings
from celery_durable.tasks.app import AGENT_TASK, BRANCH_TASK, COORDINATOR_TASK, new_task_id


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


def _send(
    app: Celery,
    name: str,
    kwargs: dict[str, Any],
    *,
    queue: str | Queue,
    task_id: str,
    shadow: str,
    shown: dict[str, Any],
    countdown: float | None = None,
    producer: Any = None,
) -> None:
    app.send_task(
        name,
        kwargs=kwargs,
        queue=queue,
        task_id=task_id,
        countdown=countdown,
        serializer="json",
        shadow=shadow,
        kwargsrepr=repr(shown),
        producer=producer,
        # Durable tasks keep no result (their own option); said here too, the
        # sender does not subscribe to a result that never comes.
        ignore_result=True,
        # Not a child of whatever task this thread runs (a pass run in place
        # inside a called task): that task's stored result would list it.
        add_to_parent=False,
        result_cls=SentMessage,
    )


def send_coordinator(
    app: Celery,
    settings: Settings,
    run_id: str,
    epoch: int,
    workflow: str,
    countdown: float | None = None,
    task_id: str | None = None,
    queue: Queue | None = None,
) -> str:
    """A coordinator pass, to the coordinator queue or to a worker's ``queue`` (its home)."""
    task_id = task_id or new_task_id()
    kwargs = {"run_id": run_id, "epoch": epoch, "workflow": workflow}
    _send(
        app,
        COORDINATOR_TASK,
        kwargs,
        queue=queue if queue is not None else settings.coordinator_queue,
        task_id=task_id,
        countdown=countdown,
        shadow=f"{workflow} · coordinator",
        shown=kwargs,
    )
    return task_id


def send_agent(
    app: Celery,
    settings: Settings,
    run_id: str,
    epoch: int,
    workflow: str,
    agent: str,
    owner: str,
    countdown: float | None = None,
    task_id: str | None = None,
) -> str:
    task_id = task_id or new_task_id()
    kwargs = {"run_id": run_id, "epoch": epoch, "workflow": workflow, "agent": agent, "owner": owner}
    _send(
        app,
        AGENT_TASK,
        kwargs,
        queue=settings.agents_queue,
        task_id=task_id,
        countdown=countdown,
        shadow=f"{workflow} · agent turn",
        shown=kwargs,
    )
    return task_id


def _branch_kwargs(run_id: str, epoch: int, workflow: str, call: str, branches: list[int]) -> dict[str, Any]:
    return {"run_id": run_id, "epoch": epoch, "workflow": workflow, "call": call, "branches": branches}


SHOWN_SEQUENCES = 16


def _branch_shown(kwargs: dict[str, Any]) -> dict[str, Any]:
    """The branches' sequences ("m.2.19"), where their step keys are journaled
    (the first few: a wide fan-out's chunk holds many)."""
    seq, _, index = str(kwargs["call"]).rpartition(":")
    branches = kwargs["branches"]
    shown = [schema.branch_seq(seq, int(index), j) for j in branches[:SHOWN_SEQUENCES]]
    if len(branches) > SHOWN_SEQUENCES:
        shown.append(f"... {len(branches) - SHOWN_SEQUENCES} more")
    return {**kwargs, "sequences": shown}


def send_branch(
    app: Celery, settings: Settings, run_id: str, epoch: int, workflow: str, call: str, branch: int, task_id: str
) -> None:
    """Send one branch again: a branch that waited (for an agent turn, a timer...) continues."""
    kwargs = _branch_kwargs(run_id, epoch, workflow, call, [branch])
    _send(
        app,
        BRANCH_TASK,
        kwargs,
        queue=settings.steps_queue,
        task_id=task_id,
        shadow=f"{workflow} · branch {call}/{branch}",
        shown=_branch_shown(kwargs),
    )


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


def send_branches(
    app: Celery,
    settings: Settings,
    run_id: str,
    epoch: int,
    workflow: str,
    call: str,
    indices: Sequence[int],
    tasks: int,
    task_ids: Sequence[str] | None = None,
) -> list[str]:
    """Publish the branches as ``tasks`` tasks (at most one per branch), on one
    connection, branch j in task j mod ``tasks``; returns their task ids
    (``task_ids`` when given: ids the journal already counts in flight)."""
    chunks = max(1, min(len(indices), tasks))
    sent = list(task_ids) if task_ids is not None else [new_task_id() for _ in range(chunks)]
    if len(sent) != chunks:
        raise ValueError(f"{chunks} branch tasks need as many task ids, got {len(sent)}")
    with app.producer_or_acquire() as producer:
        for chunk, task_id in enumerate(sent):
            branches = list(indices[chunk::chunks])
            kwargs = _branch_kwargs(run_id, epoch, workflow, call, branches)
            _send(
                app,
                BRANCH_TASK,
                kwargs,
                queue=settings.steps_queue,
                task_id=task_id,
                shadow=f"{workflow} · branches of {call}",
                shown=_branch_shown(kwargs),
                producer=producer,
            )
    return sent
