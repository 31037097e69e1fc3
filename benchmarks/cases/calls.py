"""Case 13: ``ctx.call`` of a plain Celery task vs calling that task from plain Celery.

A call is a journaled step that runs on the fleet as an ordinary task
(SPEC §5a): the run publishes the task linked to the engine's answer task and
suspends, holding no worker slot. The worker here runs the task and consumes
the coordinator queue, so it answers the call in place (``tasks/in_place.py``):
it journals the result and goes on with the body it kept parked at the call.
Per call that is one message, as for ``delay().get()``, plus the journal's
scripts, and everything on the durable side happens in the worker process,
where the plain side publishes and collects from the benchmark's own process.
The durable side may cost more, but not much more: an application that moves
its task calls into a workflow should not pay for durability in latency.

Both sides call the same ``bench.noop`` task, routed the same way (no
``queue=``: the app's default queue, which the fleet consumes), on the same
workers. The no-op task keeps its result (the plain side reads it from the
backend), so the durable side stores one it never reads: a cost it shares
with any task that is also called from plain Celery.
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable

from celery import Task, group

from benchmarks.cases.common import (
    CELERY,
    DURABLE,
    flush_results,
    fmt_int,
    measured,
    sides,
    time_canvas,
    usage_summary,
)
from benchmarks.harness import Bench
from benchmarks.model import CaseResult, Row, Target, median
from benchmarks.plan import Plan
from benchmarks.probes import Usage
from celery_durable import RunEnvelope, StepRow

PROFILE_DURABLE_ONLY = True
"""--py-spy records only the durable measurements of this case."""
CASE = "13. Calls"
SEQUENTIAL_LIMIT = 1.5
PARALLEL_LIMIT = 1.3
WARM_UP = 10
SEQUENTIAL = "sequential"
PARALLEL = "parallel"

Timed = Callable[[], float]
Samples = dict[str, list[float]]
Usages = dict[str, list[Usage]]


def run(bench: Bench, plan: Plan) -> CaseResult:
    n, width = plan.calls_sequential, plan.calls_width
    result = CaseResult(
        key="calls",
        title=f"Calls: {fmt_int(n)} ctx.calls of a plain no-op task in a row vs {fmt_int(n)} delay().get(); "
        f"a parallel of {fmt_int(width)} calls vs a group of {fmt_int(width)}",
        setup=f"Durable: one workflow calling ctx.call(f'c{{i}}', 'bench.noop') {fmt_int(n)} times in a loop; one "
        f"whose ctx.parallel has {fmt_int(width)} branches of one ctx.call each. Celery: bench.noop.delay().get() "
        f"{fmt_int(n)} times from the benchmark process; group(bench.noop.si() x {fmt_int(width)}), results "
        "collected. Time from start to the client holding the outcome.",
    )
    _warm_up(bench, plan)
    times: dict[str, Samples] = {}
    usages: dict[str, Usages] = {}
    runs: dict[str, list[RunEnvelope]] = {SEQUENTIAL: [], PARALLEL: []}
    times[SEQUENTIAL], usages[SEQUENTIAL] = _compare(
        bench, plan.repeat,
        functools.partial(_durable, bench, "bench.calls", n, plan.timeout, runs[SEQUENTIAL]),
        lambda: _delays(bench.noop, n, plan.timeout),
    )
    times[PARALLEL], usages[PARALLEL] = _compare(
        bench, plan.repeat,
        functools.partial(_durable, bench, "bench.call-fanout", width, plan.timeout, runs[PARALLEL]),
        lambda: time_canvas(group(bench.noop.si() for _ in range(width)), plan.timeout),
    )
    result.rows = _rows(times, n, width)
    sizes = {SEQUENTIAL: n, PARALLEL: width}
    phases = {
        SEQUENTIAL: _median_phases([_sequential_phases(_call_rows(bench, e)) for e in runs[SEQUENTIAL]]),
        PARALLEL: _median_phases([_parallel_phases(e, _call_rows(bench, e)) for e in runs[PARALLEL]]),
    }
    result.details = {
        label: {side: usage_summary(usages[label][side]) for side in (DURABLE, CELERY)} for label in sizes
    }
    result.details["worker_cpu_ms_per_call"] = {
        label: {side: 1000 * result.details[label][side]["cpu_seconds"] / size for side in (DURABLE, CELERY)}
        for label, size in sizes.items()
    }
    result.details["durable_ms_by_phase"] = phases
    result.notes += [
        f"Where the durable {label} run's time goes (ms timestamps of its call rows, median of the runs): "
        + ", ".join(f"{name} {ms:.1f} ms" for name, ms in phases[label].items())
        for label in sizes
    ]
    result.notes += [_miss_note(row, times[label], usages[label], sizes[label])
                     for row, label in zip(_judged(result.rows), sizes, strict=True) if row.verdict == "MISS"]
    return result


def _warm_up(bench: Bench, plan: Plan) -> None:
    """One small run of each side first, so neither pays for imports and connections."""
    bench.run("bench.calls", {"n": WARM_UP}, plan.timeout)
    bench.run("bench.call-fanout", {"n": WARM_UP}, plan.timeout)
    _delays(bench.noop, WARM_UP, plan.timeout)
    time_canvas(group(bench.noop.si() for _ in range(WARM_UP)), plan.timeout)
    flush_results(bench)


def _durable(bench: Bench, workflow: str, n: int, timeout: float, runs: list[RunEnvelope]) -> float:
    """One run of ``workflow`` with ``n`` calls: its seconds; its envelope goes to ``runs``."""
    seconds, envelope = bench.run(workflow, {"n": n}, timeout)
    runs.append(envelope)
    return seconds


def _delays(task: Task, n: int, timeout: float) -> float:
    """Seconds for ``n`` round trips ``task.delay().get()``, one after another."""
    started = time.perf_counter()
    for _ in range(n):
        task.delay().get(timeout=timeout)
    return time.perf_counter() - started


def _compare(bench: Bench, repeat: int, durable: Timed, celery: Timed) -> tuple[Samples, Usages]:
    """Both sides ``repeat`` times, alternating which goes first.

    Stored task results are dropped after every run, the durable side's too:
    its called tasks keep theirs, and db 1 should not grow from run to run.
    """
    times: Samples = {DURABLE: [], CELERY: []}
    usages: Usages = {DURABLE: [], CELERY: []}
    for r in range(repeat):
        for side in sides(r):
            seconds, usage = measured(bench, durable if side == DURABLE else celery, side)
            flush_results(bench)
            times[side].append(seconds)
            usages[side].append(usage)
    return times, usages


def _rows(times: dict[str, Samples], n: int, width: int) -> list[Row]:
    sequential, parallel = times[SEQUENTIAL], times[PARALLEL]
    return [
        Row(CASE, f"{fmt_int(n)} calls in a row vs {fmt_int(n)} delay().get()", "s",
            sequential[DURABLE], sequential[CELERY],
            Target(f"<= {SEQUENTIAL_LIMIT}x delay().get() in a row", SEQUENTIAL_LIMIT), judge_ratio=True),
        Row(CASE, "time per call in a row (time / n)", "ms", [1000 * t / n for t in sequential[DURABLE]],
            [1000 * t / n for t in sequential[CELERY]],
            note="a call: publish, the task, its answer journaled where it ran, the kept body going on"),
        Row(CASE, f"parallel of {fmt_int(width)} calls vs group of {fmt_int(width)}", "s",
            parallel[DURABLE], parallel[CELERY],
            Target(f"<= {PARALLEL_LIMIT}x the group", PARALLEL_LIMIT), judge_ratio=True),
        Row(CASE, f"time per item at {fmt_int(width)}", "ms", [1000 * t / width for t in parallel[DURABLE]],
            [1000 * t / width for t in parallel[CELERY]]),
    ]


def _call_rows(bench: Bench, envelope: RunEnvelope) -> list[StepRow]:
    """The run's call rows, in the order of their keys' numbers (c0, c1, ... or p0, p1, ...)."""
    steps = bench.client.get_workflow_run_detail(envelope.run_id).steps
    return sorted(steps, key=lambda step: int(step.key[1:]))


def _sequential_phases(steps: list[StepRow]) -> dict[str, float]:
    """A call in a row, split in two: the task's round trip (published to
    answer journaled) and the run's (answer journaled to the next call
    published: the wake, and a pass that replays every call before it),
    the latter also for the first and the last tenth of the calls."""
    started, finished = _stamps(steps)
    trip = [f - s for s, f in zip(started, finished, strict=True)]
    resume = [s - f for f, s in zip(finished, started[1:], strict=False)]
    tenth = max(1, len(resume) // 10)
    return {
        "published -> answer journaled": 1000 * median(trip),
        "answer journaled -> next call published": 1000 * median(resume),
        "the same, first tenth of the calls": 1000 * median(resume[:tenth]),
        "the same, last tenth": 1000 * median(resume[-tenth:]),
    }


def _parallel_phases(envelope: RunEnvelope, steps: list[StepRow]) -> dict[str, float]:
    """The fan-out of calls: how long publishing all of them took, a call's
    round trip, and the barrier from the last answer to the run's end."""
    assert envelope.started_at is not None and envelope.finished_at is not None
    started, finished = _stamps(steps)
    return {
        "run started -> first call published": 1000 * (min(started) - envelope.started_at.timestamp()),
        "first -> last call published": 1000 * (max(started) - min(started)),
        "published -> answer journaled": 1000 * median([f - s for s, f in zip(started, finished, strict=True)]),
        "last answer journaled -> run finished": 1000 * (envelope.finished_at.timestamp() - max(finished)),
    }


