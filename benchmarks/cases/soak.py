"""Case 12 (issue 13): n runs through one worker process; its RSS over time, growth per run.

A fresh worker process (``-P threads -c 8``) takes n runs of ``bench.many``
(5 steps, then a parallel of 8), ``soak_window`` of them in flight at any
time: a steady stream, not a backlog. Its RSS (``VmRSS`` of the worker's
process group) is sampled every half second with the number of runs done.
The figure is the slope of RSS against runs done over the second half
(least squares): what each further run leaves behind once the worker is
warm. The same for n Celery chains of the same tasks on another fresh
worker, so a growth that is Celery's own shows as such. The objects the
worker's garbage collector tracks are counted by type (``bench.worker_stats``)
before and after each side: the types that grew most say what stays behind.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import redis
from celery.result import GroupResult

from benchmarks.app import STATS_TASK
from benchmarks.bulk import read_runs
from benchmarks.cases.common import CELERY, DURABLE, flush_results, fmt_int
from benchmarks.cases.many import META_PREFIX, chain_canvas
from benchmarks.harness import Bench, WorkerSetup, proc_status_kb
from benchmarks.model import CaseResult, Row
from benchmarks.plan import Plan

OWN_FLEET = True
CASE = "12. Soak"
CONCURRENCY = 8
SAMPLE_SECONDS = 0.5
POLL_SECONDS = 0.02
GROWN_TYPES = 12
BEFORE_KB_PER_RUN = 2.0
"""What issue 13 measured before the liveness change: ~2 KB per run, still rising at 2,000 runs."""

Sample = tuple[int, int, float]
"""(runs done, worker RSS in KB, seconds since the soak began)."""


def _rss_kb(bench: Bench) -> int:
    return sum(proc_status_kb(pid, "VmRSS") for pid in bench.worker_pids())


def _gc_types(bench: Bench) -> Counter[str]:
    """Objects the worker's garbage collector tracks, by type."""
    stats = bench.engine.celery.tasks[STATS_TASK].apply_async(kwargs={"types": True}).get(timeout=60)
    return Counter({str(name): int(count) for name, count in stats["gc_types"].items()})


def _soak(bench: Bench, n: int, window: int, start: Callable[[], Any],
          finished: Callable[[list[Any]], list[bool]]) -> list[Sample]:
    """Keep ``window`` items in flight until n are done, sampling the worker's RSS."""
    began = time.perf_counter()
    samples: list[Sample] = [(0, _rss_kb(bench), 0.0)]
    inflight: list[Any] = []
    started = done = 0
    next_sample = began + SAMPLE_SECONDS
    while done < n:
        while started < n and len(inflight) < window:
            inflight.append(start())
            started += 1
        flags = finished(inflight)
        done += sum(flags)
        inflight = [item for item, flag in zip(inflight, flags, strict=True) if not flag]
        now = time.perf_counter()
        if now >= next_sample:
            samples.append((done, _rss_kb(bench), now - began))
            next_sample = now + SAMPLE_SECONDS
        time.sleep(POLL_SECONDS)
    samples.append((done, _rss_kb(bench), time.perf_counter() - began))
    return samples


def slope_kb_per_run(samples: list[Sample], n: int) -> float:
    """Least-squares slope of RSS over runs done, for the samples of the second half."""
    points = [(float(done), float(rss)) for done, rss, _ in samples if done >= n / 2]
    if len(points) < 2:
        return float("nan")
    mean_x = sum(x for x, _ in points) / len(points)
    mean_y = sum(y for _, y in points) / len(points)
    spread = sum((x - mean_x) ** 2 for x, _ in points)
    if spread == 0:
        return float("nan")
    return sum((x - mean_x) * (y - mean_y) for x, y in points) / spread


def _durable(bench: Bench, n: int, window: int) -> list[Sample]:
    def finished(run_ids: list[str]) -> list[bool]:
        states = read_runs(bench.raw, bench.engine, run_ids)
        bad = [s for s in states if s.settled and s.status != "completed"]
        if bad:
            raise RuntimeError(f"soak run {bad[0].run_id} ended {bad[0].status}")
        return [s.settled for s in states]

    return _soak(bench, n, window, lambda: bench.client.start_workflow("bench.many"), finished)


