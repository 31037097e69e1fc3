"""Case 11 (issue 14): the recovery sweep with 20,000 runs in the store, 100 of them live.

The case has a store of its own (key prefix ``benchsweep``, its own queues)
so that what it holds is exactly what it says. Its live runs are ``bench.hold``
runs: one step each that blocks (``BLPOP``, no Redis traffic) until the case
releases it, so each is a coordinator pass in flight, renewed by its
heartbeat, as a long step is. They run on one worker process with a slot
each, started without the engine's recovery sweep (``BENCH_NO_SWEEP``,
``benchmarks.app``), so every sweep Redis sees is one this case runs:
``RecoverySweep`` instances in the benchmark process, against the same
Redis and settings.

1. One pass (``sweep_once``, ``INFO commandstats`` around it, Lua's own
   commands included): with nothing due, and with every live run due (their
   entries in the sweep's due index set to 0, as if all their checks fell due
   at once); first with only the live runs stored, then after the store was
   filled with finished runs (``bench.one-step``) up to the full count. A pass
   must cost O(due runs): the same with 100 or 20,000 runs stored.
2. Several sweepers at once: 1 and 8 instances each running its own loop as
   a worker does (passes, the worker beat, the broker queue watch), for a
   window each; Redis commands per second from ``INFO commandstats`` deltas,
   less a window with no sweeper (the live runs' heartbeats and the worker's
   polling). Eight must not cost eight times one: the runs due are handed to
   one sweeper each (``claim_due.lua``).
"""

from __future__ import annotations

import os
import socket
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from benchmarks.app import HOLD_PREFIX, build_engine
from benchmarks.bulk import start_runs, wait_settled, wait_until
from benchmarks.cases.common import fmt_int
from benchmarks.harness import Bench, WorkerSetup
from benchmarks.model import CaseResult, Row, Target, median
from benchmarks.plan import Plan
from benchmarks.redisstats import Commands, CommandWindow
from benchmarks.sweeper import CountingSweep, PassCost, measure_pass, summary
from celery_durable import Engine, Settings

OWN_FLEET = True
CASE = "11. Sweep at scale"
PREFIX = "benchsweep"
SPARE_SLOTS = 8
START_THREADS = 8
STORED_LIMIT = 1.25
"""A nothing-due pass with the full store over one with only the live runs: flat is 1.0 (a stray command of
another client in the window is +5-10 %); O(stored runs) would be hundreds of times."""
SWEEPERS_LIMIT = 8.0


def _settings(bench: Bench) -> Settings:
    return bench.settings.model_copy(update={
        "key_prefix": PREFIX,
        "coordinator_queue": f"{PREFIX}.coordinator",
        "steps_queue": f"{PREFIX}.steps",
        "agents_queue": f"{PREFIX}.agents",
    })


def _running(bench: Bench, engine: Engine, run_ids: list[str]) -> int:
    pipe = bench.raw.pipeline(transaction=False)
    for run_id in run_ids:
        pipe.hget(engine.store.run_keys(run_id).run, "steps_running")
    return sum(1 for value in pipe.execute() if value == "1")


def _passes(bench: Bench, sweep: CountingSweep, count: int, due: list[str] | None = None) -> list[PassCost]:
    """``count`` passes; with ``due``, those runs are made due (score 0) before each."""
    costs = []
    for _ in range(count):
        if due:
            bench.raw.zadd(sweep.engine.store.keys.sweep_due, dict.fromkeys(due, 0))
        costs.append(measure_pass(bench.raw, sweep))
    return costs


def _drain(bench: Bench, sweep: CountingSweep) -> int:
    """Passes until one finds nothing due (checks that fell due while nobody swept); runs looked at."""
    looked = sweep.looked
    while measure_pass(bench.raw, sweep).looked:
        pass
    return sweep.looked - looked


@dataclass(frozen=True, slots=True)
class Window:
    """What Redis ran while some sweepers ran for a while, and how many runs they looked at."""

    sweepers: int
    whole: bool
    commands: Commands
    seconds: float
    looked: int

    @property
    def per_second(self) -> float:
        return self.commands.total / self.seconds


