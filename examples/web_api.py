"""An asyncio web service over a workflow: FastAPI and the ``AsyncClient``.

The expense approval (``examples/approval.py``) behind four routes: start a
claim, read it, follow it as server-sent events (each progress record as it
is written, and the run's state each time it changes: so a page learns the
moment the claim waits for a decision), and approve or reject it (the signal
``approval``). Every call awaits the ``AsyncClient``: a stream open for as
long as a person takes to decide holds no thread, only a watch on the
client's one shared subscription::

    celery-durable worker --app examples.approval:engine
    uvicorn examples.web_api:app
    curl -X POST localhost:8000/expenses -H 'content-type: application/json' -d '{"employee": "ada", "amount": 120}'
    curl -N localhost:8000/expenses/RUN/events
    curl -X POST localhost:8000/expenses/RUN/approve -H 'content-type: application/json' -d '{"approved": true}'

(``pip install fastapi uvicorn``; ``tests/test_web_api_example.py`` runs it
against a real worker with httpx's ASGI transport.)
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, HTTPException
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, Field

from celery_durable import AsyncClient, Engine, RunEnvelope, RunNotFoundError
from examples import approval


class Claim(BaseModel):
    employee: str = Field(min_length=1, max_length=80)
    amount: float = Field(gt=0)
    remind_after_seconds: float = Field(default=3600, gt=0)


class Decision(BaseModel):
    approved: bool
    note: str | None = None


def state(envelope: RunEnvelope) -> dict[str, Any]:
    """What a page shows of a claim's run."""
    return {
        "run_id": envelope.run_id,
        "status": envelope.status,
        "waiting_for": envelope.snapshot.get("waiting_for"),
        "result": envelope.result,
    }


def event(kind: str, data: dict[str, Any]) -> str:
    """One server-sent event."""
    return f"event: {kind}\ndata: {json.dumps(data, default=str)}\n\n"


async def follow(client: AsyncClient, run_id: str) -> AsyncIterator[str]:
    """Progress records and the run's changes, in the order they happened,
    until it settles. The run's changes come from ``on_run`` while the
    follower waits for the next record (a claim that waits for a decision
    writes none), so both go through one queue that the stream drains."""
    queue: asyncio.Queue[str | None] = asyncio.Queue()
    shown: list[dict[str, Any]] = [{}]

    def changed(envelope: RunEnvelope) -> None:
        if state(envelope) != shown[-1]:  # a change the page has not seen (not a record alone)
            shown.append(state(envelope))
            queue.put_nowait(event("run", shown[-1]))

    records = await client.follow_workflow_run_progress(run_id, on_run=changed)

    async def read() -> None:
        try:
            async for record in records:
                line = {"seq": record.seq, "kind": record.kind, "message": record.message}
                queue.put_nowait(event("progress", line))
        finally:
            queue.put_nowait(None)

    reader = asyncio.create_task(read())
    try:
        while (item := await queue.get()) is not None:
            yield item
        await reader  # its error, if it had one
        changed(await client.get_workflow_run(run_id))  # settled: the last word, unless already said
        while not queue.empty():
            yield str(queue.get_nowait())
    finally:  # the page went away, or the run settled
        reader.cancel()
        await asyncio.gather(reader, return_exceptions=True)  # unwound before its iterator is closed
        await records.aclose()


def create_app(engine: Engine) -> FastAPI:
    """The service on ``engine``'s Redis: its own ``AsyncClient``, closed at shutdown."""
    client = engine.async_client()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        await client.aclose()

    app = FastAPI(title="Expense approvals", lifespan=lifespan)

    async def envelope_of(run_id: str) -> RunEnvelope:
        try:
            return await client.get_workflow_run(run_id)
        except RunNotFoundError:
            raise HTTPException(404, f"No claim {run_id}") from None

    @app.post("/expenses", status_code=201)
    async def submit(claim: Claim) -> dict[str, str]:
        run_id = await client.start_workflow(approval.expense_approval, args=claim.model_dump())
        return {"run_id": run_id}

    @app.get("/expenses/{run_id}")
    async def show(run_id: str) -> dict[str, Any]:
        return state(await envelope_of(run_id))

    @app.get("/expenses/{run_id}/events")
    async def events(run_id: str) -> StreamingResponse:
        await envelope_of(run_id)  # a 404 before the stream starts
        return StreamingResponse(follow(client, run_id), media_type="text/event-stream")

    @app.post("/expenses/{run_id}/approve")
    async def decide(run_id: str, decision: Decision) -> dict[str, Any]:
        await envelope_of(run_id)
        try:
            await client.signal_workflow_run(run_id, "approval", decision.model_dump())
        except ValueError as exc:  # settled already: the run refuses the signal, saying why
            raise HTTPException(409, str(exc)) from None
        return {"run_id": run_id, "sent": decision.model_dump()}

    return app


app = create_app(approval.engine)
