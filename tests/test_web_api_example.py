"""``examples/web_api.py``: a FastAPI service over the expense approval, on
the ``AsyncClient``, driven through httpx's ASGI transport against a real
Celery worker (the plugin's ``durable_worker``) on a private Redis.

httpx's ASGI transport hands a response back once the app has sent all of
it, so the event stream is read whole after the claim settles; what the test
shows is its content and order: the records, the moment the run waits for a
decision, the decision, the end.
"""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from celery_durable import Client, Workflow
from celery_durable.testing import until_waiting_for_signal
from examples.approval import expense_approval
from examples.web_api import create_app

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # redis.asyncio runs on asyncio only


@pytest.fixture
def durable_workflows() -> list[Workflow]:
    return [expense_approval]


@pytest.fixture
async def http(durable_worker: Any, durable_client: Client) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(durable_client.engine)
    async with app.router.lifespan_context(app):  # its AsyncClient is closed as the app shuts down
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://expenses") as client:
            yield client


def parse(stream: str) -> list[tuple[str, dict[str, Any]]]:
    events = []
    for chunk in stream.strip().split("\n\n"):
        kind, data = chunk.split("\n")
        events.append((kind.removeprefix("event: "), json.loads(data.removeprefix("data: "))))
    return events


async def test_a_claim_is_started_streamed_and_approved(http: httpx.AsyncClient, durable_client: Client) -> None:
    started = await http.post("/expenses", json={"employee": "ada", "amount": 120})
    assert started.status_code == 201
    run_id = started.json()["run_id"]
    streaming = asyncio.create_task(http.get(f"/expenses/{run_id}/events"))
    await asyncio.to_thread(until_waiting_for_signal, durable_client, run_id, "approval")
    waiting = (await http.get(f"/expenses/{run_id}")).json()
    assert (waiting["status"], waiting["waiting_for"]["name"]) == ("running", "approval")

    approved = await http.post(f"/expenses/{run_id}/approve", json={"approved": True, "note": "team dinner"})
    assert approved.status_code == 200
    response = await asyncio.wait_for(streaming, timeout=60)
    assert response.headers["content-type"].startswith("text/event-stream")
    events = parse(response.text)

    phases = [data["message"] for kind, data in events if kind == "progress" and data["kind"] == "phase"]
    assert phases == ["Submit", "Approve", "Pay"]
    runs = [data for kind, data in events if kind == "run"]
    assert all(before != after for before, after in itertools.pairwise(runs)), "a run event repeats"
    asked = next(i for i, (kind, data) in enumerate(events) if kind == "run" and data["waiting_for"])
    assert events[asked][1]["waiting_for"]["name"] == "approval"
    received = next(i for i, (_, data) in enumerate(events) if data.get("message") == "Signal approval received")
    assert asked < received, "the page learns that the claim waits before the decision arrives"
    final = runs[-1]
    assert events[-1] == ("run", final)
    assert final["status"] == "completed" and final["result"]["status"] == "paid"
    assert final["result"]["note"] == "team dinner" and final["result"]["paid"] == 120


async def test_unknown_claims_bad_claims_and_late_decisions_are_refused(http: httpx.AsyncClient) -> None:
    assert (await http.get("/expenses/" + "0" * 32)).status_code == 404
    assert (await http.get("/expenses/" + "0" * 32 + "/events")).status_code == 404
    assert (await http.post("/expenses", json={"employee": "ada", "amount": -5})).status_code == 422
    run_id = (await http.post("/expenses", json={"employee": "bo", "amount": 9})).json()["run_id"]
    assert (await http.post(f"/expenses/{run_id}/approve", json={"approved": False, "note": "no"})).status_code == 200
    stream = parse((await http.get(f"/expenses/{run_id}/events")).text)
    assert stream[-1][1]["result"] == {"claim": stream[-1][1]["result"]["claim"], "status": "rejected", "note": "no"}
    late = await http.post(f"/expenses/{run_id}/approve", json={"approved": True})
    assert late.status_code == 409 and "completed" in late.json()["detail"]
