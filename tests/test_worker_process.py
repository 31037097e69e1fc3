"""Workers as real processes: the CLI's worker command and plain ``celery -A``."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator

import pytest

from celery_durable import Engine, Settings
from tests.apps.basic import fan


def settings_env(settings: Settings) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        CELERY_DURABLE_REDIS_URL=settings.redis_url,
        CELERY_DURABLE_KEY_PREFIX=settings.key_prefix,
        CELERY_DURABLE_COORDINATOR_QUEUE=settings.coordinator_queue,
        CELERY_DURABLE_STEPS_QUEUE=settings.steps_queue,
        CELERY_DURABLE_AGENTS_QUEUE=settings.agents_queue,
        CELERY_DURABLE_LEASE_SECONDS=str(settings.lease_seconds),
    )
    return env


@pytest.fixture
def spawn(settings: Settings) -> Iterator[list[subprocess.Popen[bytes]]]:
    processes: list[subprocess.Popen[bytes]] = []
    yield processes
    for process in processes:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
    for process in processes:
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def start(spawn: list[subprocess.Popen[bytes]], settings: Settings, command: list[str]) -> None:
    spawn.append(
        subprocess.Popen(
            command,
            env=settings_env(settings),
            cwd=os.path.dirname(os.path.dirname(__file__)),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
    )


def test_cli_worker_with_prefork_pool_runs_branches_in_separate_processes(settings, spawn) -> None:
    """A task per branch (branch_batch_ms 0): the pool, not the hand-off's
    timing, is what this checks; tests/test_steps_and_fanout.py checks that."""
    settings = settings.model_copy(update={"branch_batch_ms": 0})
    start(
        spawn,
        settings,
        [sys.executable, "-m", "celery_durable", "worker", "--app", "tests.apps.basic:engine",
         "-P", "prefork", "-c", "4", "--quiet", "--loglevel", "WARNING"],
    )
    client = Engine([fan], settings).client()
    envelope = client.run_workflow("fan", args={"count": 4, "seconds": 0.5}, timeout=60)
    assert envelope.status == "completed", envelope.error
    pids = envelope.result
    assert len(pids) == 4
    assert len(set(pids)) > 1, "branches should run in more than one prefork child"


def test_plain_celery_worker_runs_the_engine(settings, spawn) -> None:
    start(
        spawn,
        settings,
        [sys.executable, "-m", "celery", "-A", "tests.apps.basic:celery_app", "worker",
         "-P", "threads", "-c", "4", "--loglevel", "WARNING"],
    )
    client = Engine([fan], settings).client()
    envelope = client.run_workflow("fan", args={"count": 3, "seconds": 0.1}, timeout=60)
    assert envelope.status == "completed", envelope.error
    assert len(envelope.result) == 3
