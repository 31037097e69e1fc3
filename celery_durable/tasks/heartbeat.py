"""A background thread that keeps a running task's message alive while it works.

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
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
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
    cancel_event: threading.Event
    lost_authority: bool

    def apply_flags(self, flags: Flags) -> None: ...


class Heartbeat:
    """``with Heartbeat(...):`` beats every ``interval`` seconds until the block ends.

    ``attempt`` may be replaced while it runs (a coordinator runs several
    passes, each a new ``Replay``): flags always reach the current one.
    """

    def __init__(
        self,
        store: RunStore,
        attempt: Attempt,
        *,
        token: str,
        interval: float,
        coordinator: bool = False,
        wake: Callable[[str], None] | None = None,
        overdue: Callable[[Flags], None] | None = None,
        grace: float = 0.0,
    ) -> None:
        self.attempt = attempt
        self._store = store
        self._token = token
        self._interval = interval
        self._coordinator = coordinator
        self._wake = wake
        self._overdue = overdue
        self._grace = grace
        self._asked_at: float | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name=f"heartbeat-{attempt.run.run_id[:8]}", daemon=True)

    def __enter__(self) -> Heartbeat:
        self._thread.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._stop.set()
        self._thread.join()

    def _beat(self) -> None:
        while not self._stop.wait(self._interval):
            attempt = self.attempt
            wake = new_task_id() if self._wake is not None else ""
            try:
                flags, woken = self._store.heartbeat(
                    attempt.run.run_id, attempt.epoch, self._token, coordinator=self._coordinator, wake=wake
                )
            except StaleAttemptError:
                # A newer attempt owns the run, or it settled: stop this one at its next call.
                attempt.lost_authority = True
                attempt.cancel_event.set()
                return
            except StorageError as exc:
                logger.warning("heartbeat of run %s failed: %s", attempt.run.run_id, exc)
                continue
            attempt.apply_flags(flags)
            if woken and self._wake is not None:
                self._wake(wake)
            if self._overdue_now(flags):
                return

    def _overdue_now(self, flags: Flags) -> bool:
        """True once the pass has ignored a cancellation or a ceiling for ``grace``."""
        if self._overdue is None or not (flags.cancel or flags.limit):
            return False
        now = time.monotonic()
        if self._asked_at is None:
            self._asked_at = now
            return False
        if now - self._asked_at < self._grace or self._stop.is_set():
            return False
        try:
            self._overdue(flags)
        except Exception:
            logger.exception("run %s: settling an overdue pass failed", self.attempt.run.run_id)
            return False
        return True
