"""Case 21 (issue 38): schedules at scale, fired by the workers' sweep, no beat.

**The fleet.** n schedules (10,000) of ``bench.one-step`` (one no-op step),
each firing once a period (60 s): schedule i is the 6-field cron
``"<i mod 60> * * * * *"``, so 1/60 of them fall due at each second, about
n/60 ticks a second (≈167), as a fleet of many every-minute schedules does
once their creation times have spread. Default overlap (``skip``: each tick
reads whether the last run still runs) and catch-up window. Fired by the
fleet: 2 worker processes, ``-P threads -c 8``, each running the engine's
recovery sweep, which claims due ticks (``schedule_claim.lua``), starts each
tick's run (an id derived from the tick: ``create_run.lua`` makes it once)
and records the tick (``schedule_record.lua``).

Measured over a window of whole periods (3) that begins a period boundary
after the last schedule was created: every schedule's ticks in the window
are known in advance, and so are their run ids. From the run records (ms,
written by the engine's scripts): the lag from the tick to the run started
(``started_at``, its first pass) p50/p99, and from the tick to the run made
(``created_at``: the fire itself). Missed: a tick of the window with no run
(or a ``missed``/``skipped`` action); duplicates: a tick with more than one
run listed for it by its schedule, or more than one ``started`` action.
Redis commands per tick: ``INFO commandstats`` over the window (Lua's own
commands included) over the ticks in it: the fire and the whole one-step run,
plus the fleet's idle beat and sweep (small). Sampled every
``WATCH_SECONDS`` meanwhile: schedules overdue and not claimed (the sweep's
backlog) and the coordinator queue.

**The sweep's cost per tick, in-process.** As ``benchmarks/schedule_firing.py``
measured it: n schedules (1,000 and 10,000) created under a clock frozen at C
by an engine of this process whose messages are kept, not sent (the fleet
stopped, so Redis serves nothing else), then the clock set one period on, so
exactly one tick of each is due; ``fire_due`` called (the sweep's own code)
until none is due. Time and Redis commands per tick at each size: flat, since
a claim takes the due ones off one zset (O(log n + due)).

Baseline: none (plain Celery's beat is one process that sends tasks; it
neither fires exactly once across processes nor survives its own death).
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from benchmarks.cases.common import KeptSender, fmt_int, profiled
from benchmarks.harness import Bench, WorkerSetup, cpu_seconds
from benchmarks.model import CaseResult, Row, Target, median, percentile
from benchmarks.plan import Plan
from benchmarks.redisstats import CommandWindow, command_stats, server_cpu_seconds
from celery_durable import Client, Engine
from celery_durable.broker import schema
from celery_durable.schedules.firing import fire_due

PROFILE_DURABLE_ONLY = True
"""--py-spy records the fleet during the window (``common.profiled``), not the whole case."""
OWN_FLEET = True
CASE = "21. Schedules"
WORKERS = 2
CONCURRENCY = 8
THREADS = 8
"""Client threads that create and delete the schedules."""
WORKFLOW = "bench.one-step"
NAMESPACE = "default"
WATCH_SECONDS = 0.5
BATCH = 1_000
"""Keys read per pipelined round trip."""
LAG_GOAL_S = 1.0
FLAT_LIMIT = 1.5
"""The sweep's time per tick at the most schedules over the fewest: flat, not O(schedules)."""


def cron_of(i: int, period: int) -> str:
    """Schedule i's tick: second ``i mod period`` of every period (6 fields, seconds first)."""
    offset = i % period
    seconds = str(offset) if period == 60 else f"{offset}-59/{period}"
    return f"{seconds} * * * * *"


def schedule_ids(count: int) -> list[str]:
    return [f"sched-{i:05d}" for i in range(count)]


def _each(work: Callable[[int], Any], count: int) -> float:
    """``work(i)`` for i < count from ``THREADS`` threads; seconds it took."""
    started = time.perf_counter()
    with ThreadPoolExecutor(THREADS) as pool:
        list(pool.map(work, range(count)))
    return time.perf_counter() - started


def create(client: Client, ids: Sequence[str], period: int, catchup_window: float = 60) -> float:
    return _each(
        lambda i: client.create_schedule(ids[i], WORKFLOW, cron=cron_of(i, period), catchup_window=catchup_window),
        len(ids),
    )


# -- the fleet ---------------------------------------------------------------------------------


