"""Case 14: the replay check before a deploy (SPEC §8a): ``check_replay``
over many runs in flight, each waiting for a signal after n journaled steps.

The runs are built through the engine's real scripts, without the fleet:
an engine of its own (a key prefix no worker sweeps, a sender that keeps its
messages instead of publishing them) starts them, and each run's first
coordinator pass is run in this process by the task body a worker would run
(``tasks.entry.run_durable_task``): n steps inline, then the wait. Then
``Client.check_replay()`` — what ``celery-durable replay-check`` calls —
replays every run against the registered code, reading and writing nothing
else, on one process.

Baseline: none; the issue asks for 1,000 runs of 50 steps in under 10 s.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from benchmarks.cases.common import KeptSender, fmt_int
from benchmarks.harness import Bench
from benchmarks.model import CaseResult, Row, Target, median
from benchmarks.plan import Plan
from celery_durable import Engine, WorkflowContext, define_workflow
from celery_durable.tasks.entry import run_durable_task

CASE = "14. Replay check"
LIMIT_S = 10.0
PREFIX = "benchcheck"
BUILD_THREADS = 8
META = {"name": "bench.check", "description": "n steps, then waits for the signal 'go'", "phases": []}


def waits_after_steps(ctx: WorkflowContext) -> Any:
    for i in range(int(ctx.args["n"])):
        ctx.step(f"step-{i}", lambda i=i: i)
    return ctx.wait_for_signal("go").payload


def inserted_step(ctx: WorkflowContext) -> Any:
    ctx.step("audit", lambda: "new")  # unguarded: every run in flight diverges at its first call
    return waits_after_steps(ctx)



def _engine(bench: Bench, run: Any) -> tuple[Engine, KeptSender]:
    settings = bench.settings.model_copy(update={"key_prefix": PREFIX, "coordinator_queue": f"{PREFIX}.unserved"})
    engine = Engine([define_workflow(META, run)], settings)
    kept = KeptSender()
    engine.sender = kept
    return engine, kept


def _build(engine: Engine, kept: KeptSender, runs: int, steps: int) -> list[str]:
    """``runs`` runs, each with ``steps`` journaled steps, waiting for 'go'."""
    client = engine.client()
    with ThreadPoolExecutor(BUILD_THREADS) as pool:
        run_ids = list(pool.map(lambda _: client.start_workflow("bench.check", args={"n": steps}), range(runs)))
        firsts = list(kept.sent)
        kept.sent.clear()
        list(pool.map(lambda message: run_durable_task(engine, message.task, message.task_id, message.kwargs), firsts))
    waiting = sum(1 for run_id in run_ids if client.get_workflow_run(run_id).snapshot["waiting_for"])
    if waiting != runs:
        raise RuntimeError(f"{runs - waiting} of {runs} runs did not reach their wait")
    return run_ids


def _forget(bench: Bench) -> None:
    keys = list(bench.raw.scan_iter(match=f"{PREFIX}*", count=1000))
    for start in range(0, len(keys), 1000):
        bench.raw.delete(*keys[start : start + 1000])


def run(bench: Bench, plan: Plan) -> CaseResult:
    runs, steps = plan.check_runs, plan.check_steps
    result = CaseResult(
        key="replay_check",
        title="Replay check: check_replay over the runs in flight, before a deploy",
        setup=f"{fmt_int(runs)} runs waiting for a signal after {steps} journaled steps each, built through the "
        f"real scripts in-process; Client.check_replay() over all of them, {plan.repeat} times, on one process "
        "(no worker involved); then once with an unguarded step inserted, where every run diverges.",
    )
    engine, kept = _engine(bench, waits_after_steps)
    try:
        built = time.perf_counter()
        _build(engine, kept, runs, steps)
        build_seconds = time.perf_counter() - built
        client = engine.client()
        samples: list[float] = []
        for _ in range(plan.repeat):
            started = time.perf_counter()
            checks = client.check_replay(limit=runs)
            samples.append(time.perf_counter() - started)
            if len(checks) != runs or any(check.verdict != "ok" for check in checks):
                raise RuntimeError(f"expected {runs} runs ok, got {[check.verdict for check in checks][:5]}...")
        changed, _ = _engine(bench, inserted_step)
        started = time.perf_counter()
        diverged = changed.client().check_replay(limit=runs)
        diverge_seconds = time.perf_counter() - started
        if len(diverged) != runs or any(check.verdict != "diverges" for check in diverged):
            raise RuntimeError("an inserted step did not make every run diverge")
    finally:
        _forget(bench)
    per_run_ms = 1000 * median(samples) / runs
    result.rows = [
        Row(CASE, f"check_replay, {fmt_int(runs)} runs x {steps} journaled steps", "s", samples,
            target=Target(f"< {LIMIT_S:.0f} s", LIMIT_S) if runs >= 1_000 else None,
            note=f"{per_run_ms:.2f} ms per run, {1e6 * median(samples) / (runs * steps):.0f} us per journaled step"),
        Row(CASE, "the same runs, every one diverging at its first call", "s", [diverge_seconds]),
    ]
    result.details = {
        "runs": runs,
        "steps": steps,
        "check_seconds": samples,
        "diverge_seconds": diverge_seconds,
        "build_seconds": build_seconds,
    }
    return result
