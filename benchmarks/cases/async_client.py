"""Case 22: the asyncio client against the sync client from a thread pool (issue 41).

1,000 one-step runs started and awaited through ``engine.async_client()``
in one event loop (every start and wait a task of its own, all at once),
against the same 1,000 through the sync ``Client`` from a thread pool of 32
(each worker thread starts a run and waits for it): what an asyncio service
does today, handing the client to ``run_in_executor``. Same workers, same
Redis, same workflow; the two sides alternate which goes first.

Measured per side: seconds until every run was seen completed; threads of
the benchmark process at the peak (sampled every 5 ms by one thread of its
own, counted out) and before; the benchmark process's CPU seconds (the
client's cost: ``time.process_time`` covers its every thread) and the
workers' (``Probe``).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

from benchmarks.cases.common import CELERY, DURABLE, measured, sides
from benchmarks.harness import Bench
from benchmarks.model import CaseResult, Row
from benchmarks.plan import Plan

CASE = "22. Async client"
WORKFLOW = "bench.one-step"
POOL = 32
ASYNC, SYNC = DURABLE, CELERY
"""The table's two columns: the async client where the durable figure goes, the sync pool as its baseline."""


@contextmanager
def thread_peak() -> Iterator[list[int]]:
    """``[before, peak]`` threads of this process, the sampler itself not counted."""
    found = [threading.active_count(), threading.active_count()]
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(0.005):
            found[1] = max(found[1], threading.active_count() - 1)

    sampler = threading.Thread(target=sample, name="thread-peak", daemon=True)
    sampler.start()
    try:
        yield found
    finally:
        stop.set()
        sampler.join()


def _async_side(bench: Bench, runs: int, timeout: float) -> float:
    async def one(client: Any) -> str:
        run_id = await client.start_workflow(WORKFLOW)
        envelope = await client.wait_for_workflow_run(run_id, timeout=timeout)
        return str(envelope.status)

    async def all_of_them() -> float:
        async with bench.engine.async_client() as client:
            await client.list_workflow_runs(limit=1)  # connected: the loop's own machinery is up
            started = time.perf_counter()
            statuses = await asyncio.gather(*(one(client) for _ in range(runs)))
            elapsed = time.perf_counter() - started
        _check(statuses)
        return elapsed

    return asyncio.run(all_of_them())


def _sync_side(bench: Bench, runs: int, timeout: float) -> float:
    def one(_: int) -> str:
        run_id = bench.client.start_workflow(WORKFLOW)
        return str(bench.client.wait_for_workflow_run(run_id, timeout=timeout).status)

    with ThreadPoolExecutor(POOL) as pool:
        started = time.perf_counter()
        statuses = list(pool.map(one, range(runs)))
        elapsed = time.perf_counter() - started
    _check(statuses)
    return elapsed


def _check(statuses: list[str]) -> None:
    if set(statuses) != {"completed"}:
        raise RuntimeError(f"not every run completed: {sorted(set(statuses))}")


def run(bench: Bench, plan: Plan) -> CaseResult:
    runs = plan.async_runs
    result = CaseResult(
        key="async_client",
        title=f"Async client: {runs:,} runs started and awaited in one event loop vs the sync client from "
        f"{POOL} threads",
        setup=f"{runs:,} one-step runs per side, {plan.repeat} repeat(s), sides alternating, the session's "
        f"fleet. Baseline: the sync Client from a ThreadPoolExecutor({POOL}).",
    )
    sided: dict[str, Callable[[Bench, int, float], float]] = {ASYNC: _async_side, SYNC: _sync_side}
    seconds: dict[str, list[float]] = {ASYNC: [], SYNC: []}
    peaks: dict[str, list[float]] = {ASYNC: [], SYNC: []}
    befores: dict[str, list[float]] = {ASYNC: [], SYNC: []}
    client_cpu: dict[str, list[float]] = {ASYNC: [], SYNC: []}
    worker_cpu: dict[str, list[float]] = {ASYNC: [], SYNC: []}
    for i in range(plan.repeat):
        for side in sides(i):
            cpu = time.process_time()
            with thread_peak() as threads:
                elapsed, usage = measured(bench, lambda side=side: sided[side](bench, runs, plan.timeout), side)
            client_cpu[side].append(time.process_time() - cpu)
            seconds[side].append(elapsed)
            befores[side].append(threads[0])
            peaks[side].append(threads[1])
            worker_cpu[side].append(usage.cpu_seconds)
    result.rows = [
        Row(CASE, f"{runs:,} runs started and awaited", "s", seconds[ASYNC], seconds[SYNC]),
        Row(CASE, "threads of the client process at the peak", "threads", peaks[ASYNC], peaks[SYNC],
            note=f"before: {befores[ASYNC][0]:.0f} (async) / {befores[SYNC][0]:.0f} (sync)"),
        Row(CASE, "client process CPU", "s", client_cpu[ASYNC], client_cpu[SYNC]),
        Row(CASE, "workers' CPU", "s", worker_cpu[ASYNC], worker_cpu[SYNC]),
    ]
    result.details = {"seconds": seconds, "threads_peak": peaks, "threads_before": befores,
                      "client_cpu_seconds": client_cpu, "worker_cpu_seconds": worker_cpu}
    result.notes.append(
        "Columns: the durable figure is the async client's, the baseline the sync client's from the pool. "
        "The async side starts every run at once; the pool has at most 32 in flight. Both wait on the "
        "namespace's pub/sub channel."
    )
    return result
