"""Case 1: a workflow of n no-op steps vs a Celery chain of n no-op tasks.

Straight-line steps run inline in the coordinator, one fenced journal write
per step and no broker hop, so the durable run should take well under the
chain's time, where every link is a message and a stored result.
"""

from __future__ import annotations

from celery import chain

from benchmarks.cases.common import CELERY, DURABLE, fmt_int, measured, sides, time_canvas, usage_summary
from benchmarks.harness import Bench
from benchmarks.model import CaseResult, Row, Target
from benchmarks.plan import Plan
from benchmarks.probes import Usage

PROFILE_DURABLE_ONLY = True
"""--py-spy records only the durable measurements of this case."""
CASE = "1. Sequential"


def run(bench: Bench, plan: Plan) -> CaseResult:
    n = plan.sequential_steps
    result = CaseResult(
        key="sequential",
        title=f"Sequential: {fmt_int(n)} no-op steps vs a chain of {fmt_int(n)} no-op tasks",
        setup="Durable: one workflow whose body calls ctx.step n times. Celery: chain(noop.si() x n) and "
        "waiting for its last result. Time from start to the client holding the outcome.",
    )
    bench.run("bench.sequential", {"n": 10})
    time_canvas(chain(*(bench.noop.si() for _ in range(10))), plan.timeout)
    times: dict[str, list[float]] = {DURABLE: [], CELERY: []}
    usages: dict[str, list[Usage]] = {DURABLE: [], CELERY: []}
    for r in range(plan.repeat):
        for side in sides(r):
            if side == DURABLE:
                seconds, usage = measured(bench, lambda: bench.run("bench.sequential", {"n": n}, plan.timeout)[0])
            else:
                canvas = chain(*(bench.noop.si() for _ in range(n)))
                seconds, usage = measured(bench, lambda canvas=canvas: time_canvas(canvas, plan.timeout), CELERY)
            times[side].append(seconds)
            usages[side].append(usage)
    durable, celery = times[DURABLE], times[CELERY]
    result.rows = [
        Row(CASE, f"{fmt_int(n)} steps vs chain of {fmt_int(n)}", "s", durable, celery,
            Target("<= 0.5x the chain", 0.5), judge_ratio=True),
        Row(CASE, "journaled steps per second", "steps/s", [n / t for t in durable], [n / t for t in celery],
            Target(">= 2,000 steps/s", 2000, at_most=False)),
        Row(CASE, "per-step overhead (time / n)", "ms", [1000 * t / n for t in durable],
            [1000 * t / n for t in celery],
            note="DBOS quotes 1-2 ms per step on Postgres; includes one start and one completion, amortized"),
    ]
    result.details = {side: usage_summary(usages[side]) for side in (DURABLE, CELERY)}
    result.details["worker_cpu_ms_per_step"] = {
        side: 1000 * result.details[side]["cpu_seconds"] / n for side in (DURABLE, CELERY)
    }
    return result
