"""Case 4: end-to-end latency of a one-step workflow.

From ``start_workflow`` to the client seeing ``completed`` through the
public ``wait_for_workflow_run`` (woken by the namespace's pub/sub channel,
default poll interval). Baseline: one plain no-op task, ``apply_async`` to
``get()``. The two alternate sample by sample.
"""

from __future__ import annotations

import time

from benchmarks.cases.common import CELERY, DURABLE, sides
from benchmarks.harness import Bench
from benchmarks.model import CaseResult, Row, Target, median, percentile
from benchmarks.plan import Plan

CASE = "4. Latency"
TARGET_MS = 20.0


PHASES = ("start_workflow", "queued -> coordinator running", "replay + step + finish", "finished -> client sees it")


def _durable_ms(bench: Bench, timeout: float, phases: dict[str, list[float]] | None = None) -> float:
    """One sample; ``phases`` gets where it went, from the run record's ms timestamps."""
    wall = time.time()
    started = time.perf_counter()
    run_id = bench.client.start_workflow("bench.one-step")
    returned = time.time()
    envelope = bench.client.wait_for_workflow_run(run_id, timeout=timeout)
    elapsed = time.perf_counter() - started
    seen = time.time()
    if envelope.status != "completed":
        raise RuntimeError(f"one-step run {run_id} ended {envelope.status}: {envelope.error}")
    if phases is not None and envelope.started_at and envelope.finished_at:
        began, ended = envelope.started_at.timestamp(), envelope.finished_at.timestamp()
        for name, seconds in zip(PHASES, (returned - wall, began - returned, ended - began, seen - ended), strict=True):
            phases.setdefault(name, []).append(1000 * seconds)
    return 1000 * elapsed


def _celery_ms(bench: Bench, timeout: float) -> float:
    started = time.perf_counter()
    bench.noop.apply_async().get(timeout=timeout)
    return 1000 * (time.perf_counter() - started)


def run(bench: Bench, plan: Plan) -> CaseResult:
    count = plan.latency_samples * plan.repeat
    result = CaseResult(
        key="latency",
        title="Latency: a one-step workflow, start_workflow to the client seeing completed",
        setup=f"{count} samples per side ({plan.latency_samples} per repeat), alternating. Baseline: "
        "one plain no-op task, apply_async() to get().",
    )
    for _ in range(3):
        _durable_ms(bench, plan.timeout)
        _celery_ms(bench, plan.timeout)
    samples: dict[str, list[float]] = {DURABLE: [], CELERY: []}
    phases: dict[str, list[float]] = {}
    for i in range(count):
        for side in sides(i):
            if side == DURABLE:
                samples[side].append(_durable_ms(bench, plan.timeout, phases))
            else:
                samples[side].append(_celery_ms(bench, plan.timeout))
    durable, celery = samples[DURABLE], samples[CELERY]
    result.rows = [
        Row(CASE, "one-step workflow, median", "ms", durable, celery,
            Target(f"< {TARGET_MS:.0f} ms on loopback", TARGET_MS)),
        Row(CASE, "one-step workflow, p99", "ms", [percentile(durable, 99)], [percentile(celery, 99)],
            note="Temporal's end-to-end floor is about 100 ms"),
    ]
    result.details = {
        "samples_ms": samples,
        "durable_median_ms_by_phase": {name: median(values) for name, values in phases.items()},
    }
    result.notes.append(
        "Where the durable median goes (ms timestamps of the run record, so +-1 ms each): "
        + ", ".join(f"{name} {median(values):.1f} ms" for name, values in phases.items())
    )
    return result
