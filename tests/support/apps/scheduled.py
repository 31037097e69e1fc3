"""An engine whose workers fire schedules, for tests/test_schedule_workers.py.

``CD_TEST_SCHEDULE_DIE_AT`` makes the worker kill itself (SIGKILL, by its own
pid) the first time it fires a tick, once (``CD_TEST_SCHEDULE_DIE_MARK``, a
file it writes first): ``start`` between the claim and the run's start,
``record`` between the start and the tick's record. The sweep starts a
batch's ticks together (``firing.start_ticks``); a trigger's one by one
(``firing.start_tick``): both die so.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

from celery_durable import Engine, WorkflowContext, workflow
from celery_durable.schedules import firing


@workflow(name="tick-stamp", description="Says which tick started it", phases=[])
def stamp(ctx: WorkflowContext) -> Any:
    at = ctx.scheduled_at
    return {"schedule": ctx.schedule_id, "at": at.isoformat() if at else None}


def _die_once() -> None:
    mark = Path(os.environ["CD_TEST_SCHEDULE_DIE_MARK"])
    if not mark.exists():
        mark.write_text(str(os.getpid()))
        os.kill(os.getpid(), signal.SIGKILL)


DIE_AT = os.environ.get("CD_TEST_SCHEDULE_DIE_AT")
if DIE_AT:
    _start = firing.start_tick

    def _dying_start(*args: Any) -> str:
        if DIE_AT == "start":
            _die_once()
        run_id = _start(*args)
        if DIE_AT == "record":
            _die_once()
        return run_id

    _start_all = firing.start_ticks

    def _dying_start_all(engine: Any, firings: Any) -> list[bool]:
        ticks = any(one.to_start for one in firings)
        if ticks and DIE_AT == "start":
            _die_once()
        started = _start_all(engine, firings)
        if ticks and DIE_AT == "record":
            _die_once()
        return started

    firing.start_tick = _dying_start  # type: ignore[assignment]
    firing.start_ticks = _dying_start_all

engine = Engine(workflows=[stamp])
celery_app = engine.celery
