"""A durable worker on the team's gpu app, for the home-queue tests
(``tests/test_home_queue.py``), started with ``-Q`` of the coordinator and
steps queues only: the tasks its workflows call run on another worker.

``<key_prefix>:home:starts:<run id>`` counts how many times a run's body
ran from its top (the first pass, and every replay after it). A test that
runs these workflows in its own process too points ``counter`` at its Redis.
"""

from __future__ import annotations

import os
import time
from typing import Any

import redis

from celery_durable import Engine, Settings, WorkflowContext, define_workflow
from tests.support.apps.gpu import make_app

settings = Settings()
counter = (redis.Redis.from_url(settings.redis_url, decode_responses=True), settings.key_prefix)
CALLS = 20


def starts_key(prefix: str, run_id: str) -> str:
    return f"{prefix}:home:starts:{run_id}"


def _render_one(ctx: WorkflowContext) -> Any:
    return ctx.call("render", "gpu.render", args=("x",), kwargs={"seconds": 0.5})


def _adds(ctx: WorkflowContext) -> Any:
    store, prefix = counter
    store.incr(starts_key(prefix, ctx.run_id))
    total = 0
    for i in range(CALLS):
        total = ctx.call(f"add-{i}", "gpu.add", args=(total, i))
    return total


def _hold(ctx: WorkflowContext) -> Any:
    """A long step inline in the pass: it holds a worker thread throughout."""
    return ctx.step("hold", lambda: time.sleep(float(ctx.args["seconds"])) or "held")


render_one = define_workflow({"name": "render-one", "description": "one call", "phases": []}, _render_one)
adds = define_workflow({"name": "adds", "description": "calls in a row", "phases": []}, _adds)
app = make_app(settings.effective_broker_url, os.environ.get("GPU_QUEUE", "gpu"), results=settings.redis_url)
# A worker takes a message only when a thread is free for it, as the engine's
# own app does: a busy keeper must not hold the wake sent again for it.
app.conf.worker_prefetch_multiplier = 1
hold = define_workflow({"name": "hold", "description": "a long inline step", "phases": []}, _hold)
engine = Engine([render_one, adds, hold], settings, celery_app=app)
