"""Real workers for integration and crash tests: processes started by the CLI and
killed by pid, or (``worker_thread``) Celery's own test worker in a thread.

Each worker runs in its own process group (``start_new_session``), so
SIGKILL, SIGSTOP and SIGCONT reach its prefork children too, and nothing is
ever signalled by name: a test kills the workers it started, never another
suite's. Used by this project's own tests and by the pytest plugin's
``durable_fleet`` fixture (``testing/pytest_plugin.py``).
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from celery_durable.config import Settings
from celery_durable.local.fleet import LocalWorker

if TYPE_CHECKING:
    from celery_durable.engine import Engine


def isolated_settings(redis_url: str, tag: str, **overrides: object) -> Settings:
    """Settings on ``redis_url`` under key prefix ``tag`` and queues named after it,
    so tests sharing one Redis never see each other's runs or messages; a short
    lease, so a killed worker's runs are recovered within seconds."""
    fields: dict[str, object] = {
        "redis_url": redis_url,
        "key_prefix": tag,
        "coordinator_queue": f"{tag}.coordinator",
        "steps_queue": f"{tag}.steps",
        "agents_queue": f"{tag}.agents",
        "lease_seconds": 5,
        **overrides,
    }
    return Settings(**fields)  # type: ignore[arg-type]


def settings_env(settings: Settings, root: Path | None = None) -> dict[str, str]:
    """The environment that makes a worker process use ``settings`` (and
    import the user's modules from ``root``, put first on PYTHONPATH)."""
    env = dict(os.environ)
    for name, value in settings.model_dump().items():
        if value is None or name == "workflows":
            continue
        env[f"CELERY_DURABLE_{name.upper()}"] = str(value).lower() if isinstance(value, bool) else str(value)
    if root is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(root), env.get("PYTHONPATH", "")])
    return env


class WorkerProcess(LocalWorker):
    """One ``celery-durable worker`` process (and its children), run from ``root`` with ``settings``."""

    def __init__(
        self,
        settings: Settings,
        app: str,
        *,
        root: Path,
        pool: str = "threads",
        concurrency: int = 4,
        name: str = "w",
        log_dir: Path | None = None,
        queues: list[str] | None = None,
        env: dict[str, str] | None = None,
        args: list[str] | None = None,
    ) -> None:
        super().__init__(
            app,
            name=name,
            env={**settings_env(settings, root), **(env or {})},
            pool=pool,
            concurrency=concurrency,
            log_path=log_dir / f"{name}.log" if log_dir else None,
            cwd=root,
            args=(["--queues", ",".join(queues)] if queues else []) + (args or []),
        )
        self.settings = settings
        self.root = root
        self.queues = queues

    @property
    def hostname_prefix(self) -> str:
        return f"{super().hostname_prefix}-{id(self)}"

    def freeze(self) -> None:
        self.signal_group(signal.SIGSTOP)

    def thaw(self) -> None:
        self.signal_group(signal.SIGCONT)

    def stop(self, timeout: float = 20) -> None:
        """A frozen worker is thawed first, or it would never see the SIGTERM."""
        self.thaw()
        super().stop(timeout)


class WorkerFleet:
    """Every worker process a test started, from ``root``; all are killed at ``close``."""

    def __init__(self, settings: Settings, log_dir: Path, root: Path) -> None:
        self.settings = settings
        self.log_dir = log_dir
        self.root = root
        self.workers: list[WorkerProcess] = []

    def start(self, app: str, **options: object) -> WorkerProcess:
        """Start ``celery-durable worker --app APP`` (``module:engine``); options as ``WorkerProcess``'s."""
        worker = WorkerProcess(self.settings, app, root=self.root, log_dir=self.log_dir, **options)  # type: ignore[arg-type]
        self.workers.append(worker.start())
        return worker

    def kill_all(self) -> None:
        for worker in self.workers:
            worker.kill()

    def close(self) -> None:
        self.kill_all()


@contextlib.contextmanager
def worker_thread(engine: Engine, *, concurrency: int = 8, pool: str = "threads", **options: Any) -> Iterator[Any]:
    """A Celery worker for ``engine`` in a thread of the test process.

    Celery's Hub bootstep reuses kombu's process-wide event loop when one is
    set, so a second in-process worker would drive the first one's loop from
    another thread: both poll the same sockets, one reads the reply the other
    was woken for and then blocks in ``recv`` forever, and that worker never
    stops. Clearing the loop gives each worker a hub of its own. (A real
    deployment runs one worker per process and never meets this.)

    ``start_worker`` also leaves Celery's process-wide ``should_terminate``
    flag set when a worker fails to stop in time, and every later in-process
    worker then hangs at start; resetting it keeps a failure where it happened.

    On an AMQP broker an idle worker's loop sleeps in its poll until the next
    timer, up to 10 s, before it sees that flag; an AMQP heartbeat checked every
    second is such a timer, so a test's worker stops within a second.
    """
    from celery.contrib.testing.worker import start_worker
    from celery.worker import state as worker_state
    from kombu.asynchronous import set_event_loop

    set_event_loop(None)
    with engine.celery.connection_for_read() as connection:
        if connection.transport.driver_type == "amqp":
            engine.celery.conf.broker_heartbeat = 2
    try:
        with start_worker(
            engine.celery,
            pool=pool,
            concurrency=concurrency,
            perform_ping_check=False,
            loglevel="WARNING",
            shutdown_timeout=30,
            **options,
        ) as worker:
            yield worker
    finally:
        worker_state.should_terminate = None
