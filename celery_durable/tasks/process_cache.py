"""What a worker process keeps in memory between tasks, bounded.

The bodies kept parked at a call (``parked.py``) and the fan-out thunks kept
for later branch tasks (``kept_fanouts.py``) are caches of one kind: nothing
depends on them (the journal is the truth, and a task that finds nothing
replays), so they are bounded instead of exact. At most ``capacity`` entries
(0 keeps none), each at most ``idle_seconds`` since it was last kept or
used, the least recently used let go first.
"""

from __future__ import annotations

import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Generic, TypeVar

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
