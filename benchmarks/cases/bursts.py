"""Case 16 (issue 28): timer bursts, n timers due at one instant, n from 1,000 to 100,000.

Each run of ``bench.timer`` sleeps until the same aware instant T, then
journals one no-op step and completes. The runs are built through the
engine's real scripts without the fleet, so that 100,000 of them take
minutes, not an hour: an engine of this process (the fleet's key prefix and
settings, a sender that keeps its messages instead of publishing them)
starts them, and each run's first coordinator pass runs here, in the task
body a worker would run (``tasks.entry.run_durable_task``), up to its
sleep. The store then holds what a fleet's pass leaves: the wait, and the
run in the sweep's due index (at T once a sweep has looked at it, a lease
after its start; the case waits for all n to be there).

At T the fleet (2 worker processes, ``-P threads -c 8``, each running the
engine's recovery sweep) fires them. Measured from T: when the sweep's due
index held none of them at T any more (claimed; sampled every
``WATCH_SECONDS``), when each run finished (its record's ``finished_at``,
so the client's polling costs no precision), take-overs (attempts beyond
the first), and the peak coordinator backlog. The claim rate (timers per
second until all were claimed) must stay flat from the smallest size to
the largest.

Baseline: none (plain Celery has no durable timer, see ``cases/timers.py``).
The case before it at 10,000 (``cases/timers.py``, runs started through the
fleet) is the "before" of issue 28.
"""

from __future__ import annotations

import functools
import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from benchmarks.bulk import wait_settled, wait_until
from benchmarks.cases.common import KeptSender, fmt_int, profiled
from benchmarks.cases.timers import FireWatch
from benchmarks.harness import Bench, WorkerSetup
from benchmarks.model import CaseResult, Row, Target, median, percentile
from benchmarks.plan import Plan
from benchmarks.redisstats import command_stats, server_cpu_seconds
from celery_durable import Engine
from celery_durable.tasks.entry import run_durable_task

PROFILE_DURABLE_ONLY = True
OWN_FLEET = True
CASE = "17. Timer bursts"
WORKERS = 2
CONCURRENCY = 8
BUILD_THREADS = 8
PILOT = 200
BUILD_LEASE_S = 3_600.0
MARGIN = 1.4
"""T leaves the estimated build time times this, plus SLACK_S (the rate is the last size's build, or a pilot's)."""
SLACK_S = 10.0
WATCH_SECONDS = 0.05
CLAIM_GOAL_S = 5.0
CONTINUE_GOAL_S = 30.0
GOAL_SIZE = 10_000
FLAT_LIMIT = 1.5
"""The claim rate at the largest size over the smallest's, either way: flat, not O(due timers)."""



def _builder(bench: Bench) -> tuple[Engine, KeptSender]:
    from benchmarks.app import WORKFLOWS

    # The build's own lease is longer than any build: a run's first look is
    # then after T, so its wait puts it at T at once, whenever its build ends
    # (with the fleet's lease, a run started a lease before T was looked at
    # just before T, racing the check that every run waits for T).
    engine = Engine(WORKFLOWS, bench.settings.model_copy(update={"lease_seconds": BUILD_LEASE_S}))
    kept = KeptSender()
    engine.sender = kept
    return engine, kept


def build(engine: Engine, kept: KeptSender, count: int, at_ms: int) -> list[str]:
    """``count`` runs of bench.timer waiting for ``at_ms``, each through its start and first pass."""
    client = engine.client()
    run_ids: list[str] = []
    with ThreadPoolExecutor(BUILD_THREADS) as pool:
        for start in range(0, count, 1_000):
            chunk = min(1_000, count - start)
            run_ids += pool.map(lambda _: client.start_workflow("bench.timer", args={"at_ms": at_ms}), range(chunk))
            firsts, kept.sent[:] = list(kept.sent), []
            list(pool.map(lambda m: run_durable_task(engine, m.task, m.task_id, m.kwargs), firsts))
    return run_ids


def _all_at(bench: Bench, at_ms: int, wanted: int) -> bool:
    return int(bench.raw.zcount(bench.engine.store.keys.sweep_due, at_ms - 1, at_ms + 1)) >= wanted