def _window(bench: Bench, engine: Engine, count: int, seconds: float, due: list[str], whole: bool) -> Window:
    """``count`` sweepers running their own loops for ``seconds``; ``due`` falls due at the window's start.

    ``whole``: each sweeper started as a worker starts it (passes, worker beat,
    broker queue watch); else its passes only (``CountingSweep.start_passes``).
    """
    host = f"{socket.gethostname()}/{os.getpid()}"
    sweepers = [  # an engine each, as each worker process has its own
        CountingSweep(build_engine(engine.settings), worker_id=f"bench-sweeper-{i}@{host}" if whole else "")
        for i in range(count)
    ]
    for sweeper in sweepers:
        sweeper.start() if whole else sweeper.start_passes()
    try:
        time.sleep(min(1.0, seconds / 2))  # every sweeper past its first (randomly delayed) pass
        looked = sum(s.looked for s in sweepers)
        with CommandWindow(bench.raw) as window:
            started = time.perf_counter()
            bench.raw.zadd(engine.store.keys.sweep_due, dict.fromkeys(due, 0))
            time.sleep(seconds)
            elapsed = time.perf_counter() - started
        looked = sum(s.looked for s in sweepers) - looked
    finally:
        with ThreadPoolExecutor(max(1, count)) as pool:  # each stop waits for its loop's current sleep
            list(pool.map(lambda sweeper: sweeper.stop(), sweepers))
    return Window(count, whole, window.commands, elapsed, looked)


def _pass_rows(live: int, stored: int, small: dict[str, Any], big: dict[str, Any],
               small_due: dict[str, Any], big_due: dict[str, Any], due_costs: list[PassCost]) -> list[Row]:
    growth = big["commands"] / small["commands"] if small["commands"] else float("nan")
    per_run = (big_due["commands"] - big["commands"]) / max(1.0, big_due["looked"])
    return [
        Row(CASE, f"sweep pass, nothing due, {fmt_int(live)} runs stored (all live)", "commands",
            [float(c) for c in small["commands_each"]],
            note=f"{small['wall_ms']:.2f} ms wall, {small['redis_usec']:.0f} us of Redis time"),
        Row(CASE, f"sweep pass, nothing due, {fmt_int(stored)} runs stored ({fmt_int(live)} live)", "commands",
            [float(c) for c in big["commands_each"]],
            target=Target(f"<= {STORED_LIMIT}x the pass over {fmt_int(live)} stored (O(due), not O(stored))",
                   STORED_LIMIT), checked=growth,
            note=f"{growth:.2f}x the pass over {fmt_int(live)} stored; {big['wall_ms']:.2f} ms wall, "
            f"{big['redis_usec']:.0f} us of Redis time"),
        Row(CASE, f"sweep pass, all {fmt_int(live)} live runs due, {fmt_int(stored)} stored", "commands",
            [float(c.commands) for c in due_costs],
            note=f"{per_run:.1f} commands per run looked at; {big_due['redis_usec']:.0f} us of Redis time; "
            f"with {fmt_int(live)} stored: {small_due['commands']:.0f} commands"),
        Row(CASE, f"sweep pass wall time, all {fmt_int(live)} live runs due, {fmt_int(stored)} stored", "ms",
            [c.wall_ms for c in due_costs],
            note=f"{big_due['wall_ms'] / max(1.0, big_due['looked']):.2f} ms per run looked at, one thread; "
            f"with {fmt_int(live)} stored: {small_due['wall_ms']:.1f} ms"),
    ]


def _window_rows(many: int, windows: dict[tuple[int, bool], list[Window]], background: float) -> list[Row]:
    rate = {key: [w.per_second - background for w in found] for key, found in windows.items()}
    looked = {key: median([float(w.looked) for w in found]) for key, found in windows.items()}

    def ratio(whole: bool) -> float:
        # A short window (the smoke run's) can leave nothing above the background: no ratio then.
        one = median(rate[(1, whole)])
        return median(rate[(many, whole)]) / one if one > 0 else float("nan")

    extra = (median(rate[(many, True)]) - median(rate[(1, True)])) / (many - 1)
    return [
        Row(CASE, "Redis commands/s from sweeping, 1 sweeper", "cmd/s", rate[(1, True)],
            note=f"less {background:,.0f} cmd/s with no sweeper (the live runs' heartbeats, the worker's polling)"),
        Row(CASE, f"Redis commands/s from sweeping, {many} sweepers", "cmd/s", rate[(many, True)],
            note=f"each sweeper past the first adds {extra:.0f} cmd/s"),
        Row(CASE, f"Redis commands/s, {many} sweepers vs 1", "x", [ratio(True)],
            target=Target(f"< {SWEEPERS_LIMIT:g}x (does not multiply by {many})", SWEEPERS_LIMIT)),
        Row(CASE, f"runs looked at in a window where the live runs fall due, {many} sweepers vs 1", "x",
            [looked[(many, True)] / looked[(1, True)] if looked[(1, True)] else float("nan")],
            note=f"looked at {looked[(1, True)]:.0f} times by 1 sweeper, {looked[(many, True)]:.0f} by {many} "
            "together: due runs are shared, not looked at by each"),
        Row(CASE, f"what-if, passes only (no worker beat, no queue watch): {many} sweepers vs 1", "x",
            [ratio(False)],
            note=f"{median(rate[(1, False)]):.0f} cmd/s by 1, {median(rate[(many, False)]):.0f} by {many}"),
    ]