def _stamps(steps: list[StepRow]) -> tuple[list[float], list[float]]:
    """Epoch seconds each call was published and its answer journaled."""
    started = [step.started_at.timestamp() for step in steps if step.started_at is not None]
    finished = [step.finished_at.timestamp() for step in steps if step.finished_at is not None]
    if len(started) != len(steps) or len(finished) != len(steps):
        raise RuntimeError("a completed run has a call row without its start or finish time")
    return started, finished


def _median_phases(runs: list[dict[str, float]]) -> dict[str, float]:
    return {name: median([phases[name] for phases in runs]) for name in runs[0]} if runs else {}


def _judged(rows: list[Row]) -> list[Row]:
    """The rows with a target, in the order of ``_rows``: sequential, then parallel."""
    return [row for row in rows if row.target is not None]


def _miss_note(row: Row, times: Samples, usages: Usages, size: int) -> str:
    """How far a comparison missed, and whether the worker's CPU or waiting holds the time.

    With the threads pool every task runs in one worker process under one GIL,
    so worker CPU seconds near the wall time mean the worker is the bottleneck;
    far below it, the time goes to waiting (round trips, messages, polling).
    """
    assert row.target is not None and row.ratio is not None
    over = 100 * (row.ratio / row.target.limit - 1)
    cpu = {side: median([u.cpu_seconds for u in usages[side]]) for side in (DURABLE, CELERY)}
    gc = {side: median([u.gc_seconds for u in usages[side]]) for side in (DURABLE, CELERY)}
    extra_wall = median(times[DURABLE]) - median(times[CELERY])
    extra_cpu = cpu[DURABLE] - cpu[CELERY]
    share = 100 * extra_cpu / extra_wall if extra_wall > 0 else math.nan
    where = "the worker's CPU" if share >= 50 else "waiting (messages, round trips), not the worker's CPU"
    return (
        f"MISS {row.figure}: {row.ratio:.2f}x, {over:.0f}% above the {row.target.limit}x target. The durable side "
        f"took {extra_wall:.1f} s longer; its worker used {extra_cpu:.1f} s more CPU ({share:.0f}% of that), "
        f"{cpu[DURABLE]:.1f} s in all vs {cpu[CELERY]:.1f} s ({1000 * cpu[DURABLE] / size:.1f} vs "
        f"{1000 * cpu[CELERY] / size:.1f} ms per call), of which the garbage collector {gc[DURABLE]:.1f} s vs "
        f"{gc[CELERY]:.1f} s: the extra time is mostly {where}."
    )
