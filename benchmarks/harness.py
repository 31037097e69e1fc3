"""The benchmark's world: a private Redis, real worker processes, one engine.

Workers are real ``celery-durable worker`` subprocesses, each in its own
process group (``start_new_session``), so the recovery case can SIGKILL a
worker together with any pool children, by process group id and never by
name. The driver process is the client: it starts runs and Celery canvases
and waits for them, as an application would.
"""

from __future__ import annotations

import contextlib
import gc
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis
from celery import Task

from celery_durable import Client, Engine, Settings
from celery_durable.local.redis_server import RedisServer

ROOT = Path(__file__).resolve().parent.parent
APP_PATH = "benchmarks.app:engine"
APPENDFSYNC = "everysec"


@dataclass(frozen=True, slots=True)
class WorkerSetup:
    """How the worker fleet is started; stated in RESULTS.md."""

    workers: int = 1
    pool: str = "threads"
    concurrency: int = 4


def settings_env(settings: Settings) -> dict[str, str]:
    """The environment that makes a worker process use ``settings``."""
    env = dict(os.environ)
    for name, value in settings.model_dump().items():
        if value is None or name == "workflows":
            continue
        env[f"CELERY_DURABLE_{name.upper()}"] = str(value).lower() if isinstance(value, bool) else str(value)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    return env


class Worker:
    """One worker process group."""

    def __init__(
        self, settings: Settings, setup: WorkerSetup, log_dir: Path, name: str, env: dict[str, str] | None = None
    ) -> None:
        self.settings = settings
        self.setup = setup
        self.log_path = log_dir / f"{name}.log"
        self.name = name
        self.env = dict(env or {})
        """Extra environment for the process (e.g. ``BENCH_NO_SWEEP``, read by ``benchmarks.app``)."""
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> Worker:
        command = [
            sys.executable, "-m", "celery_durable", "worker", "--app", APP_PATH,
            "-P", self.setup.pool, "-c", str(self.setup.concurrency), "--quiet", "--loglevel", "WARNING",
            "--hostname", f"{self.name}-{uuid.uuid4().hex[:6]}@%h",
        ]
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                command,
                env=settings_env(self.settings) | self.env,
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

    def kill(self) -> None:
        """SIGKILL the whole process group: what a crash looks like."""
        if self.alive():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pid, signal.SIGKILL)
        if self.process is not None:
            self.process.wait()

    def stop(self, timeout: float = 20) -> None:
        self.terminate()
        self.wait_stopped(timeout)

    def terminate(self) -> None:
        """SIGTERM the process group: Celery's warm shutdown."""
        if self.alive():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pid, signal.SIGTERM)

    def wait_stopped(self, timeout: float = 20) -> None:
        if self.process is None:
            return
        try:
            self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()

    def group_pids(self) -> list[int]:
        """Every live process of this worker's process group."""
        if not self.alive():
            return []
        found: list[int] = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            with contextlib.suppress(OSError, ValueError, IndexError):
                stat = (entry / "stat").read_text()
                # Fields after the parenthesised command: state ppid pgrp ...
                if int(stat.rsplit(")", 1)[1].split()[2]) == self.pid:
                    found.append(int(entry.name))
        return found


