"""One pub/sub subscription per namespace, shared by every watch of an ``AsyncClient``.

A watch with a connection of its own would read every update of its
namespace, keeping its runs' ones. A thousand of them waiting in one event
loop would be a thousand connections, and every run that changes would
wake all thousand to say "not yours": work that grows as the square of the
waiters (measured: a thousand waits settling took over a minute). So an
``AsyncClient`` subscribes once per channel (``WatchHub``), reads each
update once, and hands it only to the watches of that run (``HubWatch``):
what the sync client does per process with a reader thread
(``events.SharedWatches``), done here in the loop that owns the connection.

The wake-up is the sync client's: the namespace's ``events`` channel, the
same ``RunUpdate``s, and the same loop around them (``progress.settling``),
which reads the run after subscribing and again after a quiet while. A
``HubWatch`` is registered while the shared subscription is confirmed, so,
as with ``RunWatch``, a change made after a caller's next read is not missed.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Collection
from typing import Any

import redis.asyncio

from celery_durable.broker.aio_bridge import await_only, in_loop_greenlet
from celery_durable.broker.connection import storage_errors
from celery_durable.broker.events import RunUpdate, RunWatch
from celery_durable.errors import StorageUnavailableError

READ_SLICE = 30.0
"""How long one read of the shared subscription waits for a message before reading again."""


class WatchHub:
    """The shared subscriptions of one client on one event loop, by channel."""

    def __init__(self, client: redis.asyncio.Redis) -> None:
        self._client = client
        self._channels: dict[str, _Channel] = {}

    def watch(self, channel: str, run_ids: Collection[str] | None) -> HubWatch:
        """A watch of ``run_ids`` (None: every run) on ``channel``, once the
        shared subscription is confirmed; from code under ``greenlet_spawn``."""
        shared = self._channels.get(channel)
        if shared is None:
            shared = self._channels[channel] = _Channel(self._client, channel)
        watch = HubWatch(shared, channel, run_ids)
        try:
            await_only(shared.add(watch))
        except BaseException:
            watch.close()
            raise
        return watch

    @property
    def watching(self) -> int:
        """How many watches are registered now (for tests and metrics)."""
        return sum(len(shared.watches) for shared in self._channels.values())


class _Channel:
    """One subscription and its reader task, alive while a watch is registered."""

    def __init__(self, client: redis.asyncio.Redis, channel: str) -> None:
        self._client = client
        self.channel = channel
        self.watches: set[HubWatch] = set()
        self._by_run: dict[str | None, set[HubWatch]] = {}
        self._lock = asyncio.Lock()
        self._reader: asyncio.Task[None] | None = None
        self._pubsub: Any = None

    async def add(self, watch: HubWatch) -> None:
        async with self._lock:
            if self._reader is None or self._reader.done():
                await self._subscribe()
            self.watches.add(watch)
            for run_id in watch.run_ids if watch.run_ids is not None else [None]:
                self._by_run.setdefault(run_id, set()).add(watch)

    async def _subscribe(self) -> None:
        with storage_errors():
            pubsub = self._client.pubsub()
            try:
                await pubsub.subscribe(self.channel)
                # Confirmed before any watch counts on it (RunWatch's promise).
                while (await pubsub.get_message(timeout=10.0) or {}).get("type") != "subscribe":
                    pass
            except BaseException:
                await pubsub.aclose()  # type: ignore[no-untyped-call]
                raise
        self._pubsub = pubsub
        self._reader = asyncio.get_running_loop().create_task(self._read(pubsub))

    async def _read(self, pubsub: Any) -> None:
        try:
            while True:
                # A read with a timeout of its own, as RunWatch.get's: the
                # connection's socket timeout is for commands, not for silence.
                message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=READ_SLICE)
                if message is None or message.get("type") != "message":
                    continue
                update = RunUpdate.parse(message.get("data"))
                if update is None:
                    continue
                for watch in self._by_run.get(update.run_id, set()) | self._by_run.get(None, set()):
                    watch.deliver(update)
        except Exception as exc:  # the connection dropped: every watch hears of it, as RunWatch.get would
            failure = StorageUnavailableError(f"Redis is unavailable: {type(exc).__name__}: {exc}")
            for watch in list(self.watches):
                watch.fail(failure)

    async def remove(self, watch: HubWatch) -> None:
        async with self._lock:
            self.watches.discard(watch)
            for run_id in watch.run_ids if watch.run_ids is not None else [None]:
                group = self._by_run.get(run_id)
                if group is not None:
                    group.discard(watch)
                    if not group:
                        del self._by_run[run_id]
            if self.watches or self._reader is None:
                return
            # The last watch is gone: so is the subscription (a server's clients stay few).
            reader, pubsub, self._reader, self._pubsub = self._reader, self._pubsub, None, None
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await reader
            with contextlib.suppress(Exception):
                await pubsub.aclose()


class HubWatch(RunWatch):
    """A watch of ``WatchHub``: ``get`` waits in its caller's event loop."""

    def __init__(self, shared: _Channel, channel: str, run_ids: Collection[str] | None) -> None:
        super().__init__(shared, channel, run_ids)
        self._wakeup: asyncio.Future[None] | None = None

    def _wake(self) -> None:
        if self._wakeup is not None and not self._wakeup.done():
            self._wakeup.set_result(None)

    def get(self, timeout: float | None = None) -> RunUpdate | None:
        """The next update of a watched run, or None once ``timeout`` seconds passed."""
        if not self._updates and not self._closed.is_set() and self._failure is None:
            # A bare future, woken by deliver/fail/close or the timer: a
            # cancelled caller just cancels it (no wait_for task to unwind).
            loop = asyncio.get_running_loop()
            self._wakeup = wakeup = loop.create_future()
            timer = None if timeout is None else loop.call_later(timeout, _settle, wakeup)
            try:
                await_only(wakeup)
            finally:
                self._wakeup = None
                if timer is not None:
                    timer.cancel()
        return self._next()

    def _let_go(self) -> None:
        if in_loop_greenlet():
            await_only(self._shared.remove(self))
            return
        with contextlib.suppress(RuntimeError):  # no loop running: nothing left to tell
            task = asyncio.get_running_loop().create_task(self._shared.remove(self))
            _removing.add(task)
            task.add_done_callback(_removing.discard)


def _settle(wakeup: asyncio.Future[None]) -> None:
    if not wakeup.done():
        wakeup.set_result(None)


_removing: set[asyncio.Task[None]] = set()
"""Removals scheduled from outside a call, kept until done (the loop holds tasks weakly)."""
