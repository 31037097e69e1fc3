"""An engine whose worker can die holding a call's answer.

Its calls' task (``answer_dies.render``) is served by a worker of its own
that consumes only ``CALLS_QUEUE``, so its link sends the answer to the
coordinator queue as a message; every worker here has the engine's own
visibility timeout (six hours). With ``DIE_HOLDING_ANSWER=1`` in its
environment a worker, about to run the first answer it took, waits until
its held hash names that message (what the sweep reads once it is dead),
then kills itself with SIGKILL by its own pid: the message stays
unacknowledged in the broker.
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import redis
from celery.signals import task_prerun

from celery_durable import Engine, Settings, WorkflowContext, workflow
from celery_durable.tasks.app import CALL_RESULT_TASK

HELD_BOUND = 30.0
"""How long the dying worker waits for its held hash to name the answer (its holding thread writes at once)."""

settings = Settings()
CALLS_QUEUE = f"{settings.key_prefix}.calls"


@workflow(name="answered-call", description="One call to a queue of its own", phases=[])
def answered_call(ctx: WorkflowContext) -> Any:
    return ctx.call("render", "answer_dies.render", args=("a",), queue=CALLS_QUEUE)


engine = Engine([answered_call], settings)
store = redis.Redis.from_url(settings.redis_url, decode_responses=True)


def runs_key(task_id: str) -> str:
    return f"{settings.key_prefix}:test:runs:{task_id}"


@engine.celery.task(name="answer_dies.render", bind=True, acks_late=True, shared=False)
def render(self: Any, item: str) -> dict[str, Any]:
    return {"item": item, "runs": store.incr(runs_key(self.request.id))}


@task_prerun.connect(weak=False)
def _die_holding_the_answer(sender: Any = None, task_id: str | None = None, **_: Any) -> None:
    if os.environ.get("DIE_HOLDING_ANSWER") != "1" or getattr(sender, "name", None) != CALL_RESULT_TASK:
        return
    prefix = engine.store.keys.held_prefix
    deadline = time.monotonic() + HELD_BOUND
    while time.monotonic() < deadline:
        if any(store.hexists(key, str(task_id)) for key in store.scan_iter(f"{prefix}*")):
            break
        time.sleep(0.01)
    os.kill(os.getpid(), signal.SIGKILL)
