"""Case 9 (issue 11): n runs sleeping until one instant; what the sweep costs while they wait.

Each run of ``bench.timer`` calls ``ctx.sleep_until(T)`` with the same
aware instant T, then journals one no-op step and completes. T is set a
little after all n runs can have started and reached their wait (the rate
is taken from a pilot batch on the same fleet); the case checks that every
run was waiting, with its timer in the sweep's due index at T and nothing
due before, and fails if T came first.

Firing: the time from T until each run completed, from the run records'
``finished_at`` (ms, written by the engine), so the client polling slowly
costs no precision: the last one is "all have continued". Measured on 1 and
on 2 worker processes (each runs one recovery sweep, which fires timers).

Idle cost: while runs wait and nothing is due, one pass of the sweep
(``RecoverySweep.sweep_once`` run in this process against the same Redis,
``INFO commandstats`` around it, Lua's own commands included) at 0, 1,000
and 10,000 waiting runs. It must not grow with waiting runs that are not due.

Baseline: none. Plain Celery has no durable timer (an ETA task waits in a
worker's memory, and a worker holding 10,000 of them is the opposite of
holding none), so there is nothing to put beside it.
"""

from __future__ import annotations

import functools
import threading
import time
from typing import cast

from benchmarks.bulk import start_runs, wait_settled, wait_until
from benchmarks.cases.common import fmt_int, profiled
from benchmarks.harness import Bench, WorkerSetup
from benchmarks.model import CaseResult, Row, Target, median, percentile
from benchmarks.plan import Plan
from benchmarks.sweeper import CountingSweep, PassCost, measure_pass, summary

PROFILE_DURABLE_ONLY = True
"""--py-spy records the fleet while the timers fire (``common.profiled``), not the whole case."""
OWN_FLEET = True
"""Starts the fleets it measures; the next case that needs the session's fleet gets it back."""
CASE = "9. Timers"
CONCURRENCY = 8
START_THREADS = 8
MARGIN = 1.5
"""T leaves the estimated start time times this, plus SLACK_S, plus a lease per idle point (below)."""
SLACK_S = 5.0
"""Seconds of slack at full size (less when starting takes less than a lease)."""
WATCH_SECONDS = 0.25
GROWTH_LIMIT = 1.25
"""Commands per idle pass at the most waiting runs over those at none. Flat is 1.0; one stray command of
another client in a median window is +5-10 %; growth with waiting runs would be thousands of times."""


def _all_at(bench: Bench, at_ms: int, wanted: int) -> bool:
    """The sweep's due index holds ``wanted`` runs at T: waiting, with nothing to look at before."""
    return cast(int, bench.raw.zcount(bench.engine.store.keys.sweep_due, at_ms - 1, at_ms + 1)) >= wanted


def _pilot(bench: Bench, count: int, timeout: float, poll: float = 0.25) -> float:
    """Runs per second this fleet takes from start to a finished pass (timers already due)."""
    now_ms = int(time.time() * 1000)
    started = time.perf_counter()
    ids = [run_id for run_id, _ in start_runs(bench.client, "bench.timer", [{"at_ms": now_ms}] * count, START_THREADS)]
    wait_settled(bench.raw, bench.engine, ids, timeout, poll)
    return count / (time.perf_counter() - started)


def _instant(plan: Plan, rate: float, idle_points: int, lease: float) -> int:
    """T in ms: after all runs can be waiting and, at each idle point, the sweep has them at T.

    A run's first sweep check falls due a lease after its start. A timer due
    before that check moves the run to T at once; one due later moves it
    there only once that check was made, a lease after the run started.
    """
    starting = plan.timer_runs / rate * MARGIN
    settle = lease + 2.0 if starting + SLACK_S > lease else 0.25
    seconds = starting + settle * max(1, idle_points) + SLACK_S * min(1.0, starting / lease)
    return int((time.time() + seconds + 0.5) * 1000)


