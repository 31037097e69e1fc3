"""The fan-out thunks a worker process keeps, by run, attempt and fan-out.

A branch task that replayed the main body up to its fan-out leaves the
thunks it built here (``KeptFanout``); a later branch task of the same
attempt and fan-out in this process — a branch woken by its call's answer,
say — runs its own thunk from them instead of replaying the body again.

A cache (``process_cache.py``): a branch task that finds nothing here
replays, as it always could. Keyed by epoch, so a new attempt never runs an
older attempt's thunks; at most ``parked_executions`` fan-outs.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from celery_durable.tasks.process_cache import ProcessCache
from celery_durable.workflows.branch_work import KeptFanout

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
