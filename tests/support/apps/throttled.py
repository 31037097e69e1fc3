"""Workflows under throttles, for the worker processes the throttle tests
start and kill. What a step does outside the journal (entering, leaving) is
written to Redis lists under the test's key prefix, so the test can see how
many held a slot at once, and in which order they went."""

from __future__ import annotations

import os
import time
from typing import Any

import redis

from celery_durable import Engine, WorkflowContext, workflow


def events_key(prefix: str) -> str:
    return f"{prefix}:test:throttled"


def _note(what: str) -> None:
    """Append "<what> <ms>" to the test's list, and keep the peak of slots held."""
    client = redis.Redis.from_url(os.environ["CELERY_DURABLE_REDIS_URL"])
    prefix = os.environ["CELERY_DURABLE_KEY_PREFIX"]
    try:
        if what.startswith("in "):
            inside = client.incr(f"{prefix}:test:inside")
            client.rpush(f"{prefix}:test:peaks", inside)
        elif what.startswith("out "):
            client.decr(f"{prefix}:test:inside")
        client.rpush(events_key(prefix), f"{what} {int(time.time() * 1000)}")
    finally:
        client.close()


def _work(name: str, seconds: float) -> str:
    _note(f"in {name}")
    time.sleep(seconds)  # the work the slot is held for (not a synchronisation)
    _note(f"out {name}")
    return name


@workflow(name="slot-run", description="A run that holds its run's slot while it works", phases=[])
def slot_run(ctx: WorkflowContext) -> Any:
    return ctx.step("work", lambda: _work(ctx.args["name"], float(ctx.args.get("seconds", 0.3))))


@workflow(name="slot-op", description="A throttled step, in a run that is not", phases=[])
def slot_op(ctx: WorkflowContext) -> Any:
    name, seconds = ctx.args["name"], float(ctx.args.get("seconds", 0.3))
    return ctx.step("work", lambda: _work(name, seconds), throttle="api", throttle_key=ctx.args.get("key"))


@workflow(name="slot-wait", description="Holds its run's slot until told to go", phases=[])
def slot_wait(ctx: WorkflowContext) -> Any:
    ctx.step("in", lambda: _note(f"in {ctx.args['name']}") or "in")
    payload = ctx.wait_for_signal("go").payload
    ctx.step("out", lambda: _note(f"out {ctx.args['name']}") or "out")
    return payload


engine = Engine(workflows=[slot_run, slot_op, slot_wait])
celery_app = engine.celery