class FireWatch:
    """Samples, from T on, how many timers the sweep has not claimed yet and the coordinator backlog.

    A timer due at T stays in the sweep's due index at T until a sweeper
    claims it (``claim_due.lua`` moves it on); the wake message it sends then
    waits in the coordinator queue (a Redis list of the broker) for a worker.
    So the two curves say whether firing or the passes after it take the time.
    """

    def __init__(self, bench: Bench, at_ms: int, every: float = WATCH_SECONDS) -> None:
        self.bench, self.at_ms, self.every = bench, at_ms, every
        self.samples: list[tuple[float, int, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="bench-fire-watch", daemon=True)

    def __enter__(self) -> FireWatch:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()

    def _loop(self) -> None:
        while not self._stop.is_set():
            before_t = self.at_ms / 1000 - time.time()
            if before_t <= 0:
                self._sample()
            self._stop.wait(self.every if before_t <= 0 else min(self.every, before_t))

    def _sample(self) -> None:
        pipe = self.bench.raw.pipeline(transaction=False)
        pipe.zcount(self.bench.engine.store.keys.sweep_due, self.at_ms - 1, self.at_ms + 1)
        pipe.llen(self.bench.settings.coordinator_queue)
        unclaimed, backlog = pipe.execute()
        self.samples.append((time.time() - self.at_ms / 1000, int(unclaimed), int(backlog)))

    def facts(self) -> dict[str, float]:
        claimed = next((t for t, unclaimed, _ in self.samples if unclaimed == 0), float("nan"))
        return {
            "all_claimed_by_sweep_after_s": claimed,
            "peak_coordinator_backlog": float(max((b for _, _, b in self.samples), default=0)),
        }


def _round(
    bench: Bench, plan: Plan, rate: float, idle_points: tuple[int, ...]
) -> tuple[list[float], dict[int, list[PassCost]], dict[str, float]]:
    """One instant for plan.timer_runs runs: (seconds from T to each run completed, idle passes, facts)."""
    n = plan.timer_runs
    lease = bench.settings.lease_seconds
    at_ms = _instant(plan, rate, len([p for p in idle_points if p]), lease)
    sweep = CountingSweep(bench.engine)
    idle: dict[int, list[PassCost]] = {}
    run_ids: list[str] = []
    started = time.perf_counter()
    for point in sorted({*idle_points, n}):
        run_ids += [
            run_id
            for run_id, _ in start_runs(
                bench.client, "bench.timer", [{"at_ms": at_ms}] * (point - len(run_ids)), START_THREADS
            )
        ]
        wanted = len(run_ids)
        left = at_ms / 1000 - time.time() - 0.5
        wait_until(functools.partial(_all_at, bench, at_ms, wanted), max(0.0, left),
                   f"{fmt_int(wanted)} runs waiting for T with nothing due before it")
        if point in idle_points:
            idle[point] = [measure_pass(bench.raw, sweep) for _ in range(plan.timer_passes)]
    all_waiting = time.perf_counter() - started
    if time.time() * 1000 >= at_ms:
        raise RuntimeError("the instant came before every run was waiting and measured: raise MARGIN")
    lead = at_ms / 1000 - time.time()
    with profiled(bench, f"fire-{len(bench.workers)}w"), FireWatch(bench, at_ms) as watch:
        states = wait_settled(bench.raw, bench.engine, run_ids, plan.timeout + lead, poll=0.5)
    bad = [s for s in states if s.status != "completed"]
    if bad:
        raise RuntimeError(f"{len(bad)} timer runs ended {bad[0].status}, e.g. {bad[0].run_id}")
    continued = sorted((s.finished_ms or 0) / 1000 - at_ms / 1000 for s in states)
    facts = {
        "all_waiting_after_s": all_waiting,
        "lead_before_T_s": lead,
        "take_overs": float(sum(s.attempt - 1 for s in states)),
        "runs_taken_over": float(sum(1 for s in states if s.attempt > 1)),
        **watch.facts(),
    }
    return continued, idle, facts


def run(bench: Bench, plan: Plan) -> CaseResult:
    n = plan.timer_runs
    result = CaseResult(
        key="timers",
        title=f"Timers: {fmt_int(n)} runs sleeping until one instant; the sweep's cost while they wait",
        setup=f"{fmt_int(n)} runs of ctx.sleep_until(T) then one no-op step, T the same aware instant for all, "
        f"set after every run was waiting; measured on {' and '.join(str(w) for w in plan.timer_fleets)} "
        f"worker process(es) (-P threads -c {CONCURRENCY}, each running the engine's recovery sweep, which "
        "fires timers). Continued = the run's finished_at (written by the engine after the step that follows "
        f"the sleep was journaled). Idle passes: RecoverySweep.sweep_once() in the benchmark process, "
        f"{plan.timer_passes} passes per point, INFO commandstats around each (Lua's commands included). "
        "No plain-Celery baseline: Celery has no durable timer.",
    )
    details: dict[str, object] = {}
    idle: dict[int, list[PassCost]] = {}
    for workers in plan.timer_fleets:
        env = {"BENCH_NO_SWEEP": "1"} if plan.external_sweep else None
        bench.use_fleet(WorkerSetup(workers, "threads", CONCURRENCY), env=env)
        # What-if: the only sweep is a thread of this process, which holds no other work (no GIL to share).
        external = CountingSweep(bench.engine) if plan.external_sweep else None
        if external is not None:
            external.start()
        try:
            # The smoke run's pilot takes a fraction of a second: a 0.25 s poll made its rate (and T) far off.
            rate = _pilot(bench, plan.timer_pilot, plan.timeout, 0.05 if plan.quick else 0.25)
            points = plan.timer_idle_points if workers == plan.timer_fleets[0] else ()
            continued, measured_idle, facts = _round(bench, plan, rate, points)
        finally:
            if external is not None:
                external.stop()
        idle |= measured_idle
        label = f"{workers} worker process{'es' if workers > 1 else ''}"
        result.rows += [
            Row(CASE, f"{fmt_int(n)} timers due at once -> all continued, {label}", "s", [continued[-1]],
                note=f"{n / continued[-1]:.0f} runs/s; first continued after {continued[0]:.2f} s"),
            Row(CASE, f"{fmt_int(n)} timers due at once -> median run continued, {label}", "s",
                [median(continued)], note=f"p99 {percentile(continued, 99):.2f} s"),
            Row(CASE, f"{fmt_int(n)} timers due at once -> all fired (claimed by a sweep), {label}", "s",
                [facts["all_claimed_by_sweep_after_s"]],
                note=f"peak coordinator backlog {facts['peak_coordinator_backlog']:,.0f} messages; sampled every "
                f"{WATCH_SECONDS:g} s"),
            Row(CASE, f"take-overs among the {fmt_int(n)} timer runs, {label}", "runs", [facts["runs_taken_over"]],
                target=Target("0", 0)),
        ]
        details[label] = {
            "pilot_runs_per_s": rate,
            "continued_s": {"first": continued[0], "p50": median(continued), "p99": percentile(continued, 99),
                            "last": continued[-1]},
            **facts,
        }
    if idle:
        counted = sorted(idle)
        base = summary(idle[counted[0]])
        for point in counted:
            cost = summary(idle[point])
            result.rows.append(Row(
                CASE, f"sweep pass with nothing due, {fmt_int(point)} runs waiting", "commands",
                [float(c.commands) for c in idle[point]],
                note=f"{cost['wall_ms']:.2f} ms wall, {cost['redis_usec']:.0f} us of Redis time, "
                f"{cost['scripts']:.0f} script(s)",
            ))
        top = summary(idle[counted[-1]])
        growth = top["commands"] / base["commands"] if base["commands"] else float("nan")
        result.rows.append(Row(
            CASE, f"sweep pass cost, {fmt_int(counted[-1])} waiting vs {fmt_int(counted[0])}", "x", [growth],
            target=Target(f"<= {GROWTH_LIMIT}x (flat: not O(waiting runs))", GROWTH_LIMIT),
            note=f"wall time {top['wall_ms'] / base['wall_ms']:.2f}x",
        ))
        details["idle_passes"] = {str(point): summary(idle[point]) for point in counted}
    result.details = details
    return result

