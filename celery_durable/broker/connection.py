"""The journal's Redis: connecting to it, the one translation of its errors,
and the Lua scripts registered on a client.

Redis errors become ``StorageUnavailableError`` (nothing was written; the
same call can succeed later) or ``StorageCorruptError`` (Redis holds data
celery-durable did not write) here, at the edge, and nowhere else.

The scripts are loaded from ``lua/`` once per client (``Scripts``). Each
script file opens with a header naming its KEYS and ARGV, and has its row in
``ops.py``; ``_prelude.lua`` is prepended to every script, after the line
that tells its fence rule whether the row is fenced, so the fencing check
exists in one place and runs in the same script as the write it guards.

Of the prelude, a script carries the functions it names and those they name
in turn, in the prelude's order, with its constants and the fence rule: Redis
runs a script's every top-level line on every call, and the whole prelude
(66 functions made afresh, then left to the GC) cost each call about 9 us,
against about 2 for the script's own work of a small one (issue 42).
"""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Callable, Iterator
from functools import cache
from importlib import resources
from typing import Any, cast

import redis
import redis.asyncio
import redis.exceptions
from redis.cluster import RedisCluster
from redis.commands.core import Script

from celery_durable.broker.ops import FENCED, SCRIPT_NAMES
from celery_durable.config import Settings
from celery_durable.errors import StorageCorruptError, StorageUnavailableError

_NOT_NOW = (
    redis.exceptions.OutOfMemoryError,
    redis.exceptions.ReadOnlyError,
    redis.exceptions.ClusterDownError,
    redis.exceptions.TryAgainError,
)
"""Redis is there but cannot take this write now: out of memory, a replica,
a cluster without a master. redis-py strips the error code ("OOM ...") from
their messages, so they are told apart by class, not by text."""


@contextlib.contextmanager
def storage_errors() -> Iterator[None]:
    """Translate redis-py errors into the two storage errors users see.

    Unavailable: nothing was written and the same call can succeed later.
    Corrupt: Redis holds data celery-durable did not write (a wrong type, a
    script that failed on a stored value). Messages never hold the URL, so a
    password in it cannot leak into logs.
    """
    try:
        yield
    except (redis.exceptions.AuthenticationError, redis.exceptions.AuthorizationError) as exc:
        raise StorageUnavailableError(
            f"Redis refused the credentials of redis_url (user and password, or ACL): {exc}"
        ) from None
    except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError) as exc:
        # BusyLoadingError (still loading its append-only file) is one of these.
        raise StorageUnavailableError(f"Redis is unavailable: {exc}") from None
    except redis.exceptions.NoPermissionError as exc:
        raise StorageUnavailableError(
            f"The Redis user of redis_url lacks a permission celery-durable needs (check its ACL): {exc}"
        ) from None
    except _NOT_NOW as exc:
        raise StorageUnavailableError(f"Redis cannot serve the journal now: {exc}") from None
    except redis.exceptions.ResponseError as exc:
        if str(exc).startswith(("BUSY", "LOADING", "MASTERDOWN")):
            raise StorageUnavailableError(f"Redis cannot serve the journal now: {exc}") from None
        raise StorageCorruptError(f"Redis refused an operation on stored data: {exc}") from None
    except redis.exceptions.RedisError as exc:
        # InvalidResponse and the like: the conversation broke, not the data.
        raise StorageUnavailableError(f"Redis is unavailable: {type(exc).__name__}: {exc}") from None
    except redis.exceptions.RedisClusterException as exc:
        # No RedisError: the cluster client found no node for a slot, or none
        # of the nodes it knows answers. The slot may be served again later.
        raise StorageUnavailableError(f"Redis Cluster cannot serve the journal now: {exc}") from None
    except UnicodeDecodeError as exc:
        # A stored value that is not UTF-8: nothing celery-durable writes.
        # redis-py drops the connection it was reading from, so the next call
        # starts clean; the data is what is wrong, every time it is read.
        raise StorageCorruptError(f"Redis holds a value that is not UTF-8 text: {exc}") from None


RedisClient = redis.Redis | RedisCluster
"""One Redis, or a Redis Cluster (``settings.redis_cluster``). Both speak the
same commands; on a cluster each script runs on the node that serves its
keys' slot, which is why every script is given keys of one hash tag only."""


def connect(settings: Settings) -> RedisClient:
    """The journal's client, as ``settings`` describe it.

    Every call answers within the operation timeout, or fails with
    ``StorageUnavailableError``: a stalled Redis must not hang callers, and a
    worker must learn of it while its lease can still be defended. A cluster
    client reads the slot map from ``redis_url``'s node when it is made, and
    again whenever a node answers MOVED or stops answering.
    """
    options = _options(settings)
    if settings.redis_cluster:
        with storage_errors():
            return RedisCluster.from_url(settings.redis_url, **options)
    return redis.Redis.from_url(settings.redis_url, **options)