def run(bench: Bench, plan: Plan) -> CaseResult:
    live, stored, many = plan.sweep_live, plan.sweep_stored, plan.sweepers
    result = CaseResult(
        key="sweep",
        title=f"Sweep at scale: {fmt_int(stored)} runs stored, {fmt_int(live)} live; one pass; "
        f"{many} sweepers vs 1",
        setup=f"Own key prefix and queues; {fmt_int(live)} live runs (one blocking step each) on 1 worker "
        f"process (-P threads -c {live + SPARE_SLOTS}) started without its recovery sweep; the rest "
        f"finished one-step runs. Passes: RecoverySweep.sweep_once() in the benchmark process, "
        f"{plan.sweep_passes} per point, INFO commandstats around each. Sweepers: RecoverySweep instances "
        f"(an engine each, started as a worker starts them: passes, worker beat, queue watch; or, what-if, "
        f"their passes only) in threads of the benchmark process; {plan.sweep_window:g} s windows at whose start "
        f"all {fmt_int(live)} live runs fall due; {plan.repeat} round(s) of 1 and {many}, then one window of "
        "none (the background, subtracted).",
    )
    engine = build_engine(_settings(bench))
    client = engine.client()
    bench.use_fleet(WorkerSetup(1, "threads", live + SPARE_SLOTS), engine.settings, {"BENCH_NO_SWEEP": "1"},
                    fresh=True)
    group = uuid.uuid4().hex
    held = [run_id for run_id, _ in start_runs(client, "bench.hold", [{"group": group}] * live, START_THREADS)]
    try:
        wait_until(lambda: _running(bench, engine, held) == live, plan.timeout, f"{live} held runs running")
        sweep = CountingSweep(engine)
        drained = [_drain(bench, sweep)]
        small = _passes(bench, sweep, plan.sweep_passes)
        small_due = _passes(bench, sweep, plan.sweep_passes, held)
        filled = time.perf_counter()
        finished = [run_id for run_id, _ in start_runs(client, "bench.one-step", [{}] * (stored - live),
                                                        START_THREADS)]
        # A second between polls is nothing beside a full fill; the smoke run fills in a fraction of one.
        states = wait_settled(bench.raw, engine, finished, plan.timeout, poll=0.25 if plan.quick else 1.0)
        fill_seconds = time.perf_counter() - filled
        if any(s.status != "completed" for s in states):
            raise RuntimeError("a one-step run of the sweep case's store did not complete")
        drained.append(_drain(bench, sweep))
        big = _passes(bench, sweep, plan.sweep_passes)
        big_due = _passes(bench, sweep, plan.sweep_passes, held)
        windows: dict[tuple[int, bool], list[Window]] = {}
        for r in range(plan.repeat):
            order = [(1, True), (many, True), (1, False), (many, False)]
            for count, whole in order if r % 2 == 0 else order[::-1]:
                found = _window(bench, engine, count, plan.sweep_window, held, whole)
                windows.setdefault((count, whole), []).append(found)
        quiet = _window(bench, engine, 0, plan.sweep_window, held, True)
    finally:
        bench.raw.rpush(f"{HOLD_PREFIX}:{group}", *(["go"] * live))
    wait_settled(bench.raw, engine, held, plan.timeout)
    summaries = {name: summary(costs) for name, costs in
                 (("small", small), ("small_due", small_due), ("big", big), ("big_due", big_due))}
    result.rows += _pass_rows(live, stored, summaries["small"], summaries["big"], summaries["small_due"],
                              summaries["big_due"], big_due)
    result.rows += _window_rows(many, windows, quiet.per_second)
    result.details = {
        "stored_runs": stored,
        "live_runs": live,
        "fill_seconds": fill_seconds,
        "drained_before_passes": drained,
        "passes": summaries,
        "background": _window_json(quiet),
        "windows": {f"{count} {'whole' if whole else 'passes only'}": [_window_json(w) for w in found]
                    for (count, whole), found in windows.items()},
    }
    return result


def _window_json(window: Window) -> dict[str, Any]:
    return {
        "seconds": window.seconds,
        "looked": window.looked,
        "commands_per_s": window.per_second,
        "by_command_per_s": {name: round(n / window.seconds, 2) for name, n in window.commands.calls.most_common()},
    }
