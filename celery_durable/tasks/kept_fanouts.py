"""The fan-out thunks a worker process keeps, by run, attempt and fan-out.

A branch task that replayed the main body up to its fan-out leaves the
thunks it built here (``KeptFanout``); a later branch task of the same
attempt and fan-out in this process — a branch woken by its call's answer,
say — runs its own thunk from them instead of replaying the body again.

A cache, and nothing depends on it: a branch task that finds nothing here
replays, as it always could. Keyed by epoch, so a new attempt never runs an
older attempt's thunks; bounded (``parked_executions`` fan-outs, 0 keeps
none), each kept at most ``idle_seconds`` since it was last used, the least
recently used let go first.
"""

from __future__ import annotations

import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable

from celery_durable.workflows.branch_work import KeptFanout

Key = tuple[str, int, str]


class KeptFanouts:
    """A bounded, per-process map of (run id, epoch, fan-out call id) -> its kept thunks."""

    def __init__(self, capacity: int, idle_seconds: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.capacity = capacity
        self.idle_seconds = idle_seconds
        self._clock = clock
        self.used = 0
        """Branch tasks that ran from kept thunks instead of replaying."""
        self._fanouts: OrderedDict[Key, tuple[float, KeptFanout]] = OrderedDict()
        self._lock = threading.Lock()
        os.register_at_fork(after_in_child=self._after_fork)

    def _after_fork(self) -> None:
        self._fanouts.clear()
        self._lock = threading.Lock()

    @property
    def enabled(self) -> bool:
        return self.capacity > 0

    def __len__(self) -> int:
        return len(self._fanouts)

    def keep(self, run_id: str, epoch: int, fanout: KeptFanout) -> None:
        if not self.enabled:
            return
        with self._lock:
            self._touch((run_id, epoch, fanout.call), fanout)
            self._expire()

    def get(self, run_id: str, epoch: int, call: str) -> KeptFanout | None:
        with self._lock:
            self._expire()
            entry = self._fanouts.get((run_id, epoch, call))
            if entry is None:
                return None
            self._touch((run_id, epoch, call), entry[1])
            self.used += 1
            return entry[1]

    def forget(self, run_id: str, epoch: int, call: str) -> None:
        """Let go of a fan-out no later branch task will need (all its branches are in)."""
        with self._lock:
            self._fanouts.pop((run_id, epoch, call), None)

    def _touch(self, key: Key, fanout: KeptFanout) -> None:
        """(Under the lock) used now: the most recently used."""
        self._fanouts[key] = (self._clock(), fanout)
        self._fanouts.move_to_end(key)

    def clear(self) -> None:
        with self._lock:
            self._fanouts.clear()

    def _expire(self) -> None:
        """Drop (under the lock) what is over the bound or unused too long, least recently used first."""
        deadline = self._clock() - self.idle_seconds
        while self._fanouts:
            used_at, _ = next(iter(self._fanouts.values()))
            if len(self._fanouts) <= self.capacity and used_at >= deadline:
                break
            self._fanouts.popitem(last=False)
