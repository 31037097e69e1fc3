"""Case 3: n items through 3 stages, each stage one no-op step.

``ctx.pipeline`` has no barrier between items: each item is one branch that
runs its three stages in a row. The plain Celery equivalent is a group of n
chains of 3 tasks, collected by the client.
"""

from __future__ import annotations

from celery import chain, group

from benchmarks.cases.common import CELERY, DURABLE, flush_results, fmt_int, measured, sides, time_canvas, usage_summary
from benchmarks.harness import Bench
from benchmarks.model import CaseResult, Row
from benchmarks.plan import Plan
from benchmarks.probes import Usage

PROFILE_DURABLE_ONLY = True
"""--py-spy records only the durable measurements of this case."""
CASE = "3. Pipeline"
STAGES = 3


def _canvas(bench: Bench, n: int) -> group:
    return group(chain(*(bench.noop.si() for _ in range(STAGES))) for _ in range(n))


def run(bench: Bench, plan: Plan) -> CaseResult:
    n = plan.pipeline_items
    result = CaseResult(
        key="pipeline",
        title=f"Pipeline: {fmt_int(n)} items x {STAGES} stages",
        setup=f"Durable: ctx.pipeline(range(n), stage1, stage2, stage3), each stage a ctx.step. "
        f"Celery: group of n chains of {STAGES} no-op tasks, results collected.",
    )
    bench.run("bench.pipeline", {"n": 4})
    time_canvas(_canvas(bench, 4), plan.timeout)
    times: dict[str, list[float]] = {DURABLE: [], CELERY: []}
    usages: dict[str, list[Usage]] = {DURABLE: [], CELERY: []}
    for r in range(plan.repeat):
        for side in sides(r):
            if side == DURABLE:
                seconds, usage = measured(bench, lambda: bench.run("bench.pipeline", {"n": n}, plan.timeout)[0])
            else:
                canvas = _canvas(bench, n)
                seconds, usage = measured(bench, lambda canvas=canvas: time_canvas(canvas, plan.timeout), CELERY)
                flush_results(bench)
            times[side].append(seconds)
            usages[side].append(usage)
    durable, celery = times[DURABLE], times[CELERY]
    result.rows = [
        Row(CASE, f"{fmt_int(n)} items x {STAGES} stages", "s", durable, celery),
        Row(CASE, "items per second (higher is better)", "items/s", [n / t for t in durable],
            [n / t for t in celery]),
    ]
    result.details = {side: usage_summary(usages[side]) for side in (DURABLE, CELERY)}
    return result