ASYNC_CONNECTIONS = 64
"""The most connections an ``AsyncClient`` opens for commands (its waits
share one more): a thousand concurrent calls queue for them rather than open
a thousand sockets. A call queues for as long as the calls before it take
(each command is bounded by the socket timeouts, not the queue): with the
queue bounded too, 1,000 runs started at once on a loaded machine failed
("No connection available") after ``redis_timeout_seconds`` in the queue."""


def connect_asyncio(settings: Settings) -> redis.asyncio.Redis:
    """The journal's client on ``redis.asyncio``, for ``AsyncClient``: the
    same options as :func:`connect`'s (one Redis; the async client refuses a Cluster)."""
    pool = redis.asyncio.BlockingConnectionPool.from_url(
        settings.redis_url,
        max_connections=ASYNC_CONNECTIONS,
        timeout=None,
        **_options(settings),
    )
    return redis.asyncio.Redis.from_pool(pool)  # closing the client closes its pool


def _options(settings: Settings) -> dict[str, Any]:
    return {
        "decode_responses": True,
        "socket_connect_timeout": settings.redis_timeout_seconds,
        "socket_timeout": settings.redis_timeout_seconds,
        "health_check_interval": 30,
    }


# -- the scripts --------------------------------------------------------------

LUA = resources.files("celery_durable.broker") / "lua"


@cache
def script_source(name: str) -> str:
    body = (LUA / f"{name}.lua").read_text(encoding="utf-8")
    fenced = name in FENCED
    return f"local FENCED = {'true' if fenced else 'false'}\n{_prelude_for(body, fenced)}\n{body}"


@cache
def _prelude_parts() -> tuple[tuple[str | None, str], ...]:
    """The prelude in order: each ``local function`` with the comment above
    it (named), and every other top-level statement (None: always kept)."""
    parts: list[tuple[str | None, str]] = []
    pending: list[str] = []
    current: str | None = None
    block: list[str] = []
    for line in (LUA / "_prelude.lua").read_text(encoding="utf-8").splitlines():
        if current is not None:
            block.append(line)
            if line == "end":
                parts.append((current, "\n".join(block)))
                current, block = None, []
            continue
        found = re.match(r"local function (\w+)\(", line)
        if found:
            current, block, pending = found.group(1), [*pending, line], []
        elif line.startswith("--") or not line.strip():
            pending.append(line)
        else:  # a constant, or the fence rule (from "if FENCED then" to its "end")
            parts.append((None, "\n".join([*pending, line])))
            pending = []
    if current is not None:
        raise RuntimeError(f"_prelude.lua: function {current} has no closing 'end' at the start of a line")
    return tuple(parts)


def _names_in(lua: str) -> set[str]:
    """The words of ``lua``'s code, its whole-line comments left out (they
    name functions they do not call)."""
    return set(re.findall(r"\w+", "\n".join(line for line in lua.splitlines() if not line.lstrip().startswith("--"))))


def _prelude_for(body: str, fenced: bool) -> str:
    """The prelude's functions ``body`` needs, with everything they need."""
    parts = _prelude_parts()
    named = {name: text for name, text in parts if name is not None}
    wanted = (_names_in(body) | ({"fence"} if fenced else set())) & named.keys()
    todo = list(wanted)
    while todo:
        for used in _names_in(named[todo.pop()]) & named.keys() - wanted:
            wanted.add(used)
            todo.append(used)
    return "\n".join(text for name, text in parts if name is None or name in wanted)


class Scripts:
    """The registered scripts of one client; redis-py caches them by SHA.

    On a Redis Cluster a script is sent to the node serving its keys' slot
    (redis-py refuses keys of several slots before sending; the node refuses
    a key of another slot that a script builds itself) and, on first use,
    loaded on every master.
    """

    def __init__(self, client: redis.Redis | RedisCluster) -> None:
        # redis-py types register_script for Redis alone; a Script only calls
        # evalsha and script_load, which RedisCluster routes by slot.
        registrar = cast(redis.Redis, client)
        self._scripts: dict[str, Script] = {
            name: registrar.register_script(script_source(name)) for name in SCRIPT_NAMES
        }

    def __getitem__(self, name: str) -> Script:
        return self._scripts[name]


Clock = Callable[[], int]
"""Milliseconds since the epoch."""


def now_ms() -> int:
    return int(time.time() * 1000)
