"""Connecting to the journal's Redis, and the one translation of its errors.

Redis errors become ``StorageUnavailableError`` (nothing was written; the
same call can succeed later) or ``StorageCorruptError`` (Redis holds data
celery-durable did not write) here, at the edge, and nowhere else.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import redis
import redis.asyncio
import redis.exceptions
from redis.cluster import RedisCluster

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
