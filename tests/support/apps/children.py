"""A parent fanning out to children that compensate, for worker processes the
children's crash tests start and kill.

Effects are counted in Redis under ``<key_prefix>:effects`` (field
``<run id>:<what>``), apart from the journal: a step counts its effect once
it has happened, so a step killed before its effect and run again counts
one. A compensation can be held at a gate (``<key_prefix>:gate:<run id>``)
that the test opens; it says it got there in ``<key_prefix>:reached``.
"""

from __future__ import annotations

import time
from typing import Any

from celery_durable import Engine, Settings, WorkflowContext, workflow
from tests.support.apps import side_redis

settings = Settings()
_redis = side_redis(settings)


def effects_key(prefix: str) -> str:
    return f"{prefix}:effects"


def reached_key(prefix: str) -> str:
    return f"{prefix}:reached"


def gate_key(prefix: str, run_id: str) -> str:
    return f"{prefix}:gate:{run_id}"


def effect(run_id: str, what: str) -> str:
    _redis.hincrby(effects_key(settings.key_prefix), f"{run_id}:{what}", 1)
    return what


def held(run_id: str, what: str) -> str:
    """Say we got here, wait for the gate, then have the effect."""
    _redis.sadd(reached_key(settings.key_prefix), run_id)
    while not _redis.exists(gate_key(settings.key_prefix, run_id)):
        time.sleep(0.02)
    return effect(run_id, what)


def fail() -> Any:
    raise RuntimeError("no room left")


@workflow(name="kid", description="Books two things and undoes them when its last step fails", phases=[])
def kid(ctx: WorkflowContext) -> Any:
    rid = ctx.run_id
    ctx.step("start", lambda: effect(rid, "start"))
    with ctx.saga() as saga:
        ctx.step("book-a", lambda: effect(rid, "book-a"))
        saga.compensate("undo-a", lambda: held(rid, "undo-a") if ctx.args.get("hold") else effect(rid, "undo-a"))
        ctx.step("book-b", lambda: effect(rid, "book-b"))
        saga.compensate("undo-b", lambda: effect(rid, "undo-b"))
        if ctx.args.get("fail"):
            ctx.step("fail", fail)
    return ctx.args["i"]


@workflow(name="family", description="Waits for its kids in parallel", phases=[])
def family(ctx: WorkflowContext) -> Any:
    size = int(ctx.args.get("kids", 3))
    return ctx.parallel(
        [lambda i=i: ctx.child(f"kid-{i}", "kid", {"i": i, "fail": i == 0, "hold": i == 0}) for i in range(size)]
    )


engine = Engine(workflows=[kid, family], settings=settings)
