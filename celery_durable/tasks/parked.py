"""What a worker process keeps in memory between tasks: the main bodies
parked at a task call (``ParkedRuns``) and the fan-out thunks kept for later
branch tasks (``KeptFanouts``).

Both are caches of one kind (``ProcessCache``): nothing depends on them (the
journal is the truth, and a task that finds nothing replays), so they are
bounded instead of exact. At most ``capacity`` entries (0 keeps none), each
at most ``idle_seconds`` since it was last kept or used, the least recently
used let go first.

A kept body (``workflows/parking.py``) lets the pass that a call's answer
starts go on from the call instead of replaying everything before it. A
body is resumed only when the journal shows it is where the body stopped:

- Same epoch only: a take-over, a resume or a pause starts a new attempt, and
  an older attempt's body is unwound.
- Nothing journaled past its call: a pass that ran elsewhere (another worker
  process got the answer and went on) has made the body's view stale, and it
  is unwound; the run replays, as it would have without the cache.
- Bounded: at most ``capacity`` bodies, each parked at most ``idle_seconds``
  (the lease: a call that takes longer than that is slow enough that a
  replay costs little beside it). The oldest are unwound first.

A branch task that replayed the main body up to its fan-out leaves the
thunks it built in ``KeptFanouts`` (``KeptFanout``); a later branch task of
the same attempt and fan-out in this process — a branch woken by its call's
answer, say — runs its own thunk from them instead of replaying the body
again. Keyed by epoch, so a new attempt never runs an older attempt's
thunks; at most ``parked_executions`` fan-outs.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

from celery_durable.broker.schema import SequenceHistory
from celery_durable.workflows.branch_work import KeptFanout
from celery_durable.workflows.parking import ParkedBody

K = TypeVar("K")
V = TypeVar("V")


class ProcessCache(Generic[K, V]):
    """A bounded, per-process map, least recently used first out. Its
    subclasses say what the entries are and when they are used; every
    access is under ``_lock``."""

    def __init__(self, capacity: int, idle_seconds: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.capacity = capacity
        self.idle_seconds = idle_seconds
        self._clock = clock
        self._entries: OrderedDict[K, tuple[float, V]] = OrderedDict()
        self._lock = threading.Lock()
        # A forked pool child inherits the map, not the threads behind its
        # entries, and the lock maybe held by one of them.
        os.register_at_fork(after_in_child=self._after_fork)

    def _after_fork(self) -> None:
        self._entries.clear()
        self._lock = threading.Lock()

    @property
    def enabled(self) -> bool:
        return self.capacity > 0

    def __len__(self) -> int:
        return len(self._entries)

    def _put(self, key: K, value: V) -> V | None:
        """(Under the lock) keep ``value`` as the most recently used; the value it replaces."""
        previous = self._entries.pop(key, None)
        self._entries[key] = (self._clock(), value)
        return None if previous is None else previous[1]

    def _get(self, key: K) -> V | None:
        """(Under the lock) the value kept under ``key``, left as used as it was."""
        entry = self._entries.get(key)
        return None if entry is None else entry[1]

    def _pop(self, key: K) -> V | None:
        entry = self._entries.pop(key, None)
        return None if entry is None else entry[1]

    def _drain(self) -> list[V]:
        """(Under the lock) let go of every entry."""
        values = [value for _, value in self._entries.values()]
        self._entries.clear()
        return values

    def _expired(self) -> list[V]:
        """Remove (under the lock) what is over the bound or unused too long, least recently used first."""
        gone: list[V] = []
        deadline = self._clock() - self.idle_seconds
        while self._entries:
            key, (used_at, value) = next(iter(self._entries.items()))
            if len(self._entries) <= self.capacity and used_at >= deadline:
                break
            del self._entries[key]
            gone.append(value)
        return gone


class ParkedRuns(ProcessCache[str, tuple[int, ParkedBody]]):
    """A bounded, per-process map of run id -> (epoch, the body kept parked for it)."""

    def __init__(self, capacity: int, idle_seconds: float) -> None:
        super().__init__(capacity, idle_seconds)
        self.resumed = 0
        """Passes that went on from a kept body instead of replaying."""
        self.taken = 0
        """Passes whose lock the script journaling a call's answer took
        (``Where.TAKE``): what the sweep of the test fleet's mechanisms checks ran."""
        self._passes: dict[str, threading.Event] = {}
        """run id -> set when the pass running in this process for it lets go of its lock."""

    def _after_fork(self) -> None:
        super()._after_fork()
        self._passes.clear()

    def keep(self, run_id: str, epoch: int, body: ParkedBody) -> None:
        """Keep a body that parked; unwind whatever it displaces."""
        with self._lock:
            previous = self._put(run_id, (epoch, body))
            displaced = _bodies(self._expired()) + ([previous[1]] if previous and previous[1] is not body else [])
        for old in displaced:
            old.evict()

    def peek(self, run_id: str, epoch: int, workflow: str) -> ParkedBody | None:
        """The body kept for this attempt of a run of ``workflow``, left in
        place: the pass about to take it learns its run and call without
        reading them, and has its activation read the journal's tail for
        ``take`` (``RunStore.activate_reading``)."""
        with self._lock:
            entry = self._get(run_id)
        if entry is None or entry[0] != epoch or entry[1].replay.run.workflow != workflow:
            return None
        return entry[1]

    @contextlib.contextmanager
    def holding(self, run_id: str) -> Iterator[None]:
        """A pass of the run holds its lock in this process for the block;
        whoever waits for it (``wait_let_go``) goes on when the block ends."""
        released = threading.Event()
        with self._lock:
            self._passes[run_id] = released
        try:
            yield
        finally:
            with self._lock:
                if self._passes.get(run_id) is released:
                    del self._passes[run_id]
            released.set()

    def count_taken(self) -> None:
        with self._lock:
            self.taken += 1

    def holds(self, run_id: str) -> bool:
        """Whether a pass of the run holds its lock in this process now."""
        with self._lock:
            return run_id in self._passes

    def wait_let_go(self, run_id: str, timeout: float) -> bool:
        """Wait until no pass of the run holds its lock in this process; False
        when one still does after ``timeout``.

        A call's answer can come back while the pass that sent the call still
        holds the lock: the task ran on another thread the moment it was sent,
        before the body parked or the pass released. A wake run then finds the
        lock busy, and sends itself back a lease later while that pass runs
        once more for it. The wake waits for the release instead, which is the
        pass's next step.
        """
        with self._lock:
            holding = self._passes.get(run_id)
        return holding is None or holding.wait(timeout)

    def discard(self, run_id: str, body: ParkedBody) -> None:
        """Unwind ``body``, kept for a run another attempt took over (not a
        body of that newer attempt, kept since)."""
        with self._lock:
            entry = self._get(run_id)
            if entry is None or entry[1] is not body:
                return
            self._pop(run_id)
        body.evict()

    def take(
        self, run_id: str, epoch: int, tail: tuple[str, SequenceHistory] | None = None
    ) -> tuple[ParkedBody, str | None] | None:
        """The body kept for this attempt, with its call's journaled answer
        (None: not answered yet), if the journal shows nothing past its call;
        else None, and a stale body is unwound. ``tail`` is (sequence, what it
        holds from some index on) when the caller read that already (used only
        if it starts at the body's call: another body may have been kept since)."""
        with self._lock:
            entry = self._pop(run_id)
            expired = _bodies(self._expired())
        for old in expired:
            old.evict()
        if entry is None:
            return None
        kept_epoch, body = entry
        try:
            current, answer = _where_it_stopped(body, tail) if kept_epoch == epoch else (False, None)
        except BaseException:
            body.evict()
            raise
        if not current:
            body.evict()
            return None
        with self._lock:
            self.resumed += 1
        return body, answer

    def clear(self) -> None:
        """Unwind every kept body (a worker shutting down, a test ending)."""
        with self._lock:
            bodies = _bodies(self._drain())
        for body in bodies:
            body.evict()


