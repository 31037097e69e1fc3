"""Case 16: listing over a million stored runs (issue 28): filtered pages read
the namespace's indexes instead of every record.

The runs are built through the engine's real scripts, pipelined, without a
fleet or a workflow execution: per run ``create_run.lua`` (the record a
start writes, with the status and waiting summary the run is given),
``index_run.lua`` (the namespace's runs zset) and ``index_sync.lua`` (its
indexes, read from the record), a few thousand runs per round trip, under
a key prefix of its own. Of ``plan.listing_runs`` runs: 10 in ``error``,
1 % ``cancelled`` (half of them of the workflow ``bench.rare``), 0.1 %
``running`` and waiting for the signal ``approval``, none ``halted``, the
rest ``completed``.

Then ``Client.list_workflow_runs`` (what the web view, the console and the
CLI call), ``plan.listing_requests`` times each after a warm-up, one page
of 50: unfiltered; by a status with 0, 10 and 10,000 matches; waiting for
``approval``; a status and a workflow together; a run-id prefix of 4 and
of 2 hex digits; a creation-time range. Each sample is the client call's
wall time, records read and envelopes built included.

Baseline: the page filtered by a status no run has took 2,032 ms over
10,000 runs before the indexes (case 8 in RESULTS.md then): the client read
every record.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from benchmarks.cases.common import fmt_int
from benchmarks.harness import Bench
from benchmarks.model import CaseResult, Row, Target, median
from benchmarks.plan import Plan
from celery_durable import Engine
from celery_durable.broker import RunStore, schema

CASE = "16. Listing"
PREFIX = "benchlist"
NAMESPACE = "bench-list"
LIMIT_MS = 50.0
PREFIX_LIMIT_MS = 100.0
BEFORE_MS = 2_032.0
WARM_UP = 3
BATCH = 2_000
WAITING = json.dumps({"kind": "signal", "name": "approval"})


def _shape(i: int, n: int) -> tuple[str, str, str]:
    """(status, workflow, waiting summary) of the i-th run of n."""
    if i < 10:
        return "error", "bench.one-step", ""
    if i % 100 == 50:
        return "cancelled", "bench.rare" if i % 200 == 50 else "bench.one-step", ""
    if i % 1000 == 7:
        return "running", "bench.one-step", WAITING
    return "completed", "bench.one-step", ""


def _seed(store: RunStore, n: int) -> float:
    """``n`` runs through the real scripts; returns the creation ms of run n // 2."""
    scripts = {name: store._scripts[name].sha for name in ("create_run", "index_run", "index_sync")}
    ns = store.keys.namespace(NAMESPACE)
    now = store.now_ms()
    middle = now
    for start in range(0, n, BATCH):
        pipe = store.client.pipeline(transaction=False)
        for i in range(start, min(start + BATCH, n)):
            run_id = uuid.uuid4().hex
            created = now + i  # one a ms: a time range is a range of runs
            if i == n // 2:
                middle = created
            status, workflow, waiting = _shape(i, n)
            fields = schema.new_run_fields(
                run_id=run_id, workflow=workflow, namespace=NAMESPACE, args_json="{}", limits_json="{}",
                code_hash="bench", created_ms=created, lease_ms=30_000, idempotency_key=None,
                progress_max=0, ceilings={},
            )
            fields.update(status=status, waiting=waiting)
            flat = [item for pair in fields.items() for item in pair]
            k = store.run_keys(run_id)
            pipe.evalsha(scripts["create_run"], 2, k.run, k.live, "", created, 0, *flat)
            pipe.evalsha(scripts["index_run"], 3, ns.runs, ns.counter, ns.index_meta, run_id, ns.events)
            sync_keys = [ns.index, ns.index_state, ns.runs, ns.index_intents, k.run]
            pipe.evalsha(scripts["index_sync"], len(sync_keys), *sync_keys, "", now, 60_000, run_id)
        for reply in pipe.execute(raise_on_error=False):
            if isinstance(reply, Exception):
                raise reply
    return middle


def _load_scripts(store: RunStore) -> None:
    for name in ("create_run", "index_run", "index_sync"):
        store.client.script_load(store._scripts[name].script)


def _time(call: Callable[[], Any], requests: int) -> tuple[list[float], Any]:
    for _ in range(WARM_UP):
        page = call()
    samples = []
    for _ in range(requests):
        started = time.perf_counter()
        page = call()
        samples.append((time.perf_counter() - started) * 1000)
    return samples, page


def _forget(store: RunStore) -> float:
    """Delete every key of the case; seconds it took."""
    started = time.perf_counter()
    cursor = 0
    while True:
        cursor, keys = store.client.scan(cursor, match=f"{PREFIX}:*", count=10_000)
        if keys:
            store.client.unlink(*keys)
        if cursor == 0:
            break
    return time.perf_counter() - started


