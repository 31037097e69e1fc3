"""A main body kept alive across passes, parked where it waits for a task call.

Replay makes a pass cost what came before it: a run that makes a thousand
``ctx.call``s in a row replays a thousand calls to make the last one, so its
calls cost grows with the square of their number. Temporal answers this with
a worker-side cache of workflow executions; this is ours, for the one wait
where it pays most: a main body that waits for a call parks its thread
instead of unwinding, and the pass that the call's answer starts in the same
worker process hands it the answer and lets it run on. Nothing of this is
state the run depends on: the journal is written exactly as by a replay, a
body that is not kept (another process got the answer, the cache was full,
the worker restarted) is replayed as always, and a kept body is resumed only
when the journal shows nothing journaled past where it waits (see
``tasks/parked.py``).

The body runs on a thread of its own for its whole life; each pass's thread
waits for it to park or end. A parked body holds no worker slot. Evicting it
resumes it with ``Suspend``, which unwinds it as the end of a pass always
did: it journals nothing more. A body that ends gives its thread back for
the next one (``BODY_THREADS``): what Celery caches per thread is then built
once per thread, not once per run.
"""

from __future__ import annotations

import contextvars
import os
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from celery_durable.workflows.cursor import Cursor

if TYPE_CHECKING:
    from celery_durable.workflows.passes import Settlement
    from celery_durable.workflows.replay import Replay

_EVICT = object()


class BodyThreads:
    """Daemon threads that run kept bodies, each one body at a time, reused.

    Celery keeps the app's result backend per thread and builds it on the
    thread's first ``send_task`` that may want a result (a task call): a
    Redis client, and package metadata read from disk. On a new thread per
    run that was several ms of a worker's CPU per run. Written here because
    ``ThreadPoolExecutor`` joins its threads at interpreter exit, where a
    parked body would hold the exit up; these are daemons, as the body's own
    thread was.
    """

    def __init__(self) -> None:
        self._idle: list[queue.SimpleQueue[Callable[[], None]]] = []
        self._lock = threading.Lock()
        # A forked pool child inherits the list, not the threads behind it.
        os.register_at_fork(after_in_child=self._after_fork)

    def _after_fork(self) -> None:
        self._idle = []
        self._lock = threading.Lock()

    def run(self, work: Callable[[], None]) -> None:
        """Run ``work`` on an idle thread, or on a new one."""
        with self._lock:
            inbox = self._idle.pop() if self._idle else None
        if inbox is None:
            inbox = queue.SimpleQueue()
            threading.Thread(target=self._serve, args=(inbox,), name="durable-body", daemon=True).start()
        inbox.put(work)

    def _serve(self, inbox: queue.SimpleQueue[Callable[[], None]]) -> None:
        while True:
            # A context of its own, as a new thread would have: nothing one
            # body set in a context variable is seen by the next.
            contextvars.Context().run(inbox.get())  # never raises: ParkedBody._run keeps what its body raised
            with self._lock:
                self._idle.append(inbox)


BODY_THREADS = BodyThreads()


@dataclass(frozen=True, slots=True)
class PassEnd:
    """How a pass of a kept body ended: parked, or the body returned or raised."""

    parked: bool
    settlement: Settlement | None = None
    error: BaseException | None = None

    def result(self) -> Settlement | None:
        """The body's settlement (None: it suspended); re-raises what it raised."""
        if self.error is not None:
            raise self.error
        return self.settlement


class ParkedBody:
    """One execution's main body on its own thread, handed from pass to pass."""

    def __init__(self, replay: Replay, body: Callable[[], Settlement | None]) -> None:
        self.replay = replay
        self._body = body
        self._lock = threading.Condition()
        self._end: PassEnd | None = None
        self._answer: object = None
        self._given = False
        self.cursor: Cursor | None = None
        """Where the body waits while parked: the cursor of its call."""
        self.identity = ""
        """The op it waits at."""
        self._started = False
        self._ended = threading.Event()
        replay.parking = self

    def start(self) -> PassEnd:
        """Run the body until it parks or ends."""
        self._started = True
        BODY_THREADS.run(self._run)
        return self._wait()

    def resume(self, answer: str | None) -> PassEnd:
        """Give the parked body what it waited for (None: nothing yet) and
        wait until it parks again or ends."""
        self._give(answer)
        return self._wait()

    def evict(self) -> None:
        """Unwind the parked body; it journals nothing more. Does not wait."""
        self._give(_EVICT)

    def join(self, timeout: float) -> bool:
        """Wait for the body to end; whether it did."""
        return not self._started or self._ended.wait(timeout)

    # -- the body's side ----------------------------------------------------------

    def park(self, cursor: Cursor, identity: str) -> str | None:
        """Called by the body: end the pass, and block until the next pass
        resumes it (with the op's journaled value, or None) or it is evicted."""
        with self._lock:
            self.cursor, self.identity = cursor, identity
            self._end = PassEnd(parked=True)
            self._lock.notify_all()
            while not self._given:
                self._lock.wait()
            self._given = False
            answer, self._answer = self._answer, None
        if answer is _EVICT:
            raise self.replay.suspend()
        assert answer is None or isinstance(answer, str)
        return answer

    def _run(self) -> None:
        try:
            end = PassEnd(parked=False, settlement=self._body())
        except BaseException as exc:  # re-raised in the pass's thread, which handles it as before
            end = PassEnd(parked=False, error=exc)
        finally:
            self.replay.parking = None
        with self._lock:
            self._end = end
            self._lock.notify_all()
        self._ended.set()

    # -- the pass's side ----------------------------------------------------------

    def _give(self, answer: object) -> None:
        with self._lock:
            self._end = None
            self._answer, self._given = answer, True
            self._lock.notify_all()

    def _wait(self) -> PassEnd:
        with self._lock:
            while self._end is None:
                self._lock.wait()
            return self._end
