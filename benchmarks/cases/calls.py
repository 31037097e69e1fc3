"""Case 13: ``ctx.call`` of a plain Celery task vs calling that task from plain Celery.

A call is a journaled step that runs on the fleet as an ordinary task
(SPEC §5a): the run publishes the task linked to the engine's answer task and
suspends, holding no worker slot; the answer journals the result and wakes
the run, which replays up to the call and goes on. Per call that is three
messages (the task, its answer on the coordinator queue, the wake) where
``delay().get()`` sends one and reads one stored result, so the durable side
may cost more, but not much more: an application that moves its task calls
into a workflow should not pay for durability in latency.

Both sides call the same ``bench.noop`` task, routed the same way (no
``queue=``: the app's default queue, which the fleet consumes), on the same
workers. The no-op task keeps its result (the plain side reads it from the
backend), so the durable side stores one it never reads: a cost it shares
with any task that is also called from plain Celery.
"""

from __future__ import annotations

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
    times[SEQUENTIAL], usages[SEQUENTIAL] = _compare(
        bench, plan.repeat,
        lambda: bench.run("bench.calls", {"n": n}, plan.timeout)[0],
        lambda: _delays(bench.noop, n, plan.timeout),
    )
    times[PARALLEL], usages[PARALLEL] = _compare(
        bench, plan.repeat,
        lambda: bench.run("bench.call-fanout", {"n": width}, plan.timeout)[0],
        lambda: time_canvas(group(bench.noop.si() for _ in range(width)), plan.timeout),
    )
    result.rows = _rows(times, n, width)
    sizes = {SEQUENTIAL: n, PARALLEL: width}
    result.details = {
        label: {side: usage_summary(usages[label][side]) for side in (DURABLE, CELERY)} for label in sizes
    }
    result.details["worker_cpu_ms_per_call"] = {
        label: {side: 1000 * result.details[label][side]["cpu_seconds"] / size for side in (DURABLE, CELERY)}
        for label, size in sizes.items()
    }
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
            note="a call: publish, the task, its answer journaled, the run woken and replayed up to the call"),
        Row(CASE, f"parallel of {fmt_int(width)} calls vs group of {fmt_int(width)}", "s",
            parallel[DURABLE], parallel[CELERY],
            Target(f"<= {PARALLEL_LIMIT}x the group", PARALLEL_LIMIT), judge_ratio=True),
        Row(CASE, f"time per item at {fmt_int(width)}", "ms", [1000 * t / width for t in parallel[DURABLE]],
            [1000 * t / width for t in parallel[CELERY]]),
    ]


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
    gc = median([u.gc_seconds for u in usages[DURABLE]])
    wall = {side: median(times[side]) for side in (DURABLE, CELERY)}
    busy = {side: 100 * cpu[side] / wall[side] for side in (DURABLE, CELERY)}
    where = "the worker's CPU" if busy[DURABLE] >= 70 else "waiting, not the worker's CPU"
    return (
        f"MISS {row.figure}: {row.ratio:.2f}x, {over:.0f}% above the {row.target.limit}x target. Worker CPU "
        f"{cpu[DURABLE]:.2f} s durable (GC {gc:.2f} s) vs {cpu[CELERY]:.2f} s plain, "
        f"{1000 * cpu[DURABLE] / size:.2f} vs {1000 * cpu[CELERY] / size:.2f} ms per call; the worker was busy "
        f"{busy[DURABLE]:.0f}% of the durable wall time ({busy[CELERY]:.0f}% of the plain one): most of the extra "
        f"time is {where}."
    )
