"""Case 10 (issue 14): n runs of 5 steps and a parallel of 8, started together, vs n Celery chains.

Durable: n runs of ``bench.many`` (5 no-op ``ctx.step`` calls, then
``ctx.parallel`` of 8 no-op steps), started from 8 client threads as fast
as they go. Celery: n canvases ``chain(noop x 5, group(noop x 8))`` sent the
same way: the same tasks, the last link a group whose 8 results the client
collects. Both sides on the same fleet (1, then 2 worker processes,
``-P threads -c 8`` as the issue says), alternating which goes first.

Times come from what each side stored, not from the client's polling: a
run's ``finished_at`` (its record, ms), a chain's latest ``date_done`` of
its group's 8 results (Celery's result meta). Throughput is n over the time
from the first send to the last completion; latency each one's send to its
completion. Redis memory per finished run is ``INFO memory`` used_memory
after minus before, over n (for Celery, the results it stored, before they
are flushed). A take-over is an attempt beyond the first (the run's
``attempt``); there must be none, as nothing fails here.
"""

from __future__ import annotations

import json
import time
from datetime import datetime
from typing import Any

import redis
from celery import chain, group
from celery.result import GroupResult

from benchmarks.app import MANY_BRANCHES, MANY_STEPS
from benchmarks.bulk import RunState, send_all, start_runs, wait_settled
from benchmarks.cases.common import CELERY, DURABLE, flush_results, fmt_int, profiled, sides
from benchmarks.harness import Bench, WorkerSetup, cpu_seconds
from benchmarks.model import CaseResult, Row, Target, median, percentile
from benchmarks.plan import Plan
from benchmarks.redisstats import CommandWindow, used_memory

PROFILE_DURABLE_ONLY = True
"""--py-spy records the fleet during the durable batches only (``common.profiled``)."""
OWN_FLEET = True
CASE = "10. Many runs"
CONCURRENCY = 8
SEND_THREADS = 8
POLL_SECONDS = 2.0
"""How often the client looks for the batch's end. Times come from the stored
records, so the poll only decides when the batch is over; sparse, it keeps the
client's reads out of what Redis is measured doing (at 0.25 s they were a
fifth of a chain's commands, and Redis CPU per run fell 10-15 % on both sides
at 2 s). Warm-ups and ``--quick`` poll at ``QUICK_POLL_SECONDS``."""
QUICK_POLL_SECONDS = 0.25
THROUGHPUT_RATIO = 2.0
META_PREFIX = "celery-task-meta-"


class Batch:
    """One side's n runs or chains: per item, when it was sent and when it completed (time.time())."""

    def __init__(self, sent: list[float], done: list[float], memory: int, cpu: float, extra: dict[str, Any]) -> None:
        self.sent, self.done, self.memory, self.cpu, self.extra = sent, done, memory, cpu, extra

    @property
    def runs_per_s(self) -> float:
        return len(self.done) / (max(self.done) - min(self.sent))

    @property
    def latencies(self) -> list[float]:
        return [end - start for start, end in zip(self.sent, self.done, strict=True)]


def _per_item(window: CommandWindow, n: int) -> dict[str, Any]:
    """Redis commands and CPU per run (or chain), all and the telling ones: messages sent, events, scripts."""
    commands = window.commands
    calls = commands.calls
    return {
        "commands": commands.total / n,
        "redis_cpu_ms": 1000 * window.cpu_seconds / n,
        "redis_ms": commands.total_usec / 1000 / n,
        "messages_sent (lpush)": calls["lpush"] / n,
        "events_published (publish)": calls["publish"] / n,
        "scripts (evalsha)": (calls["evalsha"] + calls["eval"]) / n,
        "top": {name: round(count / n, 2) for name, count in calls.most_common(12)},
    }


