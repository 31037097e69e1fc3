"""Case 7: Redis bytes per journaled step.

Two runs of ``bench.footprint`` (0 and n steps, each step returning the same
string payload); ``MEMORY USAGE ... SAMPLES 0`` (exact) of every key of each
run (the layout in ``celery_durable/broker/keys.py``: run, journal, progress,
steps, running). The difference divided by n is the cost of one journaled
step; minus the payload's JSON bytes, the engine's overhead per step.

Baseline: one plain Celery result of the same payload in the result backend
(``celery-task-meta-<id>``). The worker's peak RSS during the fan-out is
measured by the fan-out case and reported here too.
"""

from __future__ import annotations

import json

import redis

from benchmarks.cases.common import fmt_int
from benchmarks.harness import Bench
from benchmarks.model import CaseResult, Row, Target, median
from benchmarks.plan import Plan

CASE = "7. Footprint"
OVERHEAD_LIMIT = 256


def _run_bytes(bench: Bench, run_id: str) -> dict[str, int]:
    sizes: dict[str, int] = {}
    for key in bench.run_keys(run_id):
        used = bench.raw.memory_usage(key, samples=0)
        sizes[key.rsplit(":", 1)[1]] = int(used or 0)
    return sizes


def _celery_result_bytes(bench: Bench, payload: str, timeout: float) -> int:
    task = bench.engine.celery.tasks["bench.echo"]
    result = task.apply_async(args=[payload])
    result.get(timeout=timeout)
    client = redis.Redis.from_url(bench.engine.celery.conf.result_backend)
    try:
        return int(client.memory_usage(f"celery-task-meta-{result.id}", samples=0) or 0)
    finally:
        client.close()


def run(bench: Bench, plan: Plan) -> CaseResult:
    n, size = plan.footprint_steps, plan.footprint_payload
    payload_bytes = len(json.dumps("x" * size))
    result = CaseResult(
        key="footprint",
        title="Footprint: Redis bytes per journaled step, worker peak RSS",
        setup=f"Runs of 0 and {fmt_int(n)} steps, each returning a {size}-character string "
        f"({payload_bytes} bytes of JSON); MEMORY USAGE SAMPLES 0 of every key of the run.",
    )
    per_step: list[float] = []
    celery_per_result: list[float] = []
    breakdown: dict[str, float] = {}
    for _ in range(plan.repeat):
        _, empty = bench.run("bench.footprint", {"n": 0, "payload": size}, plan.timeout)
        _, full = bench.run("bench.footprint", {"n": n, "payload": size}, plan.timeout)
        before, after = _run_bytes(bench, empty.run_id), _run_bytes(bench, full.run_id)
        per_step.append((sum(after.values()) - sum(before.values())) / n)
        breakdown = {key: (after[key] - before.get(key, 0)) / n for key in after}
        celery_per_result.append(float(_celery_result_bytes(bench, "x" * size, plan.timeout)))
    overhead = median(per_step) - payload_bytes
    result.rows = [
        Row(CASE, f"Redis bytes per journaled step ({payload_bytes}-byte payload)", "bytes", per_step,
            celery_per_result, Target(f"<= payload + {OVERHEAD_LIMIT} bytes", OVERHEAD_LIMIT), checked=overhead,
            note=f"overhead {overhead:.0f} bytes over the payload; baseline: one Celery result of the same payload"),
    ]
    result.details = {"bytes_per_step_by_key": breakdown, "payload_bytes": payload_bytes}
    return result
