"""The trip (tests/support/apps/trip.py) held at its car while flight and hotel
are journaled, then every worker killed: the crash the recovery tests start from."""

from __future__ import annotations

import redis

from celery_durable import Client, Engine, Settings
from tests.support.apps.trip import provider_key, trip
from tests.support.fleet import Fleet
from tests.support.poll import RUN_BOUND, poll

TRIP = "tests.support.apps.trip:engine"


def client_for(settings: Settings) -> Client:
    return Engine([trip], settings).client()


def step_status(client: Client, run_id: str) -> dict[str, str]:
    return {row.key: row.status for row in client.get_workflow_run_detail(run_id).steps}


def receipts(raw: redis.Redis, prefix: str, service: str) -> tuple[int, int]:
    """(raw provider calls, reservations) for one service."""
    calls = sum(int(v) for v in raw.hvals(provider_key(prefix, service, "calls")))
    return calls, int(raw.hlen(provider_key(prefix, service, "reservations")))


def hold_car_and_kill_everything(settings: Settings, fleet: Fleet, raw: redis.Redis, client: Client) -> str:
    worker = fleet.start(TRIP, concurrency=4)
    run_id = client.start_workflow("trip", args={"hold": ["car"]})
    prefix = settings.key_prefix
    poll(
        lambda: raw.sismember(f"{prefix}:gate:{run_id}:reached", "car")
        and {"book-flight", "book-hotel"} <= {k for k, v in step_status(client, run_id).items() if v == "completed"},
        within=RUN_BOUND,
        what="flight and hotel journaled, car at its gate",
    )
    worker.kill()
    raw.sadd(f"{prefix}:gate:{run_id}:open", "car")
    return run_id
