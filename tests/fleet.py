"""Real worker processes for crash tests: started by the CLI, killed by pid.

Each worker runs in its own process group (start_new_session), so SIGKILL,
SIGSTOP and SIGCONT reach its prefork children too, and nothing is ever
signalled by name.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from celery_durable import Settings

ROOT = Path(__file__).resolve().parent.parent


def settings_env(settings: Settings) -> dict[str, str]:
    """The environment that makes a worker process use ``settings``."""
    env = dict(os.environ)
    for name, value in settings.model_dump().items():
        if value is None or name == "workflows":
            continue
        env[f"CELERY_DURABLE_{name.upper()}"] = str(value).lower() if isinstance(value, bool) else str(value)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    return env


class WorkerProcess:
    """One ``celery-durable worker`` process (and its children)."""

    def __init__(
        self,
        settings: Settings,
        app: str,
        *,
        pool: str = "threads",
        concurrency: int = 4,
        name: str = "w",
        log_dir: Path | None = None,
        queues: list[str] | None = None,
        env: dict[str, str] | None = None,
        args: list[str] | None = None,
    ) -> None:
        self.settings = settings
        self.app = app
        self.pool = pool
        self.concurrency = concurrency
        self.name = name
        self.log_dir = log_dir
        self.queues = queues
        self.env = env or {}
        self.args = args or []
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> WorkerProcess:
        command = [
            sys.executable, "-m", "celery_durable", "worker", "--app", self.app,
            "-P", self.pool, "-c", str(self.concurrency), "--quiet", "--loglevel", "WARNING",
            "--hostname", f"{self.name}-{os.getpid()}-{id(self)}@%h",
        ]
        if self.queues:
            command += ["--queues", ",".join(self.queues)]
        command += self.args
        log = open(self.log_dir / f"{self.name}.log", "ab") if self.log_dir else subprocess.DEVNULL  # noqa: SIM115
        self.process = subprocess.Popen(
            command,
            env={**settings_env(self.settings), **self.env},
            cwd=ROOT,
            stdout=log,
            stderr=log,
            start_new_session=True,
        )
        return self

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def signal(self, signum: int) -> None:
        if self.alive():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pid, signum)

    def kill(self) -> None:
        """SIGKILL the whole process group: what a crash looks like."""
        self.signal(signal.SIGKILL)
        if self.process is not None:
            self.process.wait()

    def freeze(self) -> None:
        self.signal(signal.SIGSTOP)

    def thaw(self) -> None:
        self.signal(signal.SIGCONT)

    def stop(self, timeout: float = 20) -> None:
        if not self.alive():
            return
        self.thaw()
        self.signal(signal.SIGTERM)
        assert self.process is not None
        try:
            self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()


class Fleet:
    """Every worker process a test started; all are gone after the test."""

    def __init__(self, settings: Settings, log_dir: Path) -> None:
        self.settings = settings
        self.log_dir = log_dir
        self.workers: list[WorkerProcess] = []

    def start(self, app: str, **options: object) -> WorkerProcess:
        worker = WorkerProcess(self.settings, app, log_dir=self.log_dir, **options)  # type: ignore[arg-type]
        self.workers.append(worker.start())
        return worker

    def kill_all(self) -> None:
        for worker in self.workers:
            worker.kill()

    def close(self) -> None:
        for worker in self.workers:
            worker.kill()


@pytest.fixture
def fleet(settings: Settings, tmp_path: Path) -> Iterator[Fleet]:
    group = Fleet(settings, tmp_path)
    yield group
    group.close()
