"""The fleet page against real worker processes: who is alive and what each
holds, the queues' depths, and the runs taken over in the last hour after a
worker is killed (SIGKILL, by process group)."""

from __future__ import annotations

from typing import Any

from starlette.testclient import TestClient

from celery_durable import Engine, Settings
from celery_durable.web import create_app
from tests.support.apps.trip import trip
from tests.support.fleet import Fleet
from tests.support.poll import RUN_BOUND, poll
from tests.web.conftest import SiteFactory

TRIP = "tests.support.apps.trip:engine"


def fleet_json(http: TestClient) -> dict[str, Any]:
    answer = http.get("/api/fleet")
    assert answer.status_code == 200, answer.text
    data: dict[str, Any] = answer.json()
    return data


def workers_named(data: dict[str, Any], name: str) -> list[dict[str, Any]]:
    return [worker for worker in data["workers"] if worker["name"].startswith(name)]


def test_queue_depths_count_messages_no_worker_has_taken(site: SiteFactory) -> None:
    web = site(worker=False)
    for _ in range(3):
        web.client.start_workflow("web.quick")
    data = fleet_json(web.http)
    depths = {queue["role"]: queue["depth"] for queue in data["queues"]}
    assert depths == {"coordinator": 3, "steps": 0, "agents": 0}
    assert data["broker_error"] is None and data["take_overs_total"] == 0
    page = web.http.get(f"/ns/{web.ns}/fleet")
    assert page.status_code == 200
    coordinator = web.engine.settings.coordinator_queue
    assert f'<tr data-queue="{coordinator}">' in page.text and 'data-depth="3"' in page.text
    live = web.http.get(f"/ns/{web.ns}/fleet/live")
    assert live.text.lstrip().startswith('<div id="fleet-live"')


def test_workers_what_they_hold_and_a_take_over(settings: Settings, fleet: Fleet, raw_redis: Any) -> None:
    engine = Engine([trip], settings)
    client = engine.client()
    first = fleet.start(TRIP, concurrency=4, name="fleetpage1")
    with TestClient(create_app(engine), base_url="http://127.0.0.1") as http:
        run_id = client.start_workflow("trip", args={"hold": ["car"]})
        prefix = settings.key_prefix
        poll(
            lambda: raw_redis.sismember(f"{prefix}:gate:{run_id}:reached", "car"),
            within=RUN_BOUND,
            what="the car at its gate",
        )

        def holding() -> Any:
            data = fleet_json(http)
            mine = workers_named(data, "fleetpage1")
            return data if mine and run_id in mine[0]["runs"] else None

        data = poll(holding, within=RUN_BOUND, what="the worker's beat naming the held run")
        (worker,) = workers_named(data, "fleetpage1")
        assert worker["alive"] and worker["held"] >= 1 and worker["elsewhere"] == 0
        page = http.get("/ns/default/fleet").text
        assert 'data-alive="yes"' in page and f'href="/ns/default/runs/{run_id}"' in page

        first.kill()
        raw_redis.sadd(f"{prefix}:gate:{run_id}:open", "car")
        fleet.start(TRIP, concurrency=4, name="fleetpage2")
        assert client.wait_for_workflow_run(run_id, timeout=60).status == "completed"

        data = fleet_json(http)
        assert data["take_overs_total"] == 1
        (note,) = data["take_overs"]
        assert (note["run_id"], note["outcome"], note["epoch"]) == (run_id, "recovered", 2)
        assert note["cause"]
        assert [worker["alive"] for worker in workers_named(data, "fleetpage2")] == [True]
        # The killed worker is silent, or already buried by the sweep that took
        # its run over. Its run can be taken over by its task's lease, renewed
        # a little before the worker's last beat: then the worker still reads
        # alive, until its silence too is a lease long.
        poll(
            lambda: all(not worker["alive"] for worker in workers_named(fleet_json(http), "fleetpage1")),
            within=settings.lease_seconds + RUN_BOUND,
            what="the killed worker to read as not alive",
        )
        page = http.get("/ns/default/fleet").text
        assert 'id="take-over-count">1<' in page and "recovered" in page
