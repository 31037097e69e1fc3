"""Live updates of a namespace's runs: its ``events`` pub/sub channel.

Every script that changes a run announces it in the same script, as
``"<run_id> <change>"`` on the channel of the run's namespace (see keys.py):
``created`` (index_run), ``status`` (activate, finish, resume, halt, cancel),
``progress`` (begin_op wrote records), ``cancel`` (a cancel was requested),
and whatever later scripts add. A watcher subscribes once and learns of
every run's changes without polling each run.

Pub/sub delivers at most once and keeps nothing for an absent subscriber,
so an update says *that* a run changed, never what changed: read the run,
and read it again after a quiet while (``follow_workflow_run_progress`` and
``wait_for_workflow_run`` do both).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Collection, Iterator
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import redis

from celery_durable.broker.connection import RedisClient, storage_errors

SUBSCRIBE_TIMEOUT = 10.0


@dataclass(frozen=True, slots=True)
class RunUpdate:
    """One ``run_updated`` event: ``run_id`` changed; ``change`` says how
    (``created``, ``status``, ``progress``, ``cancel``, ...)."""

    run_id: str
    change: str

    @classmethod
    def parse(cls, data: Any) -> RunUpdate | None:
        text = data.decode("utf-8", "replace") if isinstance(data, bytes) else str(data)
        run_id, _, change = text.partition(" ")
        return cls(run_id, change) if run_id and change else None


class RunWatch:
    """A subscription to one namespace's run updates; close it when done.

    ``get(timeout)`` returns the next update or None; iterating yields updates
    until the watch is closed (from any thread). Use it as a context manager.
    The subscription is confirmed by Redis before the constructor returns, so
    whatever a caller reads after creating the watch cannot miss a change made
    after that read.

    On a Redis Cluster the subscription is held by one node (the one serving
    the channel name's slot): a PUBLISH made by a script on any node reaches
    every node's subscribers over the cluster bus.
    """

    def __init__(self, client: RedisClient, channel: str, run_ids: Collection[str] | None = None) -> None:
        self.channel = channel
        self.run_ids = frozenset(run_ids) if run_ids is not None else None
        self._closed = threading.Event()
        with storage_errors():
            self._pubsub = client.pubsub()  # type: ignore[no-untyped-call]
            try:
                self._pubsub.subscribe(channel)
                self._await_subscription()
            except BaseException:
                self._pubsub.close()
                raise

    def _await_subscription(self) -> None:
        deadline = time.monotonic() + SUBSCRIBE_TIMEOUT
        while time.monotonic() < deadline:
            message = self._pubsub.get_message(timeout=deadline - time.monotonic())
            if message is not None and message.get("type") == "subscribe":
                return
        raise redis.exceptions.TimeoutError(f"no confirmation of the subscription to {self.channel}")

    def get(self, timeout: float | None = None) -> RunUpdate | None:
        """The next update of a watched run, or None once ``timeout`` seconds
        passed (``0``: only what has already arrived)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._closed.is_set():
            # Short slices, so that close() from another thread ends a wait.
            remaining = 0.5 if deadline is None else max(0.0, min(0.5, deadline - time.monotonic()))
            try:
                with storage_errors():
                    message = self._pubsub.get_message(ignore_subscribe_messages=True, timeout=remaining)
            except Exception:
                if self._closed.is_set():
                    return None  # closed under us by another thread
                raise
            if message is not None and message.get("type") == "message":
                update = RunUpdate.parse(message.get("data"))
                if update is not None and (self.run_ids is None or update.run_id in self.run_ids):
                    return update
                continue  # another run's update: look again without giving up the wait
            if deadline is not None and time.monotonic() >= deadline:
                return None
        return None

    def __iter__(self) -> Iterator[RunUpdate]:
        while not self._closed.is_set():
            update = self.get(timeout=None)
            if update is not None:
                yield update

    def close(self) -> None:
        self._closed.set()
        self._pubsub.close()

    @property
    def closed(self) -> bool:
        return self._closed.is_set()

    def __enter__(self) -> RunWatch:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
