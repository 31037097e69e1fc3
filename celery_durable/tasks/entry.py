"""The body of each durable task, by name: what a worker runs for a message.

The Celery tasks registered on the engine's app (``tasks.app``) and the
in-process test fleet (``celery_durable.testing``) both hand a message here,
so a run is driven by one implementation of every task wherever it runs.
Arguments are checked by the task bodies themselves (``tasks.messages``):
a message is the outside world's, and a bad one is refused there, logged.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from celery_durable.tasks.app import AGENT_TASK, BRANCH_TASK, COORDINATOR_TASK

if TYPE_CHECKING:
    from celery_durable.engine import Engine


def run_durable_task(engine: Engine, task: str, task_id: str, kwargs: dict[str, Any]) -> None:
    """Run durable task ``task``'s body for one message's keyword arguments."""
    from celery_durable.tasks.agent import run_agent_task
    from celery_durable.tasks.branch import run_branch_task
    from celery_durable.tasks.coordinator import run_coordinator_task

    extra = dict(kwargs)
    run = {name: extra.pop(name, None) for name in ("run_id", "epoch", "workflow")}
    if task == COORDINATOR_TASK:
        run_coordinator_task(engine, task_id=task_id, **run, extra=extra)
    elif task == BRANCH_TASK:
        call, branches = extra.pop("call", None), extra.pop("branches", None)
        run_branch_task(engine, task_id=task_id, **run, call=call, branches=branches, extra=extra)
    elif task == AGENT_TASK:
        agent, owner = extra.pop("agent", None), extra.pop("owner", None)
        run_agent_task(engine, task_id=task_id, **run, agent=agent, owner=owner, extra=extra)
    else:
        raise ValueError(f"{task!r} is not a durable task")
