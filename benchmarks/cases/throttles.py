"""Case 20: throttles (SPEC §5e, issue 39) — many runs through one fleet-wide
limit.

- ``throttle_runs`` runs of ``bench.one-step`` started together with
  ``throttle="bench"`` (``concurrency=5``): the throttle's holders sampled
  while they run (never more than 5), every run completed, no take-over;
- from a slot freed to the next waiter running: the k-th run to finish
  frees the slot the (5+k)-th to start takes, so the delay is the (5+k)-th
  ``started_at`` minus the k-th ``finished_at`` (p50, p99; goal p50 < 50 ms);
- a throttle that never binds (``concurrency=100000``) against the same runs
  unthrottled: runs per second, ratio (goal >= 0.9);
- the cost of one admission with 1 key and with 1,000 keys waiting
  (``per_key_concurrency=1``): the release-and-admit script timed on the
  benchmark's Redis, in-process (goal: flat, 1,000 keys <= 1.5x one key).
"""

from __future__ import annotations

import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

from benchmarks.bulk import wait_settled
from benchmarks.harness import Bench
from benchmarks.model import CaseResult, Row, Target, median, percentile
from benchmarks.plan import Plan

CASE = "20. Throttles"
SLOTS = 5
RATIO_GOAL = 0.9
FLAT_LIMIT = 1.5
LATENCY_GOAL_MS = 50.0
WAITERS = 1_000


def run(bench: Bench, plan: Plan) -> CaseResult:
    n = plan.throttle_runs
    client = bench.client
    result = CaseResult(
        key="throttles",
        title=f"Throttles: {n:,} runs through concurrency={SLOTS}; an unbound throttle; 1 vs {WAITERS:,} keys",
        setup=f"Durable: {n:,} runs of bench.one-step started together with throttle='bench' (concurrency={SLOTS}), "
        "holders sampled every 5 ms; then the same runs under a throttle that never binds vs unthrottled "
        f"(alternating); then one admission with {WAITERS:,} waiters of 1 key vs of {WAITERS:,} keys, in-process.",
    )
    bench.run("bench.one-step", {}, plan.timeout)  # warm-up
    client.set_throttle("bench", concurrency=SLOTS)
    peak, samples, stop = [0], [0], threading.Event()

    def sample() -> None:
        while not stop.wait(0.005):
            holding = client.get_throttle("bench").holding
            peak[0] = max(peak[0], holding)
            samples[0] += 1

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    began = time.time()
    started = start_runs_throttled(bench, n, "bench")
    states = wait_settled(bench.raw, bench.engine, started, plan.timeout)
    stop.set()
    sampler.join()
    seconds = max(s.finished_ms or 0 for s in states) / 1000 - began
    takeovers = sum(1 for s in states if s.attempt > 1)
    completed = sum(1 for s in states if s.status == "completed")
    delays = _slot_delays(bench, started)
    result.rows += [
        Row(CASE, f"most holders seen at once ({samples[0]:,} samples)", "runs", [float(peak[0])],
            target=Target(f"<= {SLOTS}", SLOTS), checked=float(peak[0])),
        Row(CASE, f"runs completed of {n:,}", "runs", [float(completed)], target=Target(f">= {n}", n, at_most=False),
            checked=float(completed)),
        Row(CASE, "take-overs", "runs", [float(takeovers)], target=Target("0", 0), checked=float(takeovers)),
        Row(CASE, f"{n:,} runs through {SLOTS} slots", "s", [seconds]),
        Row(CASE, "slot freed -> next waiter running, p50", "ms", [percentile(delays, 50)],
            target=Target(f"< {LATENCY_GOAL_MS:g} ms", LATENCY_GOAL_MS), checked=percentile(delays, 50)),
        Row(CASE, "slot freed -> next waiter running, p99", "ms", [percentile(delays, 99)]),
    ]
    client.set_throttle("open", concurrency=100_000)
    bound: list[float] = []
    free: list[float] = []
    for r in range(plan.repeat):
        for throttle in (["open", None] if r % 2 == 0 else [None, "open"]):
            rate = _throughput(bench, n, throttle, plan.timeout)
            (bound if throttle else free).append(rate)
    ratio = median(bound) / median(free)
    result.rows += [
        Row(CASE, "runs/s under a throttle that never binds (baseline: unthrottled)", "runs/s", bound, free),
        Row(CASE, "unbound throttle / unthrottled throughput", "x", [ratio],
            target=Target(f">= {RATIO_GOAL}", RATIO_GOAL, at_most=False), checked=ratio),
    ]
    one, many = _admission_us(bench, keys=1), _admission_us(bench, keys=WAITERS)
    growth = median(many) / median(one)
    result.rows += [
        Row(CASE, f"one admission, {WAITERS:,} waiters of {WAITERS:,} keys (baseline: of 1 key)", "us", many, one),
        Row(CASE, f"admission cost, {WAITERS:,} keys vs 1", "x", [growth],
            target=Target(f"<= {FLAT_LIMIT}x: flat", FLAT_LIMIT), checked=growth),
    ]
    result.details = {"slot_delays_ms": delays, "bound_runs_s": bound, "free_runs_s": free}
    return result


def start_runs_throttled(bench: Bench, n: int, throttle: str | None, threads: int = 8) -> list[str]:
    """``n`` runs started from ``threads`` threads, as ``bulk.start_runs`` does, under ``throttle`` (None: none)."""
    client = bench.client
    with ThreadPoolExecutor(threads) as pool:
        return list(pool.map(lambda _: client.start_workflow("bench.one-step", {}, throttle=throttle), range(n)))


def _slot_delays(bench: Bench, run_ids: list[str]) -> list[float]:
    records = [bench.engine.store.load_run(run_id) for run_id in run_ids]
    starts = sorted(r.started_at for r in records if r is not None and r.started_at)
    ends = sorted(r.finished_at for r in records if r is not None and r.finished_at)
    return [float(starts[SLOTS + k] - ends[k]) for k in range(len(starts) - SLOTS)]


def _throughput(bench: Bench, n: int, throttle: str | None, timeout: float) -> float:
    began = time.time()
    run_ids = start_runs_throttled(bench, n, throttle)
    states = wait_settled(bench.raw, bench.engine, run_ids, timeout)
    if any(s.status != "completed" for s in states):
        raise RuntimeError("a run did not complete")
    return n / (max(s.finished_ms or 0 for s in states) / 1000 - began)


def _admission_us(bench: Bench, *, keys: int, rounds: int = 200) -> list[float]:
    """One release-and-admit (``throttle_release.lua``) with ``WAITERS`` waiting,
    spread over ``keys`` keys: microseconds per admission, per round (the
    holder released each round queues again, so the queue keeps its size)."""
    store, ns = bench.engine.store, bench.client.namespace
    name = f"keys-{keys}-{uuid.uuid4().hex[:6]}"
    bench.client.set_throttle(name, concurrency=1, per_key_concurrency=1)
    key_of = {f"{i:032x}|run": f"k{i % keys}" for i in range(WAITERS + 1)}
    holders = list(key_of)
    for holder in holders:
        store.throttle_acquire(ns, name, holder, 1, key_of[holder], 0)
    holder, epoch = holders[0], 1
    times: list[float] = []
    for _ in range(rounds):
        began = time.perf_counter()
        admitted = store.throttle_release(ns, name, [(holder, "")])
        times.append((time.perf_counter() - began) * 1e6)
        store.throttle_acquire(ns, name, holder, epoch, key_of[holder], 0)
        ((holder, epoch),) = admitted.granted
    bench.client.delete_throttle(name)
    return times