class Watch:
    """Samples the schedules overdue and not claimed, and the coordinator backlog, until stopped."""

    def __init__(self, bench: Bench) -> None:
        self.bench = bench
        self.samples: list[tuple[int, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="bench-schedule-watch", daemon=True)

    def __enter__(self) -> Watch:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()

    def _loop(self) -> None:
        while not self._stop.wait(WATCH_SECONDS):
            pipe = self.bench.raw.pipeline(transaction=False)
            # A claimed schedule is scored a lease on: what is at or before now is due and unclaimed.
            pipe.zcount(self.bench.engine.store.keys.schedules_due, "-inf", int(time.time() * 1000) - 1)
            pipe.llen(self.bench.settings.coordinator_queue)
            overdue, backlog = pipe.execute()
            self.samples.append((int(overdue), int(backlog)))

    def facts(self) -> dict[str, float]:
        return {
            "peak_overdue_unclaimed": float(max((o for o, _ in self.samples), default=0)),
            "median_overdue_unclaimed": median([float(o) for o, _ in self.samples]),
            "peak_coordinator_backlog": float(max((b for _, b in self.samples), default=0)),
        }


@dataclass(frozen=True, slots=True)
class Tick:
    schedule_id: str
    tick_ms: int

    @property
    def run_id(self) -> str:
        return schema.schedule_run_id(NAMESPACE, self.schedule_id, self.tick_ms)


def window_ticks(ids: Sequence[str], period: int, start_ms: int, periods: int) -> list[Tick]:
    """Every tick of every schedule in ``[start_ms, start_ms + periods * period)``; start_ms on a period boundary."""
    return [
        Tick(schedule_id, start_ms + (i % period) * 1000 + k * period * 1000)
        for i, schedule_id in enumerate(ids)
        for k in range(periods)
    ]


def _read_runs(bench: Bench, ticks: Sequence[Tick]) -> list[list[str | None]]:
    fields = ["status", "created_at", "started_at", "attempt", "scheduled_at"]
    out: list[list[str | None]] = []
    for start in range(0, len(ticks), BATCH):
        pipe = bench.raw.pipeline(transaction=False)
        for tick in ticks[start : start + BATCH]:
            pipe.hmget(bench.engine.store.run_keys(tick.run_id).run, fields)
        out += pipe.execute()
    return out


def _until_started(bench: Bench, ticks: Sequence[Tick], timeout: float) -> list[list[str | None]]:
    """The runs of ``ticks`` once each has started (a missing one is waited for until ``timeout``)."""
    deadline = time.monotonic() + timeout
    while True:
        rows = _read_runs(bench, ticks)
        waiting = sum(1 for row in rows if not row[2])
        if waiting == 0 or time.monotonic() > deadline:
            return rows
        time.sleep(WATCH_SECONDS)


def _per_schedule(bench: Bench, ids: Sequence[str], start_ms: int, end_ms: int) -> tuple[Counter[Tick], Counter[str]]:
    """Runs listed by each schedule per tick of the window, and its recent actions of window ticks by kind
    (``started`` counted per tick: a tick started twice shows twice)."""
    listed: Counter[Tick] = Counter()
    actions: Counter[str] = Counter()
    started: Counter[Tick] = Counter()
    store = bench.engine.store
    for first in range(0, len(ids), BATCH):
        chunk = ids[first : first + BATCH]
        pipe = bench.raw.pipeline(transaction=False)
        for schedule_id in chunk:
            k = store.schedule_keys(NAMESPACE, schedule_id)
            pipe.zrangebyscore(k.runs, start_ms, end_ms - 1, withscores=True)
            pipe.lrange(k.recent, 0, -1)
        replies = pipe.execute()
        for j, schedule_id in enumerate(chunk):
            for _run_id, score in replies[2 * j]:
                listed[Tick(schedule_id, int(score))] += 1
            for raw in replies[2 * j + 1]:
                item = json.loads(raw)
                if start_ms <= int(item["tick"]) < end_ms:
                    actions[item["action"]] += 1
                    if item["action"] == "started":
                        started[Tick(schedule_id, int(item["tick"]))] += 1
    twice = sum(count - 1 for count in started.values() if count > 1)
    actions["started_twice"] = twice
    return listed, actions



def fleet(bench: Bench, plan: Plan) -> dict[str, Any]:
    n, period, periods = plan.schedule_count, plan.schedule_period, plan.schedule_periods
    bench.use_fleet(WorkerSetup(WORKERS, "threads", CONCURRENCY))
    ids = schedule_ids(n)
    create_s = create(bench.client, ids, period)
    # The window begins a period boundary at least a second after the last schedule was made.
    boundary = period * 1000
    start_ms = ((int(time.time() * 1000) + 1_000) // boundary + 1) * boundary
    end_ms = start_ms + periods * boundary
    ticks = window_ticks(ids, period, start_ms, periods)
    with Watch(bench) as watch:
        while time.time() * 1000 < start_ms:  # the window's start, a time of the wall clock
            time.sleep(min(WATCH_SECONDS, max(0.0, start_ms / 1000 - time.time())))
        load_before = os.getloadavg()[0]
        cpu_before, redis_before = cpu_seconds(bench.worker_pids()), server_cpu_seconds(bench.raw)
        commands_before = command_stats(bench.raw)
        with profiled(bench, "window"):
            while time.time() * 1000 < end_ms:
                time.sleep(min(WATCH_SECONDS, max(0.0, end_ms / 1000 - time.time())))
        commands = command_stats(bench.raw) - commands_before
        worker_cpu = cpu_seconds(bench.worker_pids()) - cpu_before
        redis_cpu = server_cpu_seconds(bench.raw) - redis_before
        load_after = os.getloadavg()[0]
    rows = _until_started(bench, ticks, max(30.0, period))
    listed, actions = _per_schedule(bench, ids, start_ms, end_ms)
    deleted_s = _each(lambda i: bench.client.delete_schedule(ids[i]), n)

    lags, made = [], []
    missing = not_started = taken_over = 0
    for tick, (status, created, started, attempt, scheduled) in zip(ticks, rows, strict=True):
        if status is None:
            missing += 1
            continue
        if int(scheduled or 0) != tick.tick_ms:
            raise RuntimeError(f"run {tick.run_id} is of tick {scheduled}, not {tick.tick_ms}")
        made.append((int(created or 0) - tick.tick_ms) / 1000)
        if not started:
            not_started += 1
            continue
        lags.append((int(started) - tick.tick_ms) / 1000)
        taken_over += int(attempt or 1) > 1
    expected = set(ticks)
    extra = sum(count - 1 for count in listed.values() if count > 1) + sum(1 for t in listed if t not in expected)
    duplicates = extra + actions["started_twice"]
    missed = missing + actions["missed"] + actions["skipped"]
    count = len(ticks)
    return {
        "schedules": n,
        "period_s": period,
        "ticks_per_s": n / period,
        "window_s": periods * period,
        "ticks": count,
        "create_s": create_s,
        "create_per_s": n / create_s,
        "delete_s": deleted_s,
        "lag_started_s": {"p50": median(lags), "p90": percentile(lags, 90), "p99": percentile(lags, 99),
                          "max": max(lags, default=float("nan"))},
        "lag_made_s": {"p50": median(made), "p99": percentile(made, 99), "max": max(made, default=float("nan"))},
        "missed": missed,
        "missing_runs": missing,
        "not_started": not_started,
        "duplicates": duplicates,
        "actions_in_window": dict(actions),
        "runs_taken_over": taken_over,
        "redis_commands_per_tick": commands.total / count,
        "redis_commands_per_tick_top": {name: calls / count for name, calls in commands.top(12).items()},
        "redis_usec_per_tick": commands.total_usec / count,
        "worker_cpu_ms_per_tick": 1000 * worker_cpu / count,
        "redis_cpu_ms_per_tick": 1000 * redis_cpu / count,
        "load_average": [load_before, load_after],
        **watch.facts(),
    }


# -- the sweep's cost per tick, in-process --------------------------------------------------------


def sweep_cost(bench: Bench, n: int, period: int) -> dict[str, Any]:
    """n schedules, one tick of each due at once, fired by ``fire_due`` in this process."""
    from benchmarks.app import WORKFLOWS

    prefix = f"{bench.settings.key_prefix}-sched{n}"
    engine = Engine(WORKFLOWS, bench.settings.model_copy(update={"key_prefix": prefix}))
    kept = KeptSender()
    engine.sender = kept
    store = engine.store
    frozen = [(store.now_ms() // 1000) * 1000]
    store.clock = lambda: frozen[0]
    try:
        create(engine.client(), schedule_ids(n), period)
        frozen[0] += period * 1000  # every schedule's first tick is due, its second not yet
        sweeps = 0
        with CommandWindow(bench.raw) as window:
            started = time.perf_counter()
            while True:
                sweeps += 1
                next_due = fire_due(engine)
                if next_due is None or next_due > frozen[0]:
                    break
            spent = time.perf_counter() - started
        ticks = len(kept.sent)
        commands = window.commands
        if ticks != n:
            raise RuntimeError(f"{ticks} ticks fired of {n} schedules with one due each")
        return {
            "schedules": n,
            "ticks": ticks,
            "sweeps": sweeps,
            "seconds": spent,
            "ms_per_tick": 1000 * spent / ticks,
            "redis_commands_per_tick": commands.total / ticks,
            "redis_usec_per_tick": commands.total_usec / ticks,
            "redis_commands_per_tick_top": {name: calls / ticks for name, calls in commands.top(10).items()},
        }
    finally:
        kept.sent.clear()
        for keys in _batches(bench.raw.scan_iter(match=f"{prefix}:*", count=1_000), BATCH):
            bench.raw.unlink(*keys)


def _batches(items: Any, size: int) -> Any:
    batch: list[str] = []
    for item in items:
        batch.append(item)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


def run(bench: Bench, plan: Plan) -> CaseResult:
    n, period = plan.schedule_count, plan.schedule_period
    sizes = plan.schedule_cost_sizes
    result = CaseResult(
        key="schedules",
        title=f"Schedules: {fmt_int(n)} schedules each firing every {period} s, on {WORKERS} worker processes",
        setup=f"{fmt_int(n)} schedules of `{WORKFLOW}` (one no-op step), schedule i the cron "
        f"`<i mod {period}> * * * * *` (about {n / period:,.0f} ticks/s), default overlap and catch-up window, "
        f"fired by {WORKERS} worker processes (-P threads -c {CONCURRENCY}), each running the engine's sweep; "
        f"judged over {plan.schedule_periods} whole periods from the run records (ms). The sweep's cost per tick: "
        f"{' and '.join(fmt_int(s) for s in sizes)} schedules with one tick each due at once, fired by `fire_due` "
        "in this process (messages kept, fleet stopped). No plain-Celery baseline.",
    )
    # The in-process part first, with no fleet running: Redis then counts only the sweep's commands.
    bench.stop_workers()
    costs = {str(size): sweep_cost(bench, size, period) for size in sizes}
    facts = fleet(bench, plan)
    result.details = {"fleet": facts, "sweep_cost": costs}
    label = f"{fmt_int(n)} schedules, {facts['ticks_per_s']:,.0f} ticks/s, {WORKERS} worker processes"
    lag = facts["lag_started_s"]
    load = facts["load_average"]
    result.rows += [
        Row(CASE, f"{label}: lag tick -> run started, p50", "s", [lag["p50"]],
            note=f"tick -> run made p50 {facts['lag_made_s']['p50']:.3f} s, p99 {facts['lag_made_s']['p99']:.3f} s; "
            f"{fmt_int(facts['ticks'])} ticks over {facts['window_s']} s; load {load[0]:.1f} -> {load[1]:.1f}"),
        Row(CASE, f"{label}: lag tick -> run started, p99", "s", [lag["p99"]],
            target=Target(f"< {LAG_GOAL_S:g} s", LAG_GOAL_S),
            note=f"max {lag['max']:.3f} s; peak overdue unclaimed {facts['peak_overdue_unclaimed']:,.0f}, "
            f"peak coordinator backlog {facts['peak_coordinator_backlog']:,.0f}"),
        Row(CASE, f"{label}: duplicates", "ticks", [float(facts["duplicates"])], target=Target("0", 0)),
        Row(CASE, f"{label}: missed", "ticks", [float(facts["missed"])], target=Target("0", 0),
            note=f"actions of window ticks: {facts['actions_in_window']}; runs taken over {facts['runs_taken_over']}"),
        Row(CASE, f"{label}: Redis commands per tick", "commands", [facts["redis_commands_per_tick"]],
            note=f"the fire and its one-step run; worker CPU {facts['worker_cpu_ms_per_tick']:.2f} ms/tick, "
            f"Redis {facts['redis_cpu_ms_per_tick']:.3f} ms/tick"),
    ]
    for size in sizes:
        cost = costs[str(size)]
        result.rows.append(Row(
            CASE, f"sweep's cost per tick, {fmt_int(size)} schedules due at once", "ms", [cost["ms_per_tick"]],
            note=f"{cost['redis_commands_per_tick']:.1f} Redis commands/tick, "
            f"{cost['redis_usec_per_tick']:.0f} µs of Redis/tick; {cost['sweeps']} sweeps",
        ))
    if len(sizes) > 1:
        low, high = costs[str(sizes[0])], costs[str(sizes[-1])]
        result.rows.append(Row(
            CASE, f"sweep's cost per tick, {fmt_int(sizes[-1])} vs {fmt_int(sizes[0])} schedules", "x",
            [high["ms_per_tick"] / low["ms_per_tick"]],
            target=Target(f"<= {FLAT_LIMIT:g}x (flat)", FLAT_LIMIT),
            note=f"commands per tick {low['redis_commands_per_tick']:.1f} -> {high['redis_commands_per_tick']:.1f}",
        ))
    return result