def _celery(bench: Bench, n: int, window: int) -> list[Sample]:
    backend = redis.Redis.from_url(bench.engine.celery.conf.result_backend)

    def finished(groups: list[GroupResult]) -> list[bool]:
        pipe = backend.pipeline(transaction=False)
        for result in groups:
            pipe.mget([META_PREFIX + r.id for r in result.results])
        flags = []
        for raws in pipe.execute():
            if all(raws) and any(json.loads(raw)["status"] != "SUCCESS" for raw in raws):
                raise RuntimeError("a task of a soak chain failed")
            flags.append(all(raws))
        return flags

    try:
        return _soak(bench, n, window, lambda: chain_canvas(bench).apply_async(), finished)
    finally:
        backend.close()
        flush_results(bench)


def run(bench: Bench, plan: Plan) -> CaseResult:
    n, window = plan.soak_runs, plan.soak_window
    result = CaseResult(
        key="soak",
        title=f"Soak: {fmt_int(n)} runs through one worker process, its RSS per run",
        setup=f"A fresh worker process per side (-P threads -c {CONCURRENCY}); {fmt_int(n)} runs of bench.many "
        f"(5 steps + parallel of 8), {window} in flight at a time, vs {fmt_int(n)} chain(noop x 5, group(noop x 8)) "
        f"the same way; VmRSS every {SAMPLE_SECONDS:g} s; slope = least squares of RSS over runs done, second half.",
    )
    samples: dict[str, list[Sample]] = {}
    objects: dict[str, tuple[int, int]] = {}
    grown: dict[str, dict[str, int]] = {}
    for side in (DURABLE, CELERY):
        bench.use_fleet(WorkerSetup(1, "threads", CONCURRENCY), fresh=not plan.quick)
        before = _gc_types(bench)
        samples[side] = _durable(bench, n, window) if side == DURABLE else _celery(bench, n, window)
        after = _gc_types(bench)
        objects[side] = (before.total(), after.total())
        after.subtract(before)
        grown[side] = dict(after.most_common(GROWN_TYPES))
    slope = {side: slope_kb_per_run(samples[side], n) for side in samples}
    half = {side: next(rss for done, rss, _ in samples[side] if done >= n / 2) for side in samples}
    end = {side: samples[side][-1][1] for side in samples}
    start = {side: samples[side][0][1] for side in samples}
    result.rows = [
        Row(CASE, f"worker RSS growth per run, runs {fmt_int(n // 2)}-{fmt_int(n)}", "KB/run", [slope[DURABLE]],
            [slope[CELERY]], note=f"least squares; issue 13 measured ~{BEFORE_KB_PER_RUN:g} KB/run before; baseline: "
            "the same worker process running the chains"),
        Row(CASE, f"worker RSS after {fmt_int(n)} runs", "MB", [end[DURABLE] / 1024], [end[CELERY] / 1024],
            note=f"at start {start[DURABLE] / 1024:.0f} MB, at {fmt_int(n // 2)} runs {half[DURABLE] / 1024:.0f} MB "
            f"(chains: {start[CELERY] / 1024:.0f} / {half[CELERY] / 1024:.0f} MB)"),
        Row(CASE, f"objects tracked by the GC, growth per run over {fmt_int(n)}", "objects",
            [(objects[DURABLE][1] - objects[DURABLE][0]) / n], [(objects[CELERY][1] - objects[CELERY][0]) / n],
            note="len(gc.get_objects()) in the worker, after - before"),
    ]
    result.details = {
        side: {
            "seconds": samples[side][-1][2],
            "runs_per_s": n / samples[side][-1][2],
            "rss_kb_by_runs_done": _thin([(done, rss) for done, rss, _ in samples[side]]),
            "gc_objects_before_after": list(objects[side]),
            "gc_types_grown_most": grown[side],
        }
        for side in samples
    }
    return result


def _thin(points: list[tuple[int, int]], keep: int = 21) -> list[list[int]]:
    """About ``keep`` evenly spaced points of a curve (the first and last included), for the report."""
    if len(points) <= keep:
        return [list(p) for p in points]
    step = (len(points) - 1) / (keep - 1)
    return [list(points[round(i * step)]) for i in range(keep)]
