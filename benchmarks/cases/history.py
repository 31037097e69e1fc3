"""Case 18: a run's event history (SPEC §4 ``get_workflow_run_history``),
paged over a run of 10,000 journaled steps.

The run is built through the engine's real scripts in this process, as in
``cases/replay_check.py`` (its steps inline in one coordinator pass, then a
wait for a signal, so it is still going). Then the whole history is read
page by page (200 events, the default), as ``celery-durable runs history``
and the web view do: the first page derives the events from the run's
facts; the next ones are cut from the events kept while the facts stand
still (``history._Derived``), and only a page's previews are read.
"First page, cold" empties that cache before each sample: what a new client
process pays once per run and change.

Baseline: none; the issue asks for under 100 ms a page.
"""

from __future__ import annotations

import time
from typing import Any

from benchmarks.cases.common import KeptSender, fmt_int
from benchmarks.harness import Bench
from benchmarks.model import CaseResult, Row, Target
from benchmarks.plan import Plan
from celery_durable import Engine, WorkflowContext, define_workflow, history
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


def run(bench: Bench, plan: Plan) -> CaseResult:
    steps = plan.history_steps
    # The default page (200); a quick run's few steps in smaller pages, so
    # that there are later pages to time (200 steps could fit one page).
    limit = 200 if steps >= 1000 else max(1, steps // 4)
    result = CaseResult(
        key="history",
        title="Run history: get_workflow_run_history over a long run, page by page",
        setup=f"one run of {fmt_int(steps)} journaled steps waiting for a signal, built through the real scripts "
        f"in-process; its whole history read in pages of 200, {plan.repeat} times; the first page also with "
        "the derived events dropped first (cold).",
    )
    try:
        engine, run_id = _build(bench, steps)
        client = engine.client()
        cold: list[float] = []
        pages: list[float] = []
        events = 0
        for _ in range(plan.repeat):
            history._DERIVED = history._Derived()
            started = time.perf_counter()
            page = client.get_workflow_run_history(run_id, limit=limit)
            cold.append(1000 * (time.perf_counter() - started))
            events = len(page.events)
            while page.next is not None:
                started = time.perf_counter()
                page = client.get_workflow_run_history(run_id, after=page.next, limit=limit)
                pages.append(1000 * (time.perf_counter() - started))
                events += len(page.events)
        if events < steps:
            raise RuntimeError(f"{events} events for {steps} steps")
    finally:
        _forget(bench)
    target = Target(f"< {LIMIT_MS:.0f} ms", LIMIT_MS) if steps >= 10_000 else None
    result.rows = [
        Row(CASE, f"a page of {limit} events, {fmt_int(steps)}-step run", "ms", pages, target=target,
            note=f"{len(pages)} pages, max {max(pages):.1f} ms"),
        Row(CASE, "the first page, cold (the run's events derived)", "ms", cold, target=target),
    ]
    result.details = {"steps": steps, "events": events, "page_ms": pages, "cold_ms": cold}
    return result
