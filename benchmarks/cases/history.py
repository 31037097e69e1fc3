"""Case 18: a run's event history (SPEC §3 ``get_workflow_run_history``),
paged over a small run and a long one.

Each run is built through the engine's real scripts in this process, as in
``cases/replay_check.py`` (its steps inline in one coordinator pass, then a
wait for a signal, so it is still going). Then the whole history is read
page by page (200 events, the default), as ``celery-durable runs history``
and the web view do. The history is a record: every event was numbered by
the script that wrote it, so a page is one read of 200 entries by number
and one of the values it previews. What Redis spent on each page
(``INFO commandstats``: the script and the reads it ran) must not grow with
the run: the 10,000-step run's pages cost what the 100-step run's do.

Baseline: none; the issue asks for a page's Redis time flat in the run's size.
"""

from __future__ import annotations

import time
from typing import Any

from benchmarks.cases.common import KeptSender, fmt_int
from benchmarks.harness import Bench
from benchmarks.model import CaseResult, Row, Target
from benchmarks.plan import Plan
from benchmarks.redisstats import CommandWindow
from celery_durable import Engine, WorkflowContext, define_workflow
from celery_durable.tasks.entry import run_durable_task

CASE = "18. Run history"
LIMIT_MS = 100.0
PREFIX = "benchhistory"
META = {"name": "bench.history", "description": "n steps, then waits for the signal 'go'", "phases": []}


def steps_then_wait(ctx: WorkflowContext) -> Any:
    for i in range(int(ctx.args["n"])):
        ctx.step(f"step-{i}", lambda i=i: {"i": i, "text": "x" * 40})
    return ctx.wait_for_signal("go").payload


def _build(bench: Bench, steps: int) -> tuple[Engine, str]:
    settings = bench.settings.model_copy(update={"key_prefix": PREFIX, "coordinator_queue": f"{PREFIX}.unserved"})
    engine = Engine([define_workflow(META, steps_then_wait)], settings)
    kept = KeptSender()
    engine.sender = kept
    run_id = engine.client().start_workflow("bench.history", args={"n": steps})
    first = kept.sent.pop()
    run_durable_task(engine, first.task, first.task_id, first.kwargs)
    if engine.client().get_workflow_run(run_id).snapshot["steps_done"] != steps:
        raise RuntimeError("the run did not journal its steps")
    return engine, run_id


def _forget(bench: Bench) -> None:
    keys = list(bench.raw.scan_iter(match=f"{PREFIX}*", count=1000))
    for start in range(0, len(keys), 1000):
        bench.raw.delete(*keys[start : start + 1000])


FLAT_LIMIT = 50
"""The page whose Redis time is compared between the two runs: both have full pages of it."""


def _pages(bench: Bench, engine: Engine, run_id: str, limit: int, repeat: int) -> tuple[list[float], list[float], int]:
    """Every page of the run's history, ``repeat`` times: each page's wall ms, each full page's Redis µs,
    and the events."""
    client = engine.client()
    wall: list[float] = []
    server: list[float] = []
    events = 0
    for _ in range(repeat):
        after, events = None, 0
        while True:
            with CommandWindow(bench.raw) as window:
                started = time.perf_counter()
                page = client.get_workflow_run_history(run_id, after=after, limit=limit)
                wall.append(1000 * (time.perf_counter() - started))
            if len(page.events) == limit:
                server.append(window.commands.total_usec)
            events += len(page.events)
            if page.next is None:
                break
            after = page.next
    return wall, server, events


def run(bench: Bench, plan: Plan) -> CaseResult:
    steps = plan.history_steps
    small = min(100, steps)
    limit = 200 if steps >= 1000 else max(1, steps // 4)
    result = CaseResult(
        key="history",
        title="Run history: get_workflow_run_history page by page, a small run against a long one",
        setup=f"runs of {fmt_int(small)} and {fmt_int(steps)} journaled steps waiting for a signal, built "
        f"through the real scripts in-process; each whole history read in pages of {limit}, {plan.repeat} times; "
        "Redis time per page from INFO commandstats.",
    )
    details: dict[str, Any] = {}
    rows: list[Row] = []
    try:
        for size in (small, steps):
            engine, run_id = _build(bench, size)
            wall, _, events = _pages(bench, engine, run_id, limit, plan.repeat)
            _, server, _ = _pages(bench, engine, run_id, min(FLAT_LIMIT, limit), plan.repeat)
            if events < size:
                raise RuntimeError(f"{events} events for {size} steps")
            target = Target(f"< {LIMIT_MS:.0f} ms", LIMIT_MS) if size >= 10_000 else None
            rows.append(Row(CASE, f"a page of {limit} events, {fmt_int(size)}-step run", "ms", wall, target=target,
                            note=f"{len(wall)} pages, max {max(wall):.1f} ms"))
            rows.append(Row(CASE, f"Redis time of a page of {min(FLAT_LIMIT, limit)}, {fmt_int(size)}-step run", "µs",
                            server, note=f"{len(server)} full pages, max {max(server):.0f} µs"))
            details[str(size)] = {"events": events, "page_ms": wall, "redis_us": server}
            _forget(bench)
    finally:
        _forget(bench)
    result.rows = rows
    result.details = details
    return result
