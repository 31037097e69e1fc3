"""The trip for the chaos test: the same bookings, with short random sleeps
inside every step so that kills land mid-step, and a little bookkeeping the
test reads to know what a kill interrupted.

Bookkeeping lives in Redis under ``<key_prefix>:chaos``, apart from the
journal and the providers:

- ``chaos:ready`` (set): pids of workers that finished starting (Celery's
  ``worker_ready``); the test only kills workers that can have work.
- ``chaos:busy`` (hash): ``<run_id>|<step>|<pid>`` -> ms the step's producer
  started, removed when it returns. A field naming a killed pid is a step
  that kill interrupted.
- ``chaos:trace:<run_id>`` (list): every task message of the run as workers
  received, started and finished it, with their pids: where a stalled run's
  messages went.

Each booking sleeps before *and* after its provider call, so some kills land
after a reservation was made but before the step was journaled: the next
attempt calls the provider again under the same idempotency key.
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Callable
from typing import Any

import redis
from celery.signals import task_postrun, task_prerun, task_received, worker_ready

from celery_durable import Engine, Settings, WorkflowContext, workflow
from tests.support.apps.trip import SERVICES, book

settings = Settings()
_redis = redis.Redis.from_url(settings.redis_url, decode_responses=True)


def ready_key(prefix: str) -> str:
    return f"{prefix}:chaos:ready"


def busy_key(prefix: str) -> str:
    return f"{prefix}:chaos:busy"


def trace_key(prefix: str, run_id: str) -> str:
    return f"{prefix}:chaos:trace:{run_id}"


# Celery's signals are process-wide, and the test process imports this module
# too: every handler acts for this engine's workers only, never for another
# test's in-process worker.
def _ours(app: Any) -> bool:
    return app is engine.celery


@worker_ready.connect
def _announce_ready(sender: Any = None, **_: Any) -> None:
    if _ours(getattr(sender, "app", None)):
        _redis.sadd(ready_key(settings.key_prefix), os.getpgrp())


def _trace(event: str, name: str, kwargs: Any) -> None:
    """Where a run's task messages went: ``<ms> <pid> <event> <task> epoch <n> [branches]``."""
    if not isinstance(kwargs, dict) or not isinstance(kwargs.get("run_id"), str):
        return
    what = f"{int(time.time() * 1000)} {os.getpgrp()} {event} {name.rsplit('.', 1)[-1]} epoch {kwargs.get('epoch')}"
    if kwargs.get("branches") is not None:
        what += f" branches {kwargs.get('branches')}"
    _redis.rpush(trace_key(settings.key_prefix, kwargs["run_id"]), what)


@task_received.connect
def _received(sender: Any = None, request: Any = None, **_: Any) -> None:
    if _ours(getattr(sender, "app", None)):
        _trace("received", str(getattr(request, "name", "")), getattr(request, "kwargs", None))


@task_prerun.connect
def _started(task: Any = None, kwargs: Any = None, **_: Any) -> None:
    if _ours(getattr(task, "app", None)):
        _trace("started", str(getattr(task, "name", "")), kwargs)


@task_postrun.connect
def _finished(task: Any = None, kwargs: Any = None, **_: Any) -> None:
    if _ours(getattr(task, "app", None)):
        _trace("finished", str(getattr(task, "name", "")), kwargs)


def _nap(bounds: list[float]) -> None:
    low, high = bounds
    time.sleep(random.uniform(low, high) / 1000)  # inside a step: never replayed


def _busy(run_id: str, step: str, produce: Callable[[], Any]) -> Any:
    field = f"{run_id}|{step}|{os.getpgrp()}"
    _redis.hset(busy_key(settings.key_prefix), field, int(time.time() * 1000))
    result = produce()
    _redis.hdel(busy_key(settings.key_prefix), field)
    return result


@workflow(
    name="chaos_trip",
    description="The trip, with random sleeps inside every step",
    phases=[{"title": "Book"}, {"title": "Review"}, {"title": "Confirm"}],
)
def chaos_trip(ctx: WorkflowContext) -> Any:
    prefix = settings.key_prefix
    # Milliseconds, [low, high]: each booking sleeps this long before and again
    # after its provider call; review and confirm sleep it once.
    nap = list(ctx.args.get("sleep_ms", [25, 150]))
    ctx.phase("Book")

    def booking(service: str) -> Any:
        def produce() -> dict[str, Any]:
            _nap(nap)
            receipt = book(prefix, service, ctx.idempotency_key(f"book-{service}"))
            _nap(nap)
            return receipt

        return ctx.step(f"book-{service}", lambda: _busy(ctx.run_id, f"book-{service}", produce))

    bookings = ctx.parallel([lambda service=service: booking(service) for service in SERVICES])
    ctx.phase("Review")

    def review() -> dict[str, Any]:
        _nap(nap)
        return {"approved": all(b is not None for b in bookings)}

    approved = ctx.step("review", lambda: _busy(ctx.run_id, "review", review))
    ctx.phase("Confirm")

    def confirm() -> dict[str, Any]:
        _nap(nap)
        return {"confirmed": approved["approved"], "bookings": bookings}

    return ctx.step("confirm", lambda: _busy(ctx.run_id, "confirm", confirm))


engine = Engine(workflows=[chaos_trip], settings=settings)
