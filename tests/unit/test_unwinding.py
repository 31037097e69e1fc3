"""An execution that unwinds leaves no reference cycles behind.

The engine keeps the exceptions that end a pass or a branch (``Suspend``, a
cursor's ``BranchSuspended``, ``BranchFinished``) to raise them again; their
tracebacks hold the frames they unwound, and those frames the replay that
holds the exception. Left in place, every branch woken in a fan-out of task
calls made a hundred-odd objects only the cyclic GC could free, and a
worker spent a tenth of its CPU in full collections.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import redis

from celery_durable import WorkflowContext, workflow
from celery_durable.broker.connection import script_source
from celery_durable.broker.ops import SCRIPT_NAMES
from celery_durable.testing.server import environment_redis_url
from tests.unit.harness import Driver


@workflow(name="nappers", description="Branches that wait, then finish", phases=[])
def nappers(ctx: WorkflowContext) -> Any:
    def napper(i: int) -> Any:
        ctx.sleep(60)
        return ctx.step(f"woke-{i}", lambda: i)

    return ctx.parallel([lambda i=i: napper(i) for i in range(4)])


@contextmanager
def engine_frames_left_to_the_cyclic_gc() -> Iterator[list[str]]:
    """The engine's frames that only a collection of cycles would free."""
    found: list[str] = []
    gc.collect()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        yield found
        gc.collect()
        found += [
            f"{obj.f_code.co_name} ({obj.f_code.co_filename})"
            for obj in gc.garbage
            if type(obj).__name__ == "frame" and "celery_durable" in obj.f_code.co_filename
        ]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()


def test_suspended_branches_and_passes_leave_no_frames_in_cycles() -> None:
    # Outside the count: the server's start polls a port until it answers, and
    # a fresh server's first call of each script meets NOSCRIPT, kept a while
    # by redis-py's retry (a one-off of each process, not of an execution).
    server = redis.Redis.from_url(environment_redis_url())
    for name in SCRIPT_NAMES:
        server.script_load(script_source(name))
    server.close()
    with engine_frames_left_to_the_cyclic_gc() as frames:
        driver = Driver.of(nappers)
        assert driver.main() is None  # Suspend: the pass waits for its branches
        assert driver.deliver_branches() == [False] * 4  # each branch waits: BranchSuspended
        driver.advance(60)
        assert driver.deliver_branches()[-1] is True  # each branch finishes: BranchFinished
        settlement = driver.main()
        assert settlement is not None and settlement.result_json == "[0,1,2,3]"
        del driver, settlement
    assert frames == []