def proc_status_kb(pid: int, field_name: str) -> int:
    """A ``kB`` field of /proc/<pid>/status (VmRSS, VmHWM); 0 when gone."""
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field_name + ":"):
                return int(line.split()[1])
    return 0


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU seconds the processes ``pids`` used so far (``/proc/<pid>/stat``); a gone one counts 0."""
    total = 0
    for pid in pids:
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])  # utime, stime: fields 14 and 15 of stat(5)
    return total / os.sysconf("SC_CLK_TCK")


def reset_peak_rss(pid: int) -> bool:
    """Reset VmHWM to the current RSS (Linux ``clear_refs`` value 5); False if refused."""
    try:
        Path(f"/proc/{pid}/clear_refs").write_text("5")
    except OSError:
        return False
    return True


@dataclass
class Bench:
    """Redis, the engine's client side, and the worker fleet of one benchmark session."""

    server: RedisServer
    settings: Settings
    setup: WorkerSetup
    log_dir: Path
    engine: Engine = field(init=False)
    client: Client = field(init=False)
    raw: redis.Redis = field(init=False)
    workers: list[Worker] = field(default_factory=list)
    fleet: tuple[Any, ...] = ()
    """What the running fleet was started with (setup, settings, env): ``use_fleet`` reuses it."""
    profile_dir: Path | None = None
    """Set by ``--py-spy``: durable measurements are recorded into it (see ``cases.common.measured``)."""
    profile_case: str = ""

    def __post_init__(self) -> None:
        from benchmarks.app import build_engine

        os.environ["BENCH_RESULT_BACKEND"] = _result_backend(self.settings.redis_url)
        self.engine = build_engine(self.settings)
        self.client = self.engine.client()
        self.raw = redis.Redis.from_url(self.settings.redis_url, decode_responses=True)

    @property
    def noop(self) -> Task:
        from benchmarks.app import noop_task

        return noop_task(self.engine)

    def start_workers(
        self,
        settings: Settings | None = None,
        timeout: float = 60,
        *,
        setup: WorkerSetup | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        """Start the fleet and wait until it runs a plain task (so it is consuming).

        ``setup`` starts another fleet than the session's (a case that measures
        1 and 2 worker processes); ``env`` is added to every worker's environment.
        """
        # The old fleet's warm shutdown (about a second: its event loop notices
        # the signal at its next poll) overlaps the new processes' start-up
        # (imports, before they connect); the old fleet has stopped before
        # the new one is asked to run anything, as if stopped first.
        stopping, self.workers, self.fleet = self.workers, [], ()
        for worker in stopping:
            worker.terminate()
        setup = setup or self.setup
        for i in range(setup.workers):
            self.workers.append(Worker(settings or self.settings, setup, self.log_dir, f"w{i}", env).start())
        for worker in stopping:
            worker.wait_stopped()
        self.fleet = (setup, settings or self.settings, dict(env or {}))
        self.wait_ready(timeout, settings)

    def use_fleet(
        self,
        setup: WorkerSetup | None = None,
        settings: Settings | None = None,
        env: dict[str, str] | None = None,
        *,
        fresh: bool = False,
    ) -> None:
        """Have this fleet running: the one running is kept when it is that fleet and alive (and not ``fresh``).

        With no arguments: the session's own fleet, which every case that does
        not manage its fleet expects (``__main__`` asks for it before each).
        """
        wanted = (setup or self.setup, settings or self.settings, dict(env or {}))
        if not fresh and self.fleet == wanted and self.workers and all(w.alive() for w in self.workers):
            return
        self.start_workers(settings, setup=setup, env=env)

    def wait_ready(self, timeout: float = 60, settings: Settings | None = None) -> None:
        deadline = time.monotonic() + timeout
        noop = self.noop
        if settings is not None and settings.coordinator_queue != self.settings.coordinator_queue:
            from benchmarks.app import build_engine, noop_task

            noop = noop_task(build_engine(settings))  # a fleet that serves other queues
        for _ in self.workers:
            noop.apply_async().get(timeout=max(1.0, deadline - time.monotonic()))

    def kill_workers(self) -> None:
        for worker in self.workers:
            worker.kill()

    def restart_workers(self, settings: Settings | None = None) -> None:
        """Start the same fleet again after a kill, without waiting for it."""
        self.workers = [
            Worker(settings or self.settings, w.setup, self.log_dir, w.name, w.env).start() for w in self.workers
        ]

    def stop_workers(self) -> None:
        for worker in self.workers:
            worker.terminate()
        for worker in self.workers:
            worker.wait_stopped()
        self.workers = []
        self.fleet = ()

    def worker_pids(self) -> list[int]:
        return [pid for worker in self.workers for pid in worker.group_pids()]

    def run_keys(self, run_id: str) -> list[str]:
        k = self.engine.store.run_keys(run_id)
        return [k.run, k.journal, k.progress, k.steps, k.running]

    def run(self, name: str, args: dict[str, Any], timeout: float = 600) -> tuple[float, Any]:
        """Start a run and wait until the client sees it completed: (seconds, envelope)."""
        started = time.perf_counter()
        run_id = self.client.start_workflow(name, args=args)
        envelope = self.client.wait_for_workflow_run(run_id, timeout=timeout, poll_interval_ms=50)
        elapsed = time.perf_counter() - started
        if envelope.status != "completed":
            raise RuntimeError(f"run {run_id} of {name} ended {envelope.status}: {envelope.error}")
        return elapsed, envelope


def _result_backend(redis_url: str) -> str:
    base, _, _db = redis_url.rpartition("/")
    return f"{base}/1"


@contextlib.contextmanager
def bench_session(
    setup: WorkerSetup,
    *,
    max_fanout: int,
    lease_seconds: float = 30.0,
    log_dir: Path | None = None,
    overrides: dict[str, Any] | None = None,
) -> Iterator[Bench]:
    """A private redis-server (AOF, appendfsync everysec) and the engine on it; workers stopped at exit."""
    data_dir = Path(tempfile.mkdtemp(prefix="cd-bench-"))
    logs = log_dir or data_dir
    logs.mkdir(parents=True, exist_ok=True)
    server = RedisServer(data_dir / "redis", appendfsync=APPENDFSYNC)
    server.start()
    bench: Bench | None = None
    try:
        settings = Settings(
            redis_url=server.url,
            key_prefix="bench",
            coordinator_queue="bench.coordinator",
            steps_queue="bench.steps",
            agents_queue="bench.agents",
            max_fanout=max_fanout,
            lease_seconds=lease_seconds,
            **(overrides or {}),
        )
        bench = Bench(server=server, settings=settings, setup=setup, log_dir=logs)
        yield bench
    finally:
        if bench is not None:
            bench.stop_workers()
            bench.raw.close()
        # Celery's AsyncResult finalizers talk to the result backend: let them
        # run while its Redis is still up, or they retry against a dead server.
        gc.collect()
        server.stop()
        shutil.rmtree(data_dir, ignore_errors=True)