def _bodies(entries: list[tuple[int, ParkedBody]]) -> list[ParkedBody]:
    return [body for _, body in entries]


def _where_it_stopped(body: ParkedBody, read: tuple[str, SequenceHistory] | None) -> tuple[bool, str | None]:
    """Whether the journal's sequence ends at the body's call, and the call's value."""
    cursor = body.cursor
    if cursor is None:
        return False, None
    if read is not None and read[0] == cursor.seq and read[1].start == cursor.index:
        tail = read[1]
    else:
        tail = body.replay.journal.read_sequence(cursor.seq, start=cursor.index)
    if len(tail.entries) != 1 or tail.entries[0][1] != body.identity:
        return False, None
    cursor.high_water = max(cursor.high_water, tail.high_water)
    return True, tail.entries[0][2]


Key = tuple[str, int, str]


class KeptFanouts(ProcessCache[Key, KeptFanout]):
    """A bounded, per-process map of (run id, epoch, fan-out call id) -> its kept thunks."""

    def __init__(self, capacity: int, idle_seconds: float, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__(capacity, idle_seconds, clock)
        self.used = 0
        """Branch tasks that ran from kept thunks instead of replaying."""

    def keep(self, run_id: str, epoch: int, fanout: KeptFanout) -> None:
        if not self.enabled:
            return
        with self._lock:
            self._put((run_id, epoch, fanout.call), fanout)
            self._expired()

    def get(self, run_id: str, epoch: int, call: str) -> KeptFanout | None:
        with self._lock:
            self._expired()
            fanout = self._get((run_id, epoch, call))
            if fanout is None:
                return None
            self._put((run_id, epoch, call), fanout)
            self.used += 1
            return fanout

    def forget(self, run_id: str, epoch: int, call: str) -> None:
        """Let go of a fan-out no later branch task will need (all its branches are in)."""
        with self._lock:
            self._pop((run_id, epoch, call))

    def clear(self) -> None:
        with self._lock:
            self._drain()
