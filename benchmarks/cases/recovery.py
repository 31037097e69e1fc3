"""Case 6: after SIGKILL of every worker and a restart, how long until the run moves again.

A run of slow steps (``bench.ticker``, 20 ms each) is going; the harness
SIGKILLs each worker's whole process group, starts the fleet again at once,
and polls the run hash until ``steps_done`` grows. Recovery is lease-bound by
design: the dead attempt's lease must lapse before a sweep may take the run
over, so the workers here run with a short lease (stated in the setup). The
kill lands at a random point of the heartbeat cycle.
"""

from __future__ import annotations

import random
import time

from benchmarks.app import build_engine
from benchmarks.cases.common import fmt_int
from benchmarks.harness import Bench
from benchmarks.model import CaseResult, Row
from benchmarks.plan import Plan

CASE = "6. Recovery"
STEP_SECONDS = 0.02
POLL_SECONDS = 0.005


def _steps_done(bench: Bench, run_id: str) -> int:
    return int(bench.raw.hget(bench.engine.store.run_keys(run_id).run, "steps_done") or 0)


def _wait_for_progress(bench: Bench, run_id: str, beyond: int, timeout: float) -> float:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if _steps_done(bench, run_id) > beyond:
            return time.perf_counter()
        time.sleep(POLL_SECONDS)
    raise TimeoutError(f"run {run_id} made no progress within {timeout}s")


def run(bench: Bench, plan: Plan) -> CaseResult:
    tries = plan.recovery_tries
    lease = plan.recovery_lease_seconds
    settings = bench.settings.model_copy(update={"lease_seconds": lease})
    result = CaseResult(
        key="recovery",
        title="Recovery: SIGKILL of all workers, restart, time until the run makes progress again",
        setup=f"{tries} tries on one run of {STEP_SECONDS * 1000:.0f} ms steps; workers run with "
        f"lease_seconds={lease:g} (heartbeat every {min(lease / 3, 1.0):.2f} s, recovery sweep every "
        f"{min(lease / 4, 2.0) / 2:.2f}-{min(lease / 4, 2.0):.2f} s); the fleet is restarted right after the kill.",
    )
    jitter = random.Random(20_240_607)
    # The client that starts the run must share the workers' lease: it
    # schedules the run's first recovery check one lease after creation.
    client = build_engine(settings).client()
    bench.start_workers(settings)
    from_kill: list[float] = []
    from_restart: list[float] = []
    epochs: list[int] = []
    run_id = client.start_workflow("bench.ticker", args={"seconds": STEP_SECONDS})
    try:
        _wait_for_progress(bench, run_id, 2, plan.timeout)
        for _ in range(tries):
            time.sleep(0.3 + jitter.uniform(0, lease / 3))
            killed_at = time.perf_counter()
            bench.kill_workers()
            done = _steps_done(bench, run_id)
            bench.restart_workers(settings)
            restarted_at = time.perf_counter()
            moved_at = _wait_for_progress(bench, run_id, done, plan.timeout)
            from_kill.append(moved_at - killed_at)
            from_restart.append(moved_at - restarted_at)
            epochs.append(int(bench.raw.hget(bench.engine.store.run_keys(run_id).run, "epoch") or 0))
        client.cancel_workflow_run(run_id, timeout=plan.timeout)
    finally:
        bench.start_workers()
    result.rows = [
        Row(CASE, f"SIGKILL -> progress again, median of {fmt_int(tries)}", "s", from_kill,
            note=f"lease {lease:g} s; from the restart: {sorted(from_restart)[len(from_restart) // 2]:.2f} s"),
        Row(CASE, f"SIGKILL -> progress again, max of {fmt_int(tries)}", "s", [max(from_kill)]),
    ]
    result.details = {"from_kill_s": from_kill, "from_restart_s": from_restart, "epochs": epochs}
    return result
