"""The one entry of every durable task: what a worker runs for a message.

The Celery tasks registered on the engine's app (``tasks.app``), a wake or
a call's answer run in place instead of sent (``tasks/in_place.py``,
``CallAnswerTask``) and the in-process test fleet (``celery_durable.testing``)
all hand a message here, so a run is driven by one implementation of every
task wherever and however its message arrives, and what holds for every
task (its arguments checked, its storage errors retried) is said once per
body, not once per way in. Arguments are checked by the task bodies
themselves (``tasks.messages``): a message is the outside world's, and a bad
one is refused there, logged.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from celery_durable.tasks.app import AGENT_TASK, BRANCH_TASK, CALL_FAILED_TASK, CALL_RESULT_TASK, COORDINATOR_TASK

if TYPE_CHECKING:
    from celery_durable.engine import Engine
    from celery_durable.tasks.coordinator import TakenPass


def run_durable_task(
    engine: Engine,
    task: str,
    task_id: str,
    kwargs: dict[str, Any],
    args: tuple[Any, ...] = (),
    *,
    home: Any = None,
    called: Any = None,
    taken: TakenPass | None = None,
) -> None:
    """Run durable task ``task``'s body for one message.

    ``args``: a call's answer's positional arguments (the called task's
    result, or its failure); ``home`` and ``called``: that answer's message
    headers (``tasks/calls.py``); ``taken``: a pass whose lock the script
    that woke it took already (a call answered in place).
    """
    from celery_durable.tasks.agent import run_agent_task
    from celery_durable.tasks.branch import run_branch_task
    from celery_durable.tasks.calls import call_failed, call_succeeded
    from celery_durable.tasks.coordinator import run_coordinator_task

    extra = dict(kwargs)
    if task == CALL_RESULT_TASK:
        call_succeeded(engine, args, extra, home, called)
        return
    if task == CALL_FAILED_TASK:
        call_failed(engine, args, extra, home)
        return
    run = {name: extra.pop(name, None) for name in ("run_id", "epoch", "workflow")}
    if task == COORDINATOR_TASK:
        run_coordinator_task(engine, task_id=task_id, **run, extra=extra, taken=taken)
    elif task == BRANCH_TASK:
        call, branches = extra.pop("call", None), extra.pop("branches", None)
        run_branch_task(engine, task_id=task_id, **run, call=call, branches=branches, extra=extra)
    elif task == AGENT_TASK:
        agent, owner = extra.pop("agent", None), extra.pop("owner", None)
        run_agent_task(engine, task_id=task_id, **run, agent=agent, owner=owner, extra=extra)
    else:
        raise ValueError(f"{task!r} is not a durable task")
