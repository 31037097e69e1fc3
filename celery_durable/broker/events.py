"""Live updates of a namespace's runs: its ``events`` pub/sub channel.

Every script that changes a run announces it in the same script, as
``"<run_id> <change>"`` on the channel of the run's namespace (see keys.py):
``created`` (index_run), ``status`` (activate, finish, resume, halt, cancel:
``"<run_id> status <status>"``, the prelude's ``announce_status``),
``progress`` (begin_op wrote records), ``cancel`` (a cancel was requested),
and whatever later scripts add. A watcher subscribes once and learns of
every run's changes without polling each run.

Pub/sub delivers at most once and keeps nothing for an absent subscriber,
so an update says *that* a run changed, never all of what changed: read the
run, and read it again after a quiet while (``follow_workflow_run_progress``
and ``wait_for_workflow_run`` do both; the wait skips the read of a status
that is not an end).
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections import deque
from collections.abc import Collection, Iterator
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import redis

from celery_durable.broker.connection import RedisClient, storage_errors
from celery_durable.errors import StorageError

SUBSCRIBE_TIMEOUT = 10.0
LINGER_SECONDS = 10.0
"""How long a shared subscription outlives its last watch: a loop of starts
and waits subscribes once, and a process that stops watching lets go of its
connection soon after."""
READ_SLICE = 1.0
"""How long the shared subscription's reader waits for a message before it looks at the time."""


@dataclass(frozen=True, slots=True)
class RunUpdate:
    """One ``run_updated`` event: ``run_id`` changed; ``change`` says how
    (``created``, ``status``, ``progress``, ``cancel``, ...)."""

    run_id: str
    change: str
    status: str | None = None
    """With ``status``: the run's status it changed to (None from a script
    that did not say it)."""

    @classmethod
    def parse(cls, data: Any) -> RunUpdate | None:
        text = data.decode("utf-8", "replace") if isinstance(data, bytes) else str(data)
        run_id, _, rest = text.partition(" ")
        change, _, status = rest.partition(" ")
        return cls(run_id, change, status or None) if run_id and change else None


class RunWatch:
    """A watch of one namespace's run updates; close it when done.

    ``get(timeout)`` returns the next update or None; iterating yields updates
    until the watch is closed (from any thread). Use it as a context manager.
    The subscription it is fed by is confirmed by Redis before the watch is
    made, so whatever a caller reads after creating the watch cannot miss a
    change made after that read.

    A watch has no connection of its own: it shares its subscription
    (``SharedWatches`` for a process's threads, ``aio_watch.WatchHub`` for
    an event loop), whose reader hands it updates (``deliver``) or the
    failure that ended the subscription (``fail``); ``_wake`` rouses a
    ``get`` waiting for either, in a thread or in the loop.

    On a Redis Cluster the subscription is held by one node (the one serving
    the channel name's slot): a PUBLISH made by a script on any node reaches
    every node's subscribers over the cluster bus.
    """

    def __init__(self, shared: Any, channel: str, run_ids: Collection[str] | None) -> None:
        self.channel = channel
        self.run_ids = frozenset(run_ids) if run_ids is not None else None
        self._closed = threading.Event()
        self._shared = shared
        self._updates: deque[RunUpdate] = deque()
        self._failure: StorageError | None = None

    def get(self, timeout: float | None = None) -> RunUpdate | None:
        """The next update of a watched run, or None once ``timeout`` seconds
        passed (``0``: only what has already arrived)."""
        raise NotImplementedError

    def deliver(self, update: RunUpdate) -> None:
        self._updates.append(update)
        self._wake()

    def fail(self, failure: StorageError) -> None:
        self._failure = failure
        self._wake()

    def _wake(self) -> None:
        raise NotImplementedError

    def _let_go(self) -> None:
        """Leave the shared subscription (the watch is closed)."""
        raise NotImplementedError

    def _next(self) -> RunUpdate | None:
        """What a woken ``get`` returns: the failure raised, None once closed or with nothing, else the next update."""
        if self._failure is not None:
            raise self._failure
        if self._closed.is_set() or not self._updates:
            return None
        return self._updates.popleft()

    def __iter__(self) -> Iterator[RunUpdate]:
        while not self._closed.is_set():
            update = self.get(timeout=None)
            if update is not None:
                yield update

    def close(self) -> None:
        if self._closed.is_set():
            return
        self._closed.set()
        self._wake()  # ends a get() waiting elsewhere
        self._let_go()

    @property
    def closed(self) -> bool:
        return self._closed.is_set()

    def __enter__(self) -> RunWatch:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def _subscribed(pubsub: Any, channel: str) -> None:
    """Subscribe ``pubsub`` to ``channel`` and wait for Redis to confirm it
    (closed again if that fails): what is read after this returns cannot
    miss a change made after that read."""
    try:
        pubsub.subscribe(channel)
        deadline = time.monotonic() + SUBSCRIBE_TIMEOUT
        while time.monotonic() < deadline:
            message = pubsub.get_message(timeout=deadline - time.monotonic())
            if message is not None and message.get("type") == "subscribe":
                return
        raise redis.exceptions.TimeoutError(f"no confirmation of the subscription to {channel}")
    except BaseException:
        pubsub.close()
        raise


