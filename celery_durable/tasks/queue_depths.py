"""How many messages wait in each of the engine's queues, asked of the broker.

The recovery sweep asks it twice a second, to know when a queue was last
empty (liveness); the web view's fleet page shows the depths themselves.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from celery_durable.engine import Engine

__all__ = ["BrokerQueues"]


class BrokerQueues:
    """Which of the engine's queues the broker holds no message in, now.

    A passive declare counts a queue's ready messages on RabbitMQ and on
    kombu's Redis transport alike; a queue that does not exist (Redis drops
    an empty list) holds none. RabbitMQ answers that with a 404 and closes
    the channel it came on, so the next question takes a new channel; on
    Redis the channel stays usable and is kept.

    The connection is kept from one call to the next: the sweep asks twice a
    second in every worker, and RabbitMQ pays for each connection opened and
    closed (a handshake, and two lines in its log) far more than for a
    declare. A connection that failed is dropped, and the next call opens one.
    Called from one thread at a time (the sweep's queue watcher).
    """

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._connection: Any = None
        self._channel: Any = None

    def __call__(self) -> list[str]:
        return [queue for queue, count in self.depths().items() if count == 0]

    def depths(self) -> dict[str, int]:
        """How many messages wait (ready, not yet received) in each of the engine's queues."""
        settings = self._engine.settings
        try:
            return {
                queue: self._count(queue)
                for queue in (settings.coordinator_queue, settings.steps_queue, settings.agents_queue)
            }
        except Exception:
            self.close()
            raise

    def _count(self, queue: str) -> int:
        if self._connection is None:
            self._connection = self._engine.celery.connection_for_read()
        if self._channel is None:
            self._channel = self._connection.channel()
        try:
            _, count, _ = self._channel.queue_declare(queue=queue, passive=True)
        except self._connection.channel_errors:
            if self._connection.transport.driver_type == "amqp":
                # RabbitMQ closed the channel with its 404; kombu's Redis
                # transport keeps it (a new one would cost a ping and a pool).
                self._drop_channel()
            return 0  # no such queue: nothing waits in it
        return int(count)

    def _drop_channel(self) -> None:
        channel, self._channel = self._channel, None
        if channel is not None:
            with contextlib.suppress(Exception):
                channel.close()

    def close(self) -> None:
        self._drop_channel()
        connection, self._connection = self._connection, None
        if connection is not None:
            with contextlib.suppress(Exception):
                connection.release()
