"""Server-sent events: what makes the pages live without a reload.

Both streams begin with ``ready`` once the server is subscribed to run
updates: from then on a page misses nothing. ``/api/events`` then tells a
runs page that some run of the namespace changed, and the page fetches its
rows again. ``/api/runs/{id}/events`` streams one run's progress records as
they are written (``progress``, with the record as data and its seq as the
event id, so a reconnecting ``EventSource`` resumes after the last record it
got), says when the run itself changed (``run``: status, phase, steps,
agents, waits), and ends with ``end`` once the run has settled and every
record is out.

Both are woken by the ``RunHub``; as Redis pub/sub can drop an update, a
run stream also reads again after ``QUIET_SECONDS`` of silence, as
``follow_workflow_run_progress`` does.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from celery_durable import Client, ProgressEntry, RunEnvelope, StorageUnavailableError
from celery_durable.web.context import web
from celery_durable.web.problems import whole_number

QUIET_SECONDS = 5.0
KEEPALIVE_SECONDS = 15.0
MIN_GAP_SECONDS = 0.25
"""Least time between two ``runs`` events: a burst of changes costs the page one fetch."""
RETRY_MS = 2000
BATCH = 200


def event(name: str, data: Any, event_id: int | None = None) -> str:
    """One SSE message; compact JSON never holds a raw newline, so one ``data:`` line suffices."""
    head = f"id: {event_id}\n" if event_id is not None else ""
    return f"{head}event: {name}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n"


def stream(body: AsyncIterator[str]) -> StreamingResponse:
    return StreamingResponse(
        body,
        media_type="text/event-stream",
        # No caching, and no buffering by a reverse proxy that honours the hint.
        headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
    )


async def runs_events(request: Request) -> Response:
    context = web(request)

    async def body() -> AsyncIterator[str]:
        yield f"retry: {RETRY_MS}\n\n"
        async with context.hub.listen(None) as listener:
            yield event("ready", {"namespace": context.namespace})
            while True:
                if not await listener.wait(KEEPALIVE_SECONDS):
                    yield ": keepalive\n\n"
                    continue
                yield event("runs", {})
                await asyncio.sleep(MIN_GAP_SECONDS)

    return stream(body())


@dataclass(frozen=True, slots=True)
class Reading:
    records: list[ProgressEntry]
    more: bool
    run: RunEnvelope


def _read(client: Client, run_id: str, after_seq: int) -> Reading:
    # The run is read before its records, as ``follow`` does: a run's last records and its
    # final status are written by one script, so the records read after a settled run are
    # all there will be; read before it, they may miss the last ones, and ``end`` would follow.
    run = client.get_workflow_run(run_id)
    page = client.get_workflow_run_progress(run_id, after_seq=after_seq, limit=BATCH)
    return Reading(page.records, page.has_more_newer, run)


def _after_seq(request: Request) -> int:
    """Where to start: the browser's ``Last-Event-ID`` on a reconnection, else ``?after_seq``."""
    text = request.headers.get("last-event-id") or request.query_params.get("after_seq") or "0"
    return whole_number("after_seq", text)


async def run_events(request: Request) -> Response:
    context = web(request)
    run_id = request.path_params["run_id"]
    after_seq = _after_seq(request)
    # Unknown runs, and runs of other namespaces, are a 404 before any stream starts.
    await context.call(context.client.get_workflow_run, run_id)

    async def body() -> AsyncIterator[str]:
        yield f"retry: {RETRY_MS}\n\n"
        last_seq, last_state = after_seq, None
        async with context.hub.listen(run_id) as listener:
            yield event("ready", {"run_id": run_id})
            while True:
                try:
                    reading = await context.call(_read, context.client, run_id, last_seq)
                except StorageUnavailableError as exc:
                    yield event("problem", {"message": str(exc)})
                    await listener.wait(QUIET_SECONDS)
                    continue
                for record in reading.records:
                    yield event("progress", record.to_dict(), event_id=record.seq)
                    last_seq = record.seq
                if reading.more:
                    continue
                state = reading.run.to_dict()
                if state != last_state:
                    last_state = state
                    yield event("run", {"status": reading.run.status, "attempt": reading.run.attempt})
                if reading.run.is_terminal:
                    yield event("end", {"status": reading.run.status})
                    return
                await listener.wait(QUIET_SECONDS)

    return stream(body())


routes = [
    Route("/api/events", runs_events, methods=["GET"]),
    Route("/api/runs/{run_id}/events", run_events, methods=["GET"]),
]
