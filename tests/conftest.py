"""Shared fixtures: a real redis-server per session, real Celery workers per test.

Every test gets its own key prefix and queue names on the session's Redis, so
tests never see each other's runs or messages.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import redis
from kombu import Connection, Producer

from celery_durable import Client, Engine, Settings, Workflow
from celery_durable.local.redis_server import RedisServer
from celery_durable.testing.workers import isolated_settings, worker_thread

pytest_plugins = ["tests.support.fleet", "tests.support.topologies", "pytester"]
__all__ = ["worker_thread"]  # tests import it from here; it lives in celery_durable.testing.workers


@pytest.fixture(autouse=True)
def _no_event_loop_left_running(request: pytest.FixtureRequest) -> Iterator[None]:
    """A test that leaves an event loop marked running in the main thread
    fails every later asyncio test of its process, far from the cause: name it
    here. Playwright's loop is marked running while a module's browser is open
    (tests/web/conftest.py), and closed with it."""
    before = asyncio.events._get_running_loop()
    yield
    after = asyncio.events._get_running_loop()
    if after is not None and after is not before and "chromium" not in request.fixturenames:
        pytest.fail(f"{request.node.nodeid} left an event loop running in the main thread")


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    with RedisServer(appendfsync="everysec") as server:
        yield server


@pytest.fixture
def topology(request: pytest.FixtureRequest) -> str:
    """Where the test runs (tests/support/topologies.py): "redis" unless the
    test is marked ``@pytest.mark.topologies("redis", "cluster", ...)``, which
    runs it once on each deployment named."""
    return str(getattr(request, "param", "redis"))


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    marker = metafunc.definition.get_closest_marker("topologies")
    if marker is not None and "topology" in metafunc.fixturenames:
        metafunc.parametrize("topology", marker.args, indirect=True)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests marked ``after_all`` run after every other test of the session."""
    items.sort(key=lambda item: item.get_closest_marker("after_all") is not None)


@pytest.fixture
def settings(redis_server: RedisServer, topology: str, request: pytest.FixtureRequest) -> Iterator[Settings]:
    from tests.support.topologies import deployed  # a plugin (pytest_plugins): imported once pytest rewrites it

    with deployed(topology, isolated_settings(redis_server.url, f"t{uuid.uuid4().hex[:8]}"), request) as chosen:
        yield chosen


@pytest.fixture
def raw_redis(settings: Settings) -> Iterator[redis.Redis]:
    """A client of the journal's Redis (of the Redis Cluster, on that topology)."""
    from tests.support.topologies import journal_client

    client = journal_client(settings)
    yield client
    client.close()


@dataclass
class Durable:
    engine: Engine
    client: Client

    @property
    def settings(self) -> Settings:
        return self.engine.settings


DurableFactory = Callable[..., Durable]


@pytest.fixture
def durable(settings: Settings) -> Iterator[DurableFactory]:
    """``durable(workflows, concurrency=8, worker=True, agent_runner=None, **settings)``:
    an engine, a client, a worker."""
    with contextlib.ExitStack() as stack:

        def make(
            workflows: Iterable[Workflow],
            *,
            concurrency: int = 8,
            worker: bool = True,
            namespace: str = "default",
            agent_runner: Any = None,
            **overrides: Any,
        ) -> Durable:
            engine = Engine(list(workflows), settings.model_copy(update=overrides), agent_runner=agent_runner)
            if worker:
                stack.enter_context(worker_thread(engine, concurrency=concurrency))
            return Durable(engine, engine.client(namespace))

        yield make


def kill_attempt(raw: redis.Redis, engine: Engine, run_id: str) -> None:
    """Make the run's attempt look as a dead one does to the recovery sweep:
    its only message was running on a worker that stopped renewing it long
    ago. The run is due for a look now."""
    keys = engine.store.run_keys(run_id)
    raw.delete(keys.live)
    raw.hset(keys.live, "task-of-a-dead-worker", "x|1")
    raw.hset(keys.run, "lease_until", "1")
    engine.store.schedule_check(run_id, 0)


def put_in_steps_queue(settings: Settings) -> None:
    """Leave one message (not a task) waiting in the steps queue, as the broker holds it."""
    from celery_durable.tasks.app import durable_queues

    with Connection(settings.effective_broker_url) as publisher:
        steps = next(q for q in durable_queues(settings) if q.name == settings.steps_queue)
        Producer(publisher.channel()).publish(
            {"not": "a task"}, exchange=steps.exchange, routing_key=steps.routing_key, declare=[steps]
        )
