"""A broker restart loses no acknowledged run (issue 14).

The broker here is a private server of its own, apart from the journal (the
session's Redis), so it can be killed and started again mid-run: a Redis with
its append-only file (fsync on every write), or a RabbitMQ whose queues are
durable and whose messages are persistent (Celery's defaults). Runs are
started first -- each ``start_workflow`` returned, so each run is
acknowledged -- and the broker dies while some are done, some running and
some still queued in it.

Every run then completes. Messages that were in the broker come back with it;
one that was being published, or held by a worker that lost its connection,
is found missing by liveness (its queue holds nothing, and it never started)
and the run is taken over. The worker, which was running tasks when its broker
died, reconnects: no supervisor has to start it again.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol

import pytest

from celery_durable import Engine, Settings, is_terminal_status
from celery_durable.local.redis_server import RedisServer
from tests.support.apps.basic import fan
from tests.support.fleet import Fleet
from tests.support.poll import RUN_BOUND, START_BOUND, poll
from tests.support.topologies import RabbitMQServer, find_rabbitmq_server, unavailable

APP = "tests.support.apps.basic:engine"
RUNS = 8
DOWN_SECONDS = 1.0


class Broker(Protocol):
    @property
    def url(self) -> str: ...

    def kill(self) -> None: ...

    def start(self) -> Any: ...

    def stop(self) -> None: ...


@pytest.fixture(params=["redis", pytest.param("rabbitmq", marks=pytest.mark.slow)])
def private_broker(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Broker]:
    broker: Broker
    if request.param == "redis":
        broker = RedisServer(tmp_path / "broker", appendfsync="always")
    else:
        binary = find_rabbitmq_server()
        if binary is None:
            unavailable("no rabbitmq-server is installed: a private RabbitMQ cannot be started and restarted")
        broker = RabbitMQServer(tmp_path / "rabbitmq", binary)
    broker.start()
    try:
        yield broker
    finally:
        broker.stop()


def test_a_broker_restart_mid_run_loses_no_acknowledged_run(
    settings: Settings, fleet: Fleet, private_broker: Broker
) -> None:
    settings = settings.model_copy(update={"broker_url": private_broker.url})
    fleet.settings = settings
    client = Engine([fan], settings).client()
    worker = fleet.start(APP, concurrency=4)
    run_ids = [client.start_workflow("fan", args={"count": 4, "seconds": 0.3}) for _ in range(RUNS)]

    poll(
        lambda: client.get_workflow_run(run_ids[0]).status == "completed",
        within=START_BOUND,
        what="the first run to complete",
    )
    before = [client.get_workflow_run(run_id).status for run_id in run_ids]
    private_broker.kill()
    time.sleep(DOWN_SECONDS)
    private_broker.start()

    poll(
        lambda: all(is_terminal_status(client.get_workflow_run(run_id).status) for run_id in run_ids),
        within=START_BOUND + RUN_BOUND,
        what="every run to settle once the broker is back",
    )
    assert worker.alive(), "the worker exited instead of reconnecting to its broker"

    envelopes = [client.get_workflow_run(run_id) for run_id in run_ids]
    assert [e.status for e in envelopes] == ["completed"] * RUNS, [e.error for e in envelopes]
    assert all(len(e.result) == 4 for e in envelopes)
    print(
        f"\nbroker restart: runs when it died {sorted(before)}; attempts {[e.attempt for e in envelopes]}"
    )
