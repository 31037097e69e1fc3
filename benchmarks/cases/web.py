"""Case 8: the web view's runs page over 10,000 runs (issue 15: < 100 ms server time).

Seeds ``plan.web_runs`` runs with ``client.start_workflow`` on an engine of
its own: its key prefix is one the fleet does not sweep and its coordinator
queue one no worker serves, so the runs stay what an operator's page
lists, pending records, and cost the workers nothing. (The list does not
read a run's journal, so a pending record costs it what a finished one
does.)

Then the ASGI app from ``create_app`` is called in-process, without a
socket or an HTTP client, ``plan.web_requests`` times for ``GET
/ns/<ns>/`` (the first page: 50 rows) after a warm-up; each sample is the
time from calling the app to the last byte of its response. That is the
server's time; what a browser adds (network, parsing) is not the engine's.
The rows fragment the page fetches on every change is timed the same way,
and so is a page filtered by a status no run has, which is not the first
page's cost but the client's: ``list_workflow_runs`` filters as it reads
the namespace's index, so finding nothing reads all of it.

Baseline: none. Plain Celery has no run list.
"""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from benchmarks.cases.common import fmt_int
from benchmarks.harness import Bench
from benchmarks.model import CaseResult, Row, Target, median, percentile
from benchmarks.plan import Plan
from celery_durable import Engine

CASE = "8. Web view"
NAMESPACE = "bench-web"
LIMIT_MS = 100.0
WARM_UP = 5
SEED_THREADS = 8


def _seed(engine: Engine, count: int) -> None:
    client = engine.client(NAMESPACE)
    with ThreadPoolExecutor(SEED_THREADS) as pool:
        list(pool.map(lambda i: client.start_workflow("bench.one-step", args={"i": i}), range(count)))


async def _get(app: Any, url: str) -> tuple[float, int, int]:
    """(seconds, status, body bytes) of one GET, timed around the ASGI call."""
    path, _, query = url.partition("?")
    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "GET", "scheme": "http",
        "path": path, "raw_path": path.encode(), "query_string": query.encode(), "root_path": "",
        "headers": [(b"host", b"127.0.0.1")], "client": ("127.0.0.1", 50000), "server": ("127.0.0.1", 8080),
    }
    status, size = 0, 0

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        nonlocal status, size
        if message["type"] == "http.response.start":
            status = message["status"]
        elif message["type"] == "http.response.body":
            size += len(message.get("body", b""))

    started = time.perf_counter()
    await app(scope, receive, send)
    return time.perf_counter() - started, status, size


async def _measure(app: Any, path: str, requests: int) -> tuple[list[float], int]:
    for _ in range(WARM_UP):
        await _get(app, path)
    samples: list[float] = []
    size = 0
    for _ in range(requests):
        seconds, status, size = await _get(app, path)
        if status != 200:
            raise RuntimeError(f"GET {path} answered {status}")
        samples.append(seconds * 1000)
    return samples, size


def run(bench: Bench, plan: Plan) -> CaseResult:
    from celery_durable.web import create_app

    n, requests = plan.web_runs, plan.web_requests
    result = CaseResult(
        key="web",
        title="Web view: the runs page over many runs",
        setup=f"{fmt_int(n)} runs in one namespace; GET of the first page (50 rows) and of its rows fragment, "
        f"{requests} times each after {WARM_UP} warm-up requests, timed around the in-process ASGI call.",
    )
    settings = bench.settings.model_copy(
        update={"key_prefix": "benchweb", "coordinator_queue": "benchweb.unserved"}
    )
    engine = Engine(list(bench.engine.workflows.values()), settings)
    seeded = time.perf_counter()
    _seed(engine, n)
    seed_seconds = time.perf_counter() - seeded
    app = create_app(engine, namespace=NAMESPACE)
    page, page_bytes = asyncio.run(_measure(app, f"/ns/{NAMESPACE}/", requests))
    rows, rows_bytes = asyncio.run(_measure(app, f"/ns/{NAMESPACE}/rows", requests))
    # Every seeded run is pending: a filter no run matches makes the client read the whole index.
    empty, _ = asyncio.run(_measure(app, f"/ns/{NAMESPACE}/?status=completed", max(3, requests // 10)))
    bench.raw.delete(settings.coordinator_queue)  # the start messages nobody consumes
    target = Target(f"< {LIMIT_MS:.0f} ms", LIMIT_MS)
    result.rows = [
        Row(CASE, f"runs page over {fmt_int(n)} runs, median server time", "ms", page, target=target),
        Row(CASE, f"runs page over {fmt_int(n)} runs, p99 server time", "ms", [percentile(page, 99)],
            target=target, note=f"nearest-rank p99 of {requests} requests"),
        Row(CASE, "rows fragment (what a live page fetches), median", "ms", rows, target=target),
        Row(CASE, f"runs page filtered by a status none of {fmt_int(n)} runs has, median", "ms", empty,
            note="not a target: list_workflow_runs reads the whole index to find no match"),
    ]
    result.details = {
        "runs": n,
        "requests": requests,
        "page_ms": {"median": median(page), "p99": percentile(page, 99), "max": max(page)},
        "fragment_ms": {"median": median(rows), "p99": percentile(rows, 99), "max": max(rows)},
        "filtered_no_match_ms": {"median": median(empty), "max": max(empty)},
        "page_bytes": page_bytes,
        "fragment_bytes": rows_bytes,
        "seed_seconds": seed_seconds,
    }
    return result
