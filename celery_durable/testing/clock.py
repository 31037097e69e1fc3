"""Virtual time for in-process runs: a clock a test moves.

A test environment's store tells every script ``VirtualClock.now_ms`` as its
``now`` (active time and so ``timeout_seconds``, liveness, progress times,
whether a timer is due), and replay reads it through its journal
(``Journal.now_ms``: a wait's due time, ``ctx.now()``): ``ctx.sleep(60)``
is due 60 seconds of virtual time after the call, however far the clock has
jumped, and ``ctx.now()`` tells the virtual time.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from celery_durable.broker.connection import now_ms


class VirtualClock:
    """The environment's time: the wall clock plus what ``advance`` added.

    Every stored time of a run reads it (leases, active time and so
    ``timeout_seconds``, progress records, durable timers), so a test moves a
    run past a ceiling or a timer without waiting. Moving it fires the timers
    it passes and drives the runs they wake (``on_advance``).
    """

    def __init__(self, on_advance: Callable[[], None] | None = None) -> None:
        self._offset_ms = 0
        self._lock = threading.Lock()
        self._on_advance = on_advance

    @property
    def offset_ms(self) -> int:
        """How far the virtual time is ahead of the wall clock: the time skipped so far."""
        with self._lock:
            return self._offset_ms

    def now_ms(self) -> int:
        with self._lock:
            return now_ms() + self._offset_ms

    def now(self) -> datetime:
        """The virtual time, an aware UTC datetime."""
        return datetime.fromtimestamp(self.now_ms() / 1000, tz=UTC)

    def advance(self, seconds: float | timedelta) -> None:
        """Move time on by ``seconds`` (or a ``timedelta``); the timers due by then
        fire. Called from inside a step, that step's time counts as active time,
        and the runs it wakes go on once the step's task ends."""
        amount = seconds.total_seconds() if isinstance(seconds, timedelta) else seconds
        if isinstance(amount, bool) or not isinstance(amount, int | float) or not amount >= 0:
            raise ValueError(f"advance takes a number of seconds >= 0 or a timedelta, got {seconds!r}")
        self._move(round(amount * 1000))

    def advance_to(self, at_ms: int) -> None:
        """Move time on to ``at_ms`` (virtual ms since the epoch), if it is not there yet."""
        with self._lock:
            ahead = at_ms - (now_ms() + self._offset_ms)
        self._move(max(ahead, 0))

    def _move(self, ms: int) -> None:
        with self._lock:
            self._offset_ms += ms
        if self._on_advance is not None:
            self._on_advance()
