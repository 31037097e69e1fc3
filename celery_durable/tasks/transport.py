"""Kombu's Redis transport, hardened against frames that are not messages,
and without a new Redis client per publish.

A worker's consumer pops each frame off a queue list and decodes it. Kombu
5.7 lets a frame that is not a JSON envelope (``LPUSH durable.steps junk``,
a producer of another library sharing the broker) raise out of its event
loop, and Celery stops the whole worker with "Unrecoverable error". Here
such a frame is logged and dropped instead: it has already left the list,
it carries no task anyone could run, and the worker goes on consuming.
Well-formed envelopes with a body that does not decode, or a content type
other than JSON, never get this far wrong: Celery refuses them itself.

Kombu builds a new ``redis.Redis`` for every publish, ack and event
(``Channel.conn_or_acquire``), and a client's constructor fills its table of
response callbacks each time: about 0.25 ms of a worker's CPU per publish,
twice for a task sent with its ``task-sent`` event, which made up a sixth
of a worker's busy time in a fan-out of task calls. A ``redis.Redis`` is
safe to share between threads (each command takes a connection from the
pool), so the channel keeps one per pool, as kombu already does for its
asynchronous client.

And a worker survives its Redis broker restarting while it runs a task.
Celery 5.7's consumer, on a lost connection, first ``collect()``s the
connection (which drops the transport's connection info) and then
``close()``s it; closing the channel restores the unacknowledged messages,
which builds a new pool from that connection info, and the AttributeError
that gives stops the worker ("Unrecoverable error"). A channel whose
connection is gone raises a connection error instead, which Celery ignores
while closing and answers by reconnecting; the unacknowledged messages stay
in Redis's unacked set, restored after the visibility timeout as after any
worker's death.
"""

from __future__ import annotations

import logging
from typing import Any

from kombu.transport import redis as redis_transport
from kombu.transport.virtual import Empty
from redis.exceptions import ConnectionError as RedisConnectionError

logger = logging.getLogger(__name__)

MALFORMED = (ValueError, TypeError, AttributeError, KeyError)
"""What decoding a frame that is not a kombu envelope raises."""

TRANSPORT = f"{__name__}:Transport"
"""The ``broker_transport`` setting that selects this transport."""


def _dropped(exc: BaseException) -> None:
    logger.error("dropped a broker frame that is not a task message: %s: %.200s", type(exc).__name__, exc)


class Channel(redis_transport.Channel):
    _sync_client: Any = None

    def _create_client(self, asynchronous: bool = False) -> Any:
        if self.connection.client is None:
            raise RedisConnectionError("the broker connection was closed")
        if asynchronous:
            return super()._create_client(asynchronous=True)  # type: ignore[no-untyped-call]
        pool = self.pool
        client = self._sync_client
        if client is None or client.connection_pool is not pool:
            client = self._sync_client = super()._create_client(asynchronous=False)  # type: ignore[no-untyped-call]
        return client

    def basic_consume(self, queue: Any, no_ack: Any, callback: Any, consumer_tag: Any, **options: Any) -> Any:
        """A frame that decodes as an envelope but that its consumer cannot
        make a task of (a body that is not ``[args, kwargs, options]`` for one
        of Celery's own tasks, a header it cannot read) raises out of the
        consumer's callback after the message was counted unacknowledged: it
        is dropped as above and rejected too, or it held a prefetch slot for
        good, and a few of them left the worker taking no message at all."""

        def taken(message: Any) -> Any:
            try:
                return callback(message)
            except MALFORMED as exc:
                _dropped(exc)
                if not no_ack and not message.acknowledged:
                    message.reject(requeue=False)
                return None

        return super().basic_consume(queue, no_ack, taken, consumer_tag, **options)  # type: ignore[no-untyped-call]

    def _brpop_read(self, **options: Any) -> bool:
        try:
            return bool(super()._brpop_read(**options))  # type: ignore[no-untyped-call]
        except MALFORMED as exc:
            _dropped(exc)
            return True  # a frame was consumed: keep polling

    def _get(self, queue: Any, timeout: Any = None) -> Any:
        try:
            return super()._get(queue)  # type: ignore[no-untyped-call]
        except MALFORMED as exc:
            _dropped(exc)
            raise Empty() from None


class Transport(redis_transport.Transport):
    Channel = Channel
