"""Worker subprocesses on this machine: for ``celery-durable demo`` and for a
``celery-durable run`` on the embedded Redis, which has no fleet of its own.

Each worker is ``python -m celery_durable worker`` in its own process group
(``start_new_session``), so a SIGKILL reaches every process of it — pool
children included — and nothing is ever signalled by name.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Self


class LocalWorker:
    """One ``celery-durable worker`` process (and its children)."""

    def __init__(
        self,
        app: str,
        *,
        name: str = "worker",
        env: Mapping[str, str] | None = None,
        pool: str = "threads",
        concurrency: int = 8,
        log_path: Path | None = None,
        cwd: Path | None = None,
        args: Sequence[str] = (),
    ) -> None:
        self.app = app
        self.name = name
        self.env = dict(os.environ if env is None else env)
        self.pool = pool
        self.concurrency = concurrency
        self.log_path = log_path
        self.cwd = cwd
        self.args = list(args)
        self.process: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    def start(self) -> Self:
        command = [
            sys.executable, "-m", "celery_durable", "worker", "--app", self.app,
            "-P", self.pool, "-c", str(self.concurrency), "--quiet", "--loglevel", "WARNING",
            "--hostname", f"{self.hostname_prefix}@%h", *self.args,
        ]
        if self.log_path is not None:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed in wait()
        output = self._log if self._log is not None else subprocess.DEVNULL
        self.process = subprocess.Popen(
            command, env=self.env, cwd=self.cwd, stdout=output, stderr=output, start_new_session=True
        )
        return self

    @property
    def hostname_prefix(self) -> str:
        """The worker's Celery node name up to the ``@``: unique per starting process."""
        return f"{self.name}-{os.getpid()}"

    @property
    def pid(self) -> int:
        if self.process is None:
            raise RuntimeError(f"worker {self.name} was not started")
        return self.process.pid

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def signal_group(self, signum: int) -> None:
        """Send ``signum`` to the worker's whole process group."""
        if self.alive():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pid, signum)

    def kill(self) -> int | None:
        """SIGKILL the process group, as a crash or ``kill -9`` would; the exit code."""
        self.signal_group(signal.SIGKILL)
        return self.wait(timeout=10)

    def stop(self, timeout: float = 15) -> None:
        """SIGTERM: Celery's warm shutdown; SIGKILL if it takes longer than ``timeout``."""
        self.signal_group(signal.SIGTERM)
        if self.wait(timeout) is None:
            self.kill()

    def wait(self, timeout: float) -> int | None:
        if self.process is None:
            return None
        try:
            code = self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None
        if self._log is not None:
            self._log.close()
            self._log = None
        return code
