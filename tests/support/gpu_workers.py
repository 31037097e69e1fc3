"""A team's GPU queue served by plain Celery workers (not durable ones):
processes of ``celery -A tests.support.apps.gpu worker``, killed by process group."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import redis

from celery_durable import Settings
from tests.support.apps.gpu import make_app
from tests.support.fleet import ROOT, settings_env
from tests.support.poll import RUN_BOUND


@dataclass
class Gpu:
    """The team's GPU queue and its plain workers (processes, killed by process group)."""

    settings: Settings
    queue: str
    log_dir: Path
    app_module: str = "tests.support.apps.gpu"
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def start(self) -> subprocess.Popen[bytes]:
        env = {**settings_env(self.settings), "GPU_QUEUE": self.queue}
        log = open(self.log_dir / f"gpu-{len(self.processes)}.log", "ab")  # noqa: SIM115
        process = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", self.app_module, "worker", "-Q", self.queue, "-P", "threads",
             "-c", "2", "--loglevel", "WARNING", "--hostname", f"gpu{len(self.processes)}-{os.getpid()}@%h"],
            env=env, cwd=ROOT, stdout=log, stderr=log, start_new_session=True,
        )
        self.processes.append(process)
        return process

    def kill(self, process: subprocess.Popen[bytes]) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()

    def ready(self) -> None:
        """Wait until a plain worker answers: a task round trip through it."""
        app = make_app(self.settings.redis_url, self.queue)
        assert app.tasks["gpu.add"].delay(1, 1).get(timeout=RUN_BOUND) == 2

    def runs(self, task_id: str) -> int:
        raw = redis.Redis.from_url(self.settings.redis_url, decode_responses=True)
        return int(raw.get(f"gpu:runs:{task_id}") or 0)
