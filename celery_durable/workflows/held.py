"""A step the main body holds back is journaled within a bound, whatever the body does next.

A pass's main body holds each step's write back to travel with its next call
(``Replay.holds_steps``): one script a step instead of two. Between the two
the step has run and its result is in the body's hands, but not in the
journal: a worker that dies then runs it again (SPEC §8 allows it: at least
once). That window must stay as short as the gap between two calls usually
is, not as long as the body's own code after the step: a body that computes,
or waits on something that is not a call, after booking the hotel must not
book it again when its worker dies meanwhile. So a held step is journaled by
itself once it has been held ``Port.held_step_seconds``: by one thread per
process that wakes only for such steps (``later``), never one per step.

Written by hand: the standard library's ``sched`` runs its events in the
caller's thread, and ``threading.Timer`` is a thread per event.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import os
import threading
import time
from collections.abc import Callable

logger = logging.getLogger(__name__)


class _Later:
    """Calls made on one daemon thread once their time comes, earliest first."""

    def __init__(self) -> None:
        self._order = itertools.count()
        self._reset()
        # A prefork child starts afresh: the parent's thread is not in it, and
        # its lock may have been held by that thread at the fork.
        os.register_at_fork(after_in_child=self._reset)

    def _reset(self) -> None:
        self._due: list[tuple[float, int, Callable[[], None]]] = []
        self._changed = threading.Condition()
        self._pid = 0
        """The process whose thread serves ``_due``."""

    def call(self, delay: float, fn: Callable[[], None]) -> None:
        at = time.monotonic() + delay
        with self._changed:
            if self._pid != os.getpid():
                self._pid = os.getpid()
                self._due.clear()
                threading.Thread(target=self._serve, name="celery-durable-held-steps", daemon=True).start()
            heapq.heappush(self._due, (at, next(self._order), fn))
            if self._due[0][2] is fn:
                self._changed.notify()

    def _serve(self) -> None:
        while True:
            with self._changed:
                while not self._due or self._due[0][0] > time.monotonic():
                    self._changed.wait(None if not self._due else self._due[0][0] - time.monotonic())
                _, _, fn = heapq.heappop(self._due)
            try:
                fn()
            except Exception:  # one execution's trouble is its own; the thread serves the others
                logger.exception("journaling a held-back step failed")


later = _Later().call
