"""One subscription to the namespace's run updates, shared by every open page.

Each browser tab on a runs or run page holds a server-sent event stream; a
Redis pub/sub connection per tab would let a wall of dashboards exhaust the
journal's connections. The hub keeps one ``client.watch_runs()`` in a thread
while anyone listens and wakes each listener whose run changed. A wake-up
is a flag, not a queue: ten progress records in a burst make one re-read,
and a slow listener never makes the hub buffer.

Pub/sub keeps nothing while the hub is disconnected, so when the watch
fails and is opened again every listener is woken to read afresh.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from starlette.concurrency import run_in_threadpool

from celery_durable import Client, StorageUnavailableError

log = logging.getLogger(__name__)

READY_TIMEOUT = 10.0
POLL_SLICE = 0.5
"""How long the hub thread blocks in one read: the bound on noticing that the last listener left."""
RETRY_SECONDS = 2.0


@dataclass(eq=False)
class Listener:
    """One stream's interest: a run (or every run of the namespace) and its wake-up flag."""

    run_id: str | None
    loop: asyncio.AbstractEventLoop
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    async def wait(self, timeout: float) -> bool:
        """True when woken within ``timeout`` seconds; the flag is then cleared."""
        try:
            await asyncio.wait_for(self.changed.wait(), timeout)
        except TimeoutError:
            return False
        self.changed.clear()
        return True

    def wake(self) -> None:
        # Called from the hub thread: the event belongs to the listener's loop.
        with contextlib.suppress(RuntimeError):  # the loop closed under a departing listener
            self.loop.call_soon_threadsafe(self.changed.set)


class RunHub:
    """Fans one namespace watch out to the listeners of this process."""

    def __init__(self, client: Client) -> None:
        self._client = client
        self._lock = threading.Lock()
        self._listeners: set[Listener] = set()
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._stopping = threading.Event()

    @contextlib.asynccontextmanager
    async def listen(self, run_id: str | None = None) -> AsyncIterator[Listener]:
        """A listener that is woken by every later change to ``run_id`` (None: any run).

        It is yielded only once the watch is confirmed by Redis, so a read
        the caller makes next cannot miss a change written after it.
        """
        listener = Listener(run_id, asyncio.get_running_loop())
        with self._lock:
            self._listeners.add(listener)
            if self._thread is None:
                self._ready.clear()
                self._thread = threading.Thread(target=self._run, name="celery-durable-web-hub", daemon=True)
                self._thread.start()
        try:
            if not await run_in_threadpool(self._ready.wait, READY_TIMEOUT):
                raise StorageUnavailableError("The web view could not subscribe to run updates in Redis")
            yield listener
        finally:
            with self._lock:
                self._listeners.discard(listener)

    def close(self) -> None:
        """Stop the hub thread (server shutdown); listeners still open are woken to notice."""
        self._stopping.set()
        with self._lock:
            thread, listeners = self._thread, list(self._listeners)
        for listener in listeners:
            listener.wake()
        if thread is not None:
            thread.join(timeout=POLL_SLICE * 4)

    def _run(self) -> None:
        lost = False
        while True:
            with self._lock:
                # Decided under the lock, so a listener that arrives now either
                # sees this thread gone (and starts another) or is served by it.
                if self._stopping.is_set() or not self._listeners:
                    self._thread = None
                    self._ready.clear()
                    return
            try:
                self._serve_one_watch(after_loss=lost)
                lost = False
            except Exception:
                # Redis restarted or the connection dropped: updates were
                # lost, so everyone reads again once the watch is back.
                self._ready.clear()
                lost = True
                log.warning("Run updates lost their Redis subscription; subscribing again", exc_info=True)
                self._stopping.wait(RETRY_SECONDS)

    def _serve_one_watch(self, *, after_loss: bool) -> None:
        with self._client.watch_runs() as watch:
            self._ready.set()
            if after_loss:
                self._wake_all()  # whatever happened meanwhile went unannounced
            while not self._stopping.is_set():
                update = watch.get(timeout=POLL_SLICE)
                with self._lock:
                    if not self._listeners:
                        self._ready.clear()
                        return
                    listeners = list(self._listeners)
                if update is not None:
                    for listener in listeners:
                        if listener.run_id is None or listener.run_id == update.run_id:
                            listener.wake()

    def _wake_all(self) -> None:
        with self._lock:
            listeners = list(self._listeners)
        for listener in listeners:
            listener.wake()
