"""A fleet under load, for the liveness tests: many runs of five steps and a
fan-out of eight, on worker processes the tests start, kill and count.

Workers write a little bookkeeping to Redis under ``<key_prefix>:load``:

- ``load:inflight:<pgrp>`` (hash): run id -> messages of that run the worker
  received and has not finished (Celery's ``task_received`` and
  ``task_postrun``). After a SIGKILL it names the runs whose work died.
- ``load:received:<pgrp>`` (set): every task id the worker received, so a
  test can tell a message a live worker held from one that died unseen.
- ``load:ready`` (set): process groups of workers that finished starting.
"""

from __future__ import annotations

import os
import time
from typing import Any

import redis
from celery.signals import task_postrun, task_received, worker_ready

from celery_durable import Engine, Settings, WorkflowContext, workflow

settings = Settings()
_redis = redis.Redis.from_url(settings.redis_url, decode_responses=True)


def inflight_key(prefix: str, pgrp: int) -> str:
    return f"{prefix}:load:inflight:{pgrp}"


def received_key(prefix: str, pgrp: int) -> str:
    return f"{prefix}:load:received:{pgrp}"


def ready_key(prefix: str) -> str:
    return f"{prefix}:load:ready"


@workflow(name="load", description="Five steps, then eight in parallel", phases=[{"title": "Work"}])
def load(ctx: WorkflowContext) -> Any:
    ctx.phase("Work")
    pause = float(ctx.args.get("pause", 0.0))

    def work(key: str) -> Any:
        return ctx.step(key, lambda: (time.sleep(pause), key)[1])

    head = [work(f"s{i}") for i in range(5)]
    tail = ctx.parallel([lambda i=i: work(f"p{i}") for i in range(8)])
    return len(head) + len(tail)


engine = Engine(workflows=[load])
celery_app = engine.celery


def _ours(app: Any) -> bool:
    return app is engine.celery


def _run_of(request: Any) -> str | None:
    kwargs = getattr(request, "kwargs", None)
    run_id = kwargs.get("run_id") if isinstance(kwargs, dict) else None
    return run_id if isinstance(run_id, str) else None


@worker_ready.connect
def _announce(sender: Any = None, **_: Any) -> None:
    if _ours(getattr(sender, "app", None)):
        _redis.sadd(ready_key(settings.key_prefix), os.getpgrp())


@task_received.connect
def _received(sender: Any = None, request: Any = None, **_: Any) -> None:
    run_id = _run_of(request)
    if _ours(getattr(sender, "app", None)) and run_id:
        _redis.hincrby(inflight_key(settings.key_prefix, os.getpgrp()), run_id, 1)
        _redis.sadd(received_key(settings.key_prefix, os.getpgrp()), str(request.id))


@task_postrun.connect
def _finished(sender: Any = None, kwargs: Any = None, **_: Any) -> None:
    run_id = kwargs.get("run_id") if isinstance(kwargs, dict) else None
    if sender is not None and _ours(getattr(sender, "app", None)) and isinstance(run_id, str):
        _redis.hincrby(inflight_key(settings.key_prefix, os.getpgrp()), run_id, -1)
