"""Kombu's Redis transport, hardened against frames that are not messages.

A worker's consumer pops each frame off a queue list and decodes it. Kombu
5.7 lets a frame that is not a JSON envelope (``LPUSH durable.steps junk``,
a producer of another library sharing the broker) raise out of its event
loop, and Celery stops the whole worker with "Unrecoverable error". Here
such a frame is logged and dropped instead: it has already left the list,
it carries no task anyone could run, and the worker goes on consuming.
Well-formed envelopes with a body that does not decode, or a content type
other than JSON, never get this far wrong: Celery refuses them itself.
"""

from __future__ import annotations

import logging
from typing import Any

from kombu.transport import redis as redis_transport
from kombu.transport.virtual import Empty

logger = logging.getLogger(__name__)

MALFORMED = (ValueError, TypeError, AttributeError, KeyError)
"""What decoding a frame that is not a kombu envelope raises."""

TRANSPORT = f"{__name__}:Transport"
"""The ``broker_transport`` setting that selects this transport."""


def _dropped(exc: BaseException) -> None:
    logger.error("dropped a broker frame that is not a task message: %s: %.200s", type(exc).__name__, exc)


class Channel(redis_transport.Channel):
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
