"""What Flower shows of a branch task once it has run: the steps it ran.

A branch task is sent before anyone knows which steps it will run: its
branches are thunks, and their step keys exist only once their code runs.
So it is sent under a name that says its fan-out (``order · branches of
m:2``), and when it has run it tells Flower its steps, in one task event
that renames it after them: ``order · step charge-card`` for one step,
``order · steps fetch-0, fetch-1`` for a few, ``order · steps fetch-0 +11``
for many; its kwargs gain ``steps``. Flower's state (Celery's
``events.state``) takes the name and kwargs of any task event, and a custom
event type leaves a finished task's state as it was.

Sent only by a worker that sends task events (``--task-events``, which
``celery-durable worker`` sets): one more publish per branch task, none
where no monitor asked for events.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from celery_durable.broker import schema

logger = logging.getLogger(__name__)

EVENT = "task-steps"
LISTED = 3
"""Up to this many keys are listed in the name; more are the first and a count."""
MAX_NAME = 120
SHOWN_SEQUENCES = 16


def branch_shown(kwargs: dict[str, Any]) -> dict[str, Any]:
    """The branches' sequences ("m.2.19"), where their step keys are journaled
    (the first few: a wide fan-out's chunk holds many)."""
    seq, _, index = str(kwargs["call"]).rpartition(":")
    branches = kwargs["branches"]
    shown = [schema.branch_seq(seq, int(index), j) for j in branches[:SHOWN_SEQUENCES]]
    if len(branches) > SHOWN_SEQUENCES:
        shown.append(f"... {len(branches) - SHOWN_SEQUENCES} more")
    return {**kwargs, "sequences": shown}


_events = {"on": False}


def follow_worker(worker: Any) -> None:
    """Called as the worker is assembled (before a prefork pool forks): whether it sends task events."""
    _events["on"] = bool(getattr(worker, "task_events", False))


def display_name(workflow: str, keys: Sequence[str]) -> str | None:
    """The name a branch task that ran ``keys`` shows (None: it ran no step, its name stays)."""
    unique = list(dict.fromkeys(keys))
    if not unique:
        return None
    if len(unique) == 1:
        return f"{workflow} · step {unique[0]}"[:MAX_NAME]
    listed = f"{workflow} · steps {', '.join(unique)}"
    if len(unique) <= LISTED and len(listed) <= MAX_NAME:
        return listed
    return f"{workflow} · steps {unique[0]} +{len(unique) - 1}"[:MAX_NAME]


def announce(run_id: str, epoch: int, workflow: str, call: str, branches: Sequence[int], keys: Sequence[str]) -> None:
    """Rename the running branch task after the steps it ran, in Flower (best effort)."""
    if not _events["on"]:
        return
    name = display_name(workflow, keys)
    if name is None:
        return
    from celery import current_task

    if current_task is None or not current_task.request.id:
        return
    shown = branch_shown(
        {"run_id": run_id, "epoch": epoch, "workflow": workflow, "call": call, "branches": list(branches)}
    )
    shown["steps"] = list(dict.fromkeys(keys))
    try:
        current_task.send_event(EVENT, name=name, kwargs=repr(shown), retry=False)
    except Exception as exc:  # a monitor's nicety: never a reason for the task to fail
        logger.debug("could not tell Flower the steps of task %s: %s", current_task.request.id, exc)