def run(bench: Bench, plan: Plan) -> CaseResult:
    n, requests = plan.listing_runs, plan.listing_requests
    result = CaseResult(
        key="listing",
        title="Listing over many stored runs: filtered pages from the namespace indexes",
        setup=f"{fmt_int(n)} runs in one namespace built through the real scripts (pipelined); one page of 50 "
        f"from Client.list_workflow_runs, {requests} times each after {WARM_UP} warm-up calls.",
    )
    settings = bench.settings.model_copy(update={"key_prefix": PREFIX, "coordinator_queue": f"{PREFIX}.unserved"})
    engine = Engine(list(bench.engine.workflows.values()), settings)
    store = engine.store
    _forget(store)
    _load_scripts(store)
    used_before = int(store.client.info("memory")["used_memory"])
    seeded = time.perf_counter()
    middle = _seed(store, n)
    seed_seconds = time.perf_counter() - seeded
    ns = store.keys.namespace(NAMESPACE)
    used_after = int(store.client.info("memory")["used_memory"])
    index_bytes = sum(int(store.client.memory_usage(key, samples=0) or 0) for key in (ns.index, ns.index_state))
    runs_bytes = int(store.client.memory_usage(ns.runs, samples=0) or 0)
    client = engine.client(NAMESPACE)
    counts = {s: sum(1 for i in range(n) if _shape(i, n)[0] == s) for s in ("error", "cancelled", "halted")}
    waiting = sum(1 for i in range(n) if _shape(i, n)[2])
    since = datetime.fromtimestamp(middle / 1000, UTC)
    probes: list[tuple[str, Callable[[], Any], float]] = [
        ("unfiltered", lambda: client.list_workflow_runs(), LIMIT_MS),
        (f"status with 0 matches (halted: {counts['halted']})", lambda: client.list_workflow_runs("halted"), LIMIT_MS),
        (f"status with {fmt_int(counts['error'])} matches (error)", lambda: client.list_workflow_runs("error"),
         LIMIT_MS),
        (f"status with {fmt_int(counts['cancelled'])} matches (cancelled)",
         lambda: client.list_workflow_runs("cancelled"), LIMIT_MS),
        (f"waiting for 'approval' ({fmt_int(waiting)} runs)", lambda: client.list_workflow_runs(waiting="approval"),
         LIMIT_MS),
        ("status and workflow together (cancelled, bench.rare)",
         lambda: client.list_workflow_runs("cancelled", "bench.rare"), LIMIT_MS),
        ("created after the middle run (a time range)", lambda: client.list_workflow_runs(created_after=since),
         LIMIT_MS),
        ("run id prefix of 4 hex digits", lambda: client.list_workflow_runs(run_id_prefix="a1b2"), PREFIX_LIMIT_MS),
        ("run id prefix of 2 hex digits", lambda: client.list_workflow_runs(run_id_prefix="a1"), PREFIX_LIMIT_MS),
    ]
    timings: dict[str, dict[str, Any]] = {}
    for label, call, limit in probes:
        samples, page = _time(call, requests)
        figure = f"page of {label} over {fmt_int(n)} runs, median"
        zero = label.startswith("status with 0 ")
        before = f"before the indexes: {BEFORE_MS:,.0f} ms over 10,000 runs" if zero else ""
        result.rows.append(Row(CASE, figure, "ms", samples, target=Target(f"< {limit:.0f} ms", limit), note=before))
        timings[label] = {"median_ms": median(samples), "max_ms": max(samples), "runs_on_page": len(page.runs)}
    forget_seconds = _forget(store)
    result.details = {
        "runs": n,
        "requests": requests,
        "seed_seconds": seed_seconds,
        "seed_runs_per_second": n / seed_seconds if seed_seconds else None,
        "redis_bytes_per_run": (used_after - used_before) / n if n else None,
        "index_bytes_per_run": index_bytes / n if n else None,
        "runs_zset_bytes_per_run": runs_bytes / n if n else None,
        "pages": timings,
        "cleanup_seconds": forget_seconds,
    }
    result.notes.append(
        f"Built {fmt_int(n)} runs in {seed_seconds:.0f} s ({n / max(seed_seconds, 1e-9):,.0f} runs/s); the indexes "
        f"take {index_bytes / max(n, 1):,.0f} bytes per run (the runs zset {runs_bytes / max(n, 1):,.0f} more), "
        f"the store {(used_after - used_before) / max(n, 1):,.0f} bytes per run in all."
    )
    return result