def _durable(bench: Bench, n: int, timeout: float, poll: float = QUICK_POLL_SECONDS) -> Batch:
    before = used_memory(bench.raw)
    cpu = cpu_seconds(bench.worker_pids())
    with CommandWindow(bench.raw) as window:
        started = start_runs(bench.client, "bench.many", [{}] * n, SEND_THREADS)
        states: list[RunState] = wait_settled(bench.raw, bench.engine, [run_id for run_id, _ in started], timeout,
                                              poll)
    cpu = cpu_seconds(bench.worker_pids()) - cpu
    memory = used_memory(bench.raw) - before
    completed = [s for s in states if s.status == "completed"]
    sent = [at for (_, at), s in zip(started, states, strict=True) if s.status == "completed"]
    extra = {
        "completed": len(completed),
        "statuses": sorted({s.status for s in states}),
        "take_overs": sum(s.attempt - 1 for s in states),
        "runs_taken_over": sum(1 for s in states if s.attempt > 1),
        "redis_per_run": _per_item(window, n),
    }
    return Batch(sent, [(s.finished_ms or 0) / 1000 for s in completed], memory, cpu, extra)


def chain_canvas(bench: Bench) -> Any:
    noop = bench.noop
    return chain(*(noop.si() for _ in range(MANY_STEPS)), group(noop.si() for _ in range(MANY_BRANCHES)))


def _date_done(meta: dict[str, Any]) -> float:
    value = meta["date_done"]
    return (value if isinstance(value, datetime) else datetime.fromisoformat(str(value))).timestamp()


def _collect(backend: redis.Redis, groups: list[GroupResult], timeout: float, poll: float) -> tuple[list[float], int]:
    """Poll the result metas until each group's 8 results are in: its latest date_done; and failures."""
    done: dict[int, float] = {}
    failed = 0
    deadline = time.monotonic() + timeout
    while len(done) < len(groups):
        pending = [i for i in range(len(groups)) if i not in done]
        pipe = backend.pipeline(transaction=False)
        for i in pending:
            pipe.mget([META_PREFIX + r.id for r in groups[i].results])
        for i, raws in zip(pending, pipe.execute(), strict=True):
            if all(raws):
                metas = [json.loads(raw) for raw in raws]
                failed += sum(1 for m in metas if m["status"] != "SUCCESS")
                done[i] = max(_date_done(m) for m in metas)
        if len(done) < len(groups):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{len(groups) - len(done)} of {len(groups)} chains not done in {timeout:.0f} s")
            time.sleep(poll)
    return [done[i] for i in range(len(groups))], failed


def _celery(bench: Bench, n: int, timeout: float, poll: float = QUICK_POLL_SECONDS) -> Batch:
    backend = redis.Redis.from_url(bench.engine.celery.conf.result_backend)
    try:
        before = used_memory(bench.raw)
        cpu = cpu_seconds(bench.worker_pids())
        canvases = [chain_canvas(bench) for _ in range(n)]
        with CommandWindow(bench.raw) as window:
            sent = send_all(lambda i: canvases[i].apply_async(), n, SEND_THREADS)
            done, failed = _collect(backend, [result for result, _ in sent], timeout, poll)
        cpu = cpu_seconds(bench.worker_pids()) - cpu
        memory = used_memory(bench.raw) - before
    finally:
        backend.close()
    flush_results(bench)
    extra = {"completed": n, "failed_tasks": failed, "redis_per_run": _per_item(window, n)}
    return Batch([at for _, at in sent], done, memory, cpu, extra)


