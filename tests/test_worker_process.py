"""Workers as real processes: the CLI's worker command and plain ``celery -A``."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from celery_durable import Engine, Settings
from tests.support.apps.basic import fan


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
        [sys.executable, "-m", "celery_durable", "worker", "--app", "tests.support.apps.basic:engine",
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
        [sys.executable, "-m", "celery", "-A", "tests.support.apps.basic:celery_app", "worker",
         "-P", "threads", "-c", "4", "--loglevel", "WARNING"],
    )
    client = Engine([fan], settings).client()
    envelope = client.run_workflow("fan", args={"count": 3, "seconds": 0.1}, timeout=60)
    assert envelope.status == "completed", envelope.error
    assert len(envelope.result) == 3


def test_a_pool_child_forked_while_the_engine_lock_is_held_still_reaches_the_store(settings) -> None:
    """A prefork pool forks its children while the worker's sweep thread runs:
    a child that inherits the engine's lock held must not wait for it for ever
    (children hung at their first task, and runs waited a lease or more)."""
    engine = Engine([fan], settings)
    with engine._lock:  # as the sweep thread holds it while it creates the store
        child = os.fork()
        if child == 0:
            code = 1
            try:
                code = 0 if engine.store.client.ping() else 1
            finally:
                os._exit(code)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        done, status = os.waitpid(child, os.WNOHANG)
        if done:
            assert os.waitstatus_to_exitcode(status) == 0
            return
        time.sleep(0.05)
    os.kill(child, signal.SIGKILL)
    os.waitpid(child, 0)
    raise AssertionError("the forked child hung on the engine's lock")