class SharedWatches:
    """One subscription per channel, shared by every ``RunWatch`` a process
    makes of it (``Client.watch_runs``, so every ``wait_for_workflow_run``).

    A watch of its own would connect, subscribe and wait for the
    confirmation before its first read, then disconnect a connection of the
    pool: about a third of a millisecond of every wait, and a connection per
    waiting thread. Here a reader thread per channel reads each update once
    and hands it to the watches of that run; a watch registered once the
    subscription is confirmed misses no change made after its caller's next
    read, as ``RunWatch`` promises. The subscription ends ``LINGER_SECONDS``
    after its last watch closed, or when its connection fails (every watch's
    ``get`` then raises the ``StorageError``). ``AsyncClient`` has the same for
    an event loop (``broker/aio_watch.py``).
    """

    def __init__(self, client: RedisClient) -> None:
        self._client = client
        self._lock = threading.Lock()
        self._channels: dict[str, _Shared] = {}
        self._pid = os.getpid()

    def watch(self, channel: str, run_ids: Collection[str] | None) -> RunWatch:
        with self._lock:
            if self._pid != os.getpid():
                # A forked child: the parent's readers are not here, and their
                # sockets are the parent's (closing one would end the parent's).
                self._channels, self._pid = {}, os.getpid()
            shared = self._channels.get(channel)
            if shared is None or shared.done:
                with storage_errors():
                    pubsub = self._client.pubsub()  # type: ignore[no-untyped-call]
                    _subscribed(pubsub, channel)
                shared = self._channels[channel] = _Shared(self, pubsub, channel)
            watch = SharedWatch(shared, channel, run_ids)
            shared.watches.add(watch)
            return watch

    def _release(self, watch: SharedWatch) -> None:
        with self._lock:
            shared: _Shared = watch._shared
            shared.watches.discard(watch)
            if not shared.watches:
                shared.idle_since = time.monotonic()


class _Shared:
    """One channel's subscription and its reader thread."""

    def __init__(self, hub: SharedWatches, pubsub: Any, channel: str) -> None:
        self.hub = hub
        self.pubsub = pubsub
        self.channel = channel
        self.watches: set[SharedWatch] = set()
        self.idle_since = time.monotonic()
        self.done = False
        threading.Thread(target=self._read, name=f"celery-durable-watch {channel}", daemon=True).start()

    def _read(self) -> None:
        try:
            while self._reading():
                with storage_errors():
                    message = self.pubsub.get_message(ignore_subscribe_messages=True, timeout=READ_SLICE)
                update = RunUpdate.parse(message.get("data")) if message and message.get("type") == "message" else None
                if update is not None:
                    with self.hub._lock:
                        watches = [w for w in self.watches if w.run_ids is None or update.run_id in w.run_ids]
                    for watch in watches:
                        watch.deliver(update)
        except Exception as exc:  # the connection failed: every watch hears of it, none waits on nothing
            failure = exc if isinstance(exc, StorageError) else StorageError(f"{type(exc).__name__}: {exc}")
            with self.hub._lock:
                self.done = True
                watches = list(self.watches)
            for watch in watches:
                watch.fail(failure)
        finally:
            with self.hub._lock:
                self.done = True
                if self.hub._channels.get(self.channel) is self:
                    del self.hub._channels[self.channel]
            with contextlib.suppress(Exception):  # the connection is going away either way
                self.pubsub.close()

    def _reading(self) -> bool:
        """False once the subscription has outlived its last watch by ``LINGER_SECONDS``."""
        with self.hub._lock:
            if not self.watches and time.monotonic() - self.idle_since > LINGER_SECONDS:
                self.done = True
            return not self.done


class SharedWatch(RunWatch):
    """A watch of ``SharedWatches``: ``get`` waits in its caller's thread."""

    def __init__(self, shared: _Shared, channel: str, run_ids: Collection[str] | None) -> None:
        super().__init__(shared, channel, run_ids)
        self._ready = threading.Condition()

    def _wake(self) -> None:
        with self._ready:  # a get() between its check and its wait holds this: no wake is lost
            self._ready.notify_all()

    def get(self, timeout: float | None = None) -> RunUpdate | None:
        """The next update of a watched run, or None once ``timeout`` seconds passed."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._ready:
            while not self._updates and self._failure is None and not self._closed.is_set():
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return None
                self._ready.wait(remaining)
            return self._next()

    def _let_go(self) -> None:
        self._shared.hub._release(self)
