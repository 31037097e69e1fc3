"""Beats that keep a running task's message alive while it works.

Every beat renews the task's entry in the run's live hash (liveness in
``_prelude.lua``) and returns the run's control flags, which is how a long
step learns of a cancellation: a set cancel flag sets the attempt's cancel
event. Two more duties fall to it because only it keeps running when the
workflow's own code does not return:

- a ceiling newly reached (``timeout_seconds`` of active time) by a task
  other than the coordinator wakes the coordinator, which settles the run;
- a coordinator pass whose code ignores a cancellation or a ceiling for
  longer than ``grace`` (it spins without calling the context) is settled
  from here (``overdue``). The thread that runs it cannot be killed: the
  worker's slot stays taken until that code returns, and the log says so.

One thread per process schedules the beats of every task it runs
(``_Beats``), and a few threads run them: most passes and branch tasks end
long before their first beat is due, and a thread of their own cost each
of them its start and its join — on every call's answer, the most frequent
pass there is. Beats run on a small pool, not on the scheduler, so one
that stalls (a slow Redis node, a publish blocked by the broker) holds up
only itself, not every lease in the process.
"""

from __future__ import annotations

import functools
import heapq
import itertools
import logging
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import KW_ONLY, dataclass, field
from types import TracebackType
from typing import Protocol

from celery_durable.broker import Flags, RunRecord, RunStore
from celery_durable.errors import StaleAttemptError, StorageError
from celery_durable.tasks.app import new_task_id

logger = logging.getLogger(__name__)


class Attempt(Protocol):
    """What a heartbeat needs of the attempt it keeps alive (a Replay, an agent turn)."""

    run: RunRecord
    epoch: int

    def apply_flags(self, flags: Flags) -> None: ...

    def lose_authority(self) -> None:
        """A newer attempt owns the run, or it settled: stop at the next call."""
        ...


@dataclass(eq=False)
class Heartbeat:
    """``with Heartbeat(...):`` beats every ``interval`` seconds until the block ends.

    ``attempt`` may be replaced while it runs (a coordinator runs several
    passes, each a new ``Replay``): flags always reach the current one.
    """

    store: RunStore
    attempt: Attempt
    _: KW_ONLY
    token: str
    """The running task whose entry in the live hash the beats renew."""
    interval: float
    coordinator: bool = False
    wake: Callable[[str], None] | None = None
    """Sends the coordinator a wake (by task id) when a ceiling is newly reached."""
    overdue: Callable[[Flags], bool] | None = None
    """Settles the run of a pass that ignored a cancellation or a ceiling for
    ``grace`` seconds; False when the pass is acting on it (a saga compensating),
    and the grace starts again."""
    grace: float = 0.0
    _asked_at: float | None = field(default=None, init=False)
    _stopped: bool = field(default=False, init=False)
    _beating: threading.Lock = field(default_factory=threading.Lock, init=False)
    """Held while a beat runs: the block does not end in the middle of one."""

    def __enter__(self) -> Heartbeat:
        _BEATS.add(self, time.monotonic() + self.interval)
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        with self._beating:
            self._stopped = True
        # Out of the schedule now, not at its next beat: it holds the attempt
        # (a replay, with the frames of whatever ended it), which would outlive
        # the task by up to an interval.
        _BEATS.remove(self)

    def beat(self) -> bool:
        """One beat, on the process's beat pool; False once it must not beat again."""
        with self._beating:
            if self._stopped:
                return False
            return self._beat_once()

    def _beat_once(self) -> bool:
        attempt = self.attempt
        wake = new_task_id() if self.wake is not None else ""
        try:
            renewal = self.store.heartbeat(
                attempt.run.run_id, attempt.epoch, self.token, coordinator=self.coordinator, wake=wake
            )
        except StaleAttemptError:
            # A newer attempt owns the run, or it settled: stop this one at its next call.
            attempt.lose_authority()
            return False
        except StorageError as exc:
            logger.warning("heartbeat of run %s failed: %s", attempt.run.run_id, exc)
            return True
        attempt.apply_flags(renewal.flags)
        if renewal.wake and self.wake is not None:
            self.wake(wake)
        return not self._overdue_now(renewal.flags)

    def _overdue_now(self, flags: Flags) -> bool:
        """True once the pass has ignored a cancellation or a ceiling for ``grace``."""
        if self.overdue is None or not (flags.cancel or flags.limit):
            return False
        now = time.monotonic()
        if self._asked_at is None:
            self._asked_at = now
            return False
        if now - self._asked_at < self.grace:
            return False
        try:
            settled = self.overdue(flags)
        except Exception:
            logger.exception("run %s: settling an overdue pass failed", self.attempt.run.run_id)
            return False
        if not settled:
            self._asked_at = now
        return settled


BEAT_THREADS = 8
"""Beats that may run at once in a process (each one script; more only while some stall)."""


class _Beats:
    """The process's beat scheduler: every running heartbeat, by when it is due next.

    A heartbeat whose block ended stays in the heap until it comes due, and
    is dropped then. A forked pool child starts threads of its own at its
    first heartbeat: it inherits the heap, not the threads behind it.
    """

    def __init__(self) -> None:
        self._due: list[tuple[float, int, Heartbeat]] = []
        self._order = itertools.count()
        self._changed = threading.Condition()
        self._thread: threading.Thread | None = None
        self._pool: ThreadPoolExecutor | None = None
        os.register_at_fork(after_in_child=self._after_fork)

    def _after_fork(self) -> None:
        self._due = []
        self._changed = threading.Condition()
        self._thread = None
        self._pool = None

    def add(self, heartbeat: Heartbeat, due: float) -> None:
        with self._changed:
            heapq.heappush(self._due, (due, next(self._order), heartbeat))
            if self._thread is None:
                thread = threading.Thread(target=self._run, name="celery-durable-heartbeats", daemon=True)
                thread.start()
                self._thread = thread
            elif self._due[0][2] is heartbeat:
                self._changed.notify()

    def remove(self, heartbeat: Heartbeat) -> None:
        with self._changed:
            kept = [entry for entry in self._due if entry[2] is not heartbeat]
            if len(kept) != len(self._due):
                heapq.heapify(kept)
                self._due = kept

    def _run(self) -> None:
        pool = self._pool = ThreadPoolExecutor(max_workers=BEAT_THREADS, thread_name_prefix="celery-durable-beat")
        while True:
            with self._changed:
                while not self._due or self._due[0][0] > time.monotonic():
                    self._changed.wait(self._due[0][0] - time.monotonic() if self._due else None)
                _, _, heartbeat = heapq.heappop(self._due)
            try:
                beat = pool.submit(heartbeat.beat)
            except RuntimeError:
                return  # the interpreter is exiting: concurrent.futures takes no more work
            beat.add_done_callback(functools.partial(self._beaten, heartbeat))

    def _beaten(self, heartbeat: Heartbeat, done: Future[bool]) -> None:
        try:
            again = done.result()
        except Exception:
            logger.exception("a heartbeat failed; it beats again")
            again = True
        if again:
            self.add(heartbeat, time.monotonic() + heartbeat.interval)


_BEATS = _Beats()