def _burst(bench: Bench, plan: Plan, builder: tuple[Engine, KeptSender], n: int, rate: float) -> dict[str, Any]:
    # A run's wait puts it at T at once (T comes before the sweep's first look
    # at it, a build lease after its start): every run is at T before T, which is checked.
    slack = SLACK_S if n >= 1_000 else plan.burst_small_slack
    at_ms = int((time.time() + n / rate * MARGIN + slack) * 1000)
    built = time.perf_counter()
    run_ids = build(*builder, n, at_ms)
    build_s = time.perf_counter() - built
    left = at_ms / 1000 - time.time() - 0.5
    wait_until(functools.partial(_all_at, bench, at_ms, n), max(0.0, left),
               f"{fmt_int(n)} runs waiting for T with nothing due before it", poll=0.5)
    lead = at_ms / 1000 - time.time()
    if lead <= 0:
        raise RuntimeError("the instant came before every run was waiting: raise MARGIN")
    cpu_before, redis_before, load_before = _cpu(bench), server_cpu_seconds(bench.raw), os.getloadavg()[0]
    commands_before = command_stats(bench.raw)
    with profiled(bench, f"burst-{n}"), FireWatch(bench, at_ms, WATCH_SECONDS) as watch:
        states = wait_settled(bench.raw, bench.engine, run_ids, plan.timeout + lead, poll=0.5)
    worker_cpu, redis_cpu = _cpu(bench) - cpu_before, server_cpu_seconds(bench.raw) - redis_before
    # Lua's own calls included, and the polling's: an upper bound, by command.
    commands = command_stats(bench.raw) - commands_before
    bad = [s for s in states if s.status != "completed"]
    if bad:
        raise RuntimeError(f"{len(bad)} timer runs ended {bad[0].status}, e.g. {bad[0].run_id}")
    continued = sorted((s.finished_ms or 0) / 1000 - at_ms / 1000 for s in states)
    facts = watch.facts()
    return {
        "runs": n,
        "build_s": build_s,
        "build_runs_per_s": n / build_s,
        "lead_before_T_s": lead,
        "claimed_s": facts["all_claimed_by_sweep_after_s"],
        "claim_rate_per_s": n / max(facts["all_claimed_by_sweep_after_s"], WATCH_SECONDS),
        "continued_s": {"first": continued[0], "p50": median(continued), "p99": percentile(continued, 99),
                        "last": continued[-1]},
        "take_overs": float(sum(s.attempt - 1 for s in states)),
        "runs_taken_over": float(sum(1 for s in states if s.attempt > 1)),
        "peak_coordinator_backlog": facts["peak_coordinator_backlog"],
        # Includes the idle wait for T and the polling's tail: an upper bound of what firing costs.
        "worker_cpu_ms_per_run": 1000 * worker_cpu / n,
        "redis_cpu_ms_per_run": 1000 * redis_cpu / n,
        "redis_commands_per_run": commands.total / n,
        "redis_commands_per_run_top": {name: calls / n for name, calls in commands.top(16).items()},
        "load_average": [load_before, os.getloadavg()[0]],
    }


def _cpu(bench: Bench) -> float:
    """CPU seconds the fleet's processes used so far (user + system, /proc)."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for pid in bench.worker_pids():
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / ticks
    return total



def run(bench: Bench, plan: Plan) -> CaseResult:
    sizes = plan.burst_sizes
    result = CaseResult(
        key="bursts",
        title="Timer bursts: n timers due at one instant, on 2 worker processes",
        setup=f"n = {', '.join(fmt_int(n) for n in sizes)} runs of ctx.sleep_until(T) then one no-op step, built "
        "through the real scripts in this process (start and first pass by the worker's task body, messages "
        f"kept), then fired at T by the fleet: {WORKERS} worker processes, -P threads -c {CONCURRENCY}, each "
        "running the engine's recovery sweep. Claimed: the sweep's due index holds none of them at T "
        f"(sampled every {WATCH_SECONDS:g} s); continued: the last run's finished_at. No plain-Celery baseline.",
    )
    bench.use_fleet(WorkerSetup(WORKERS, "threads", CONCURRENCY))
    builder = _builder(bench)
    started = time.perf_counter()
    # A pilot, how fast runs are built here: waiting for a time far beyond the case (they stay waiting).
    build(*builder, PILOT, int(time.time() * 1000) + 86_400_000)
    rate = PILOT / (time.perf_counter() - started)
    details: dict[str, Any] = {"build_pilot_runs_per_s": rate}
    for n in sizes:
        facts = _burst(bench, plan, builder, n, rate)
        rate = facts["build_runs_per_s"]  # the next size's T from this one's build: the latest pace here
        details[str(n)] = facts
        label = f"{fmt_int(n)} due at once, {WORKERS} worker processes"
        goal = n == GOAL_SIZE
        result.rows += [
            Row(CASE, f"{label}: all claimed by a sweep", "s", [facts["claimed_s"]],
                target=Target(f"<= {CLAIM_GOAL_S:g} s", CLAIM_GOAL_S) if goal else None,
                note=f"{facts['claim_rate_per_s']:,.0f} timers/s; sampled every {WATCH_SECONDS:g} s"),
            Row(CASE, f"{label}: all continued", "s", [facts["continued_s"]["last"]],
                target=Target(f"<= {CONTINUE_GOAL_S:g} s", CONTINUE_GOAL_S) if goal else None,
                note=f"{n / facts['continued_s']['last']:,.0f} runs/s; median {facts['continued_s']['p50']:.2f} s; "
                f"peak coordinator backlog {facts['peak_coordinator_backlog']:,.0f}; worker CPU "
                f"{facts['worker_cpu_ms_per_run']:.1f} ms/run, Redis {facts['redis_cpu_ms_per_run']:.2f} ms/run; "
                f"load {facts['load_average'][0]:.1f} -> {facts['load_average'][1]:.1f}"),
            Row(CASE, f"{label}: take-overs", "runs", [facts["runs_taken_over"]], target=Target("0", 0)),
        ]
    if len(sizes) > 1:
        low, high = details[str(sizes[0])]["claim_rate_per_s"], details[str(sizes[-1])]["claim_rate_per_s"]
        ratio = high / low
        result.rows.append(Row(
            CASE, f"claim rate, {fmt_int(sizes[-1])} due vs {fmt_int(sizes[0])}", "x", [ratio],
            target=Target(f">= {1 / FLAT_LIMIT:.2f}x (flat: not slower per timer with more due)", 1 / FLAT_LIMIT,
                          at_most=False),
            note=f"{low:,.0f} -> {high:,.0f} timers/s",
        ))
    result.details = details
    return result
