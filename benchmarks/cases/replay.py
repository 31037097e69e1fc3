"""Case 5: resuming a run with n journaled steps, until its first new step starts.

Each size gets one run that journals n steps and then fails in a tail step
(``bench.replay``). Every ``resume_workflow`` replays the n steps from the
journal (all hits, no producer runs) and re-runs the failed tail, which
writes ``time.time()`` under the attempt's number to Redis before failing
again, so one journal serves every repeat. The figure is that mark minus the
moment ``resume_workflow`` was called: epoch bump, coordinator message,
journal read and replay of n steps.

Plain Celery has no replay, so there is no baseline; the check is that the
cost grows linearly with n.
"""

from __future__ import annotations

import itertools
import time

from benchmarks.app import TAIL_MARK_PREFIX
from benchmarks.cases.common import fmt_int
from benchmarks.harness import Bench
from benchmarks.model import CaseResult, Row, Target, median
from benchmarks.plan import Plan

CASE = "5. Replay"
FIRST_NEW_LIMIT_S = 1.0
LINEAR_SLACK = 1.5
"""Growth from the smallest to the largest size may exceed the size ratio by
this much (fixed costs only make it smaller); quadratic growth would exceed
it by the size ratio itself (10x from 1,000 to 10,000)."""


def _journal(bench: Bench, n: int, timeout: float) -> str:
    """A run with n journaled steps that stopped in error at its tail step."""
    run_id = bench.client.start_workflow("bench.replay", args={"n": n})
    envelope = bench.client.wait_for_workflow_run(run_id, timeout=timeout)
    if envelope.status != "error" or not envelope.can_resume:
        raise RuntimeError(f"replay run {run_id} should stop in a resumable error, got {envelope.status}")
    return run_id


def _resume(bench: Bench, run_id: str, timeout: float) -> tuple[float, float]:
    """(seconds to the first new step, seconds to settled) of one resume."""
    started = time.time()
    envelope = bench.client.resume_workflow(run_id, timeout=timeout)
    settled = time.time() - started
    mark = bench.raw.get(f"{TAIL_MARK_PREFIX}:{run_id}:{envelope.attempt}")
    if mark is None:
        raise RuntimeError(f"resume of {run_id} (attempt {envelope.attempt}) never reached its tail step")
    return float(mark) - started, settled


def run(bench: Bench, plan: Plan) -> CaseResult:
    sizes = plan.replay_sizes
    result = CaseResult(
        key="replay",
        title="Replay: resume_workflow on a run with n journaled steps, until its first new step starts",
        setup=f"Journals of {', '.join(fmt_int(n) for n in sizes)} steps, each resumed {plan.repeat} times "
        "(every resume replays all n steps, then re-runs the failed tail step).",
    )
    runs = {n: _journal(bench, n, plan.timeout) for n in sizes}
    _resume(bench, runs[sizes[0]], plan.timeout)  # warm-up: scripts loaded, worker threads busy once
    first_new: dict[int, list[float]] = {n: [] for n in sizes}
    settled: dict[int, list[float]] = {n: [] for n in sizes}
    for _ in range(plan.repeat):
        for n in sizes:
            to_first, to_settled = _resume(bench, runs[n], plan.timeout)
            first_new[n].append(to_first)
            settled[n].append(to_settled)
    smallest, largest = sizes[0], sizes[-1]
    for n in sizes:
        target = Target(f"< {FIRST_NEW_LIMIT_S:.0f} s", FIRST_NEW_LIMIT_S) if n == largest else None
        result.rows.append(Row(
            CASE, f"resume -> first new step, {fmt_int(n)} journaled steps", "s", first_new[n], target=target,
            note=f"{1e6 * median(first_new[n]) / n:.0f} us per journaled step",
        ))
    growth = median(first_new[largest]) / median(first_new[smallest])
    limit = LINEAR_SLACK * largest / smallest
    result.rows.append(Row(
        CASE, f"growth {fmt_int(smallest)} -> {fmt_int(largest)} steps", "x", [growth],
        target=Target(f"<= {limit:.0f}x (linear; quadratic would be ~{(largest / smallest) ** 2:.0f}x)", limit),
    ))
    result.details = {
        "first_new_step_s": {str(n): first_new[n] for n in sizes},
        "resume_to_settled_s": {str(n): settled[n] for n in sizes},
        "marginal_us_per_step": {
            f"{a}->{b}": 1e6 * (median(first_new[b]) - median(first_new[a])) / (b - a)
            for a, b in itertools.pairwise(sizes)
        },
    }
    return result
