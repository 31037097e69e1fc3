"""The main bodies a worker process keeps parked at a task call, by run.

A kept body (``workflows/parking.py``) lets the pass that a call's answer
starts go on from the call instead of replaying everything before it. It is
a cache, and nothing depends on it: the journal is the truth, and a body is
resumed only when the journal shows it is where the body stopped.

- Same epoch only: a take-over, a resume or a pause starts a new attempt, and
  an older attempt's body is unwound.
- Nothing journaled past its call: a pass that ran elsewhere (another worker
  process got the answer and went on) has made the body's view stale, and it
  is unwound; the run replays, as it would have without the cache.
- Bounded (``process_cache.py``): at most ``capacity`` bodies, each parked
  at most ``idle_seconds`` (the lease: a call that takes longer than that is
  slow enough that a replay costs little beside it). The oldest are unwound
  first.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

from celery_durable.broker.schema import SequenceHistory
from celery_durable.tasks.process_cache import ProcessCache
from celery_durable.workflows.parking import ParkedBody


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