def _fleet_rows(n: int, label: str, batches: dict[str, list[Batch]]) -> list[Row]:
    durable, celery = batches[DURABLE], batches[CELERY]
    lat = {side: [b.latencies for b in batches[side]] for side in (DURABLE, CELERY)}
    return [
        Row(CASE, f"{fmt_int(n)} runs vs {fmt_int(n)} chains, throughput, {label}", "runs/s",
            [b.runs_per_s for b in durable], [b.runs_per_s for b in celery],
            Target(f">= {THROUGHPUT_RATIO:g}x the chains", THROUGHPUT_RATIO, at_most=False), judge_ratio=True),
        Row(CASE, f"start -> completed, p50, {label}", "s", [median(x) for x in lat[DURABLE]],
            [median(x) for x in lat[CELERY]]),
        Row(CASE, f"start -> completed, p99, {label}", "s", [percentile(x, 99) for x in lat[DURABLE]],
            [percentile(x, 99) for x in lat[CELERY]]),
        Row(CASE, f"runs completed, {label}", "%", [100 * b.extra["completed"] / n for b in durable],
            target=Target("100 %", 100, at_most=False)),
        Row(CASE, f"take-overs (attempts beyond the first), {label}", "attempts",
            [float(b.extra["take_overs"]) for b in durable], target=Target("0", 0)),
        Row(CASE, f"Redis memory per finished run, {label}", "bytes", [b.memory / n for b in durable],
            [b.memory / n for b in celery],
            note="INFO used_memory after - before, / n; baseline: the 13 results a chain stores"),
        Row(CASE, f"worker CPU per run, {label}", "ms", [1000 * b.cpu / n for b in durable],
            [1000 * b.cpu / n for b in celery], note="utime + stime of the worker processes, / n"),
        Row(CASE, f"Redis commands per run, {label}", "commands",
            [b.extra["redis_per_run"]["commands"] for b in durable],
            [b.extra["redis_per_run"]["commands"] for b in celery],
            note="INFO commandstats over the batch (the client's sparse polling included), / n; messages sent per run "
            f"{median([b.extra['redis_per_run']['messages_sent (lpush)'] for b in durable]):.1f} vs "
            f"{median([b.extra['redis_per_run']['messages_sent (lpush)'] for b in celery]):.1f}"),
        Row(CASE, f"Redis CPU per run, {label}", "ms",
            [b.extra["redis_per_run"]["redis_cpu_ms"] for b in durable],
            [b.extra["redis_per_run"]["redis_cpu_ms"] for b in celery],
            note="INFO cpu (used_cpu_user + used_cpu_sys) over the batch (the client's sparse polling included), / n"),
    ]


def run(bench: Bench, plan: Plan) -> CaseResult:
    n = plan.many_runs
    result = CaseResult(
        key="many",
        title=f"Many runs at once: {fmt_int(n)} runs of 5 steps + parallel of 8 vs {fmt_int(n)} Celery chains",
        setup=f"Durable: {fmt_int(n)} runs of bench.many (5 no-op steps, then ctx.parallel of 8 no-op steps) "
        f"started from {SEND_THREADS} client threads. Celery: {fmt_int(n)} x chain(noop x {MANY_STEPS}, "
        f"group(noop x {MANY_BRANCHES})) sent the same way. Fleets of "
        f"{' and '.join(str(w) for w in plan.fleets)} worker process(es), -P threads -c {CONCURRENCY}; "
        f"{plan.repeat} batch(es) per side and fleet, alternating. Times from the stored records "
        "(finished_at; the group results' date_done).",
    )
    details: dict[str, Any] = {}
    poll = QUICK_POLL_SECONDS if plan.quick else POLL_SECONDS
    for workers in plan.fleets:
        label = f"{workers} worker process{'es' if workers > 1 else ''}"
        # A fresh fleet per size (the smoke run reuses what the case before left, to stay quick).
        bench.use_fleet(WorkerSetup(workers, "threads", CONCURRENCY), fresh=not plan.quick)
        _durable(bench, max(8, n // 50), plan.timeout)  # warm-up: scripts loaded, threads and connections made
        _celery(bench, max(8, n // 50), plan.timeout)
        batches: dict[str, list[Batch]] = {DURABLE: [], CELERY: []}
        for r in range(plan.repeat):
            for side in sides(r):
                if side == DURABLE:
                    with profiled(bench, f"{workers}w-r{r}"):
                        batches[side].append(_durable(bench, n, plan.timeout, poll))
                else:
                    batches[side].append(_celery(bench, n, plan.timeout, poll))
        result.rows += _fleet_rows(n, label, batches)
        details[label] = {
            side: [{"runs_per_s": b.runs_per_s, "seconds": max(b.done) - min(b.sent),
                    "p50_s": median(b.latencies), "p99_s": percentile(b.latencies, 99),
                    "memory_bytes": b.memory, "worker_cpu_s": b.cpu, **b.extra} for b in batches[side]]
            for side in (DURABLE, CELERY)
        }
    result.details = details
    return result
