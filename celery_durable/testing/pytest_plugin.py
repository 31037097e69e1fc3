"""pytest fixtures for testing your workflows (entry point ``pytest11``: on
once ``celery-durable[testing]`` is installed; ``-p no:celery_durable`` turns it off).

Tell the plugin your workflows by overriding one fixture in your conftest::

    @pytest.fixture
    def durable_workflows():
        return [checkout]

Then, in-process (no worker, no service; virtual time, the real scripts):

- ``durable_env``: a fresh ``WorkflowTestEnvironment`` per test, built from
  ``durable_workflows`` and ``durable_env_options`` (a dict of its keyword
  arguments: ``agent_runner``, ``tasks``, ``fanout``...; override it too);
- ``durable_clock``: that environment's ``VirtualClock``;
- ``durable_crash_test``: ``crash_test`` on ``durable_workflows``:
  ``durable_crash_test(workflow, args, fakes=[...])`` runs the workflow once
  per point a worker can die, and reports which steps ran twice.

And against a real fleet on a private Redis (integration and crash tests):

- ``durable_redis`` (session): a private ``redis-server``, append-only file on;
- ``durable_settings``: ``Settings`` on it, with a key prefix and queues of the test's own;
- ``durable_client``: a ``Client`` of an engine of ``durable_workflows`` on those settings;
- ``durable_fleet``: starts ``celery-durable worker --app module:engine``
  processes (``durable_fleet.start("myapp.engine:engine")``) with those
  settings, run from the rootdir; ``worker.kill()`` SIGKILLs one by its own
  pid (its process group); all are killed when the test ends.
- ``durable_worker``: one worker in a thread of the test process, Celery's
  own ``celery.contrib.testing.worker.start_worker`` (fast, no crash tests).

Helpers: ``celery_durable.testing.until_waiting_for_signal(client, run_id,
name)`` and ``durable_env.skip_to_next_timer(run_id)``.

Imports of the engine happen inside the fixtures, so a test session that
uses none of them pays nothing for the plugin.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from celery_durable.client.client import Client
    from celery_durable.config import Settings
    from celery_durable.local.redis_server import RedisServer
    from celery_durable.testing.clock import VirtualClock
    from celery_durable.testing.crash_test import CrashReport
    from celery_durable.testing.environment import WorkflowTestEnvironment
    from celery_durable.testing.workers import WorkerFleet
    from celery_durable.workflows.definition import Workflow


@pytest.fixture
def durable_workflows() -> list[Workflow]:
    """The workflows under test: override this fixture in your conftest."""
    pytest.fail(
        "celery-durable's fixtures need your workflows: define a `durable_workflows` fixture "
        "in your conftest.py that returns them (a list of Workflow handles)",
        pytrace=False,
    )


@pytest.fixture
def durable_env_options() -> dict[str, Any]:
    """Keyword arguments of ``durable_env``'s ``WorkflowTestEnvironment``; override to set them."""
    return {}


@pytest.fixture
def durable_env(durable_workflows: list[Workflow], durable_env_options: dict[str, Any]) -> WorkflowTestEnvironment:
    """A fresh in-process environment per test: its own key prefix on the process's private Redis."""
    from celery_durable.testing.environment import WorkflowTestEnvironment

    return WorkflowTestEnvironment(durable_workflows, **durable_env_options)


@pytest.fixture
def durable_clock(durable_env: WorkflowTestEnvironment) -> VirtualClock:
    """``durable_env``'s virtual clock: ``advance(seconds)`` fires every timer it passes."""
    return durable_env.clock


@pytest.fixture
def durable_crash_test(
    durable_workflows: list[Workflow], durable_env_options: dict[str, Any]
) -> Callable[..., CrashReport]:
    """``crash_test`` with ``durable_workflows`` (and ``tasks`` and ``agent_runner``
    from ``durable_env_options``) given: call it with the workflow, its args
    and ``fakes=``, ``signals=``."""
    from functools import partial

    from celery_durable.testing.crash_test import crash_test

    answers = {name: durable_env_options[name] for name in ("tasks", "agent_runner") if name in durable_env_options}
    return partial(crash_test, durable_workflows, **answers)


@pytest.fixture(scope="session")
def durable_redis() -> Iterator[RedisServer]:
    """A private ``redis-server`` for the session's integration tests, stopped after them."""
    from celery_durable.local.redis_server import RedisServer

    with RedisServer(appendfsync="everysec") as server:
        yield server


@pytest.fixture
def durable_settings(durable_redis: RedisServer) -> Settings:
    """Settings on the private Redis, under a key prefix and queue names no other test uses."""
    from celery_durable.testing.workers import isolated_settings

    return isolated_settings(durable_redis.url, f"pt{uuid.uuid4().hex[:8]}")


@pytest.fixture
def durable_client(durable_workflows: list[Workflow], durable_settings: Settings) -> Client:
    """A client of the workflows on ``durable_settings``: what the fleet's workers serve."""
    from celery_durable.engine import Engine

    return Engine(durable_workflows, durable_settings).client()


@pytest.fixture
def durable_fleet(durable_settings: Settings, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[WorkerFleet]:
    """Worker processes on ``durable_settings``; each killed by its own pid when the test ends.
    Their logs are in the test's ``tmp_path``."""
    from celery_durable.testing.workers import WorkerFleet

    fleet = WorkerFleet(durable_settings, tmp_path, request.config.rootpath)
    yield fleet
    fleet.close()


@pytest.fixture
def durable_worker(durable_client: Client) -> Iterator[Any]:
    """A worker for ``durable_client``'s engine in a thread of this process (Celery's test worker)."""
    from celery_durable.testing.workers import worker_thread

    with worker_thread(durable_client.engine) as worker:
        yield worker
