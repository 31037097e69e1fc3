"""A step the main body holds back is journaled within a bound, whatever the body does next.

A pass's main body holds each step's write back to travel with its next call
(``Replay.holds_steps``): one script a step instead of two. Between the two
the step has run and its result is in the body's hands, but not in the
journal: a worker that dies then runs it again (SPEC §8 allows it: at least
once). That window must stay as short as the gap between two calls usually
is, not as long as the body's own code after the step: a body that computes,
or waits on something that is not a call, after booking the hotel must not
book it again when its worker dies meanwhile. So a held step is journaled by
itself once it has been held ``Port.held_step_seconds``, by one thread per
process that looks every ``TICK_SECONDS`` at the executions that hold one
(``watch``). Watching costs an execution one append; the thread's ticks cost
the same however many runs a second the process serves.

Written by hand: nothing in the standard library calls back many
executions on one thread at their own times without a thread or a wake-up
per call (``threading.Timer``, ``sched``).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable

logger = logging.getLogger(__name__)

TICK_SECONDS = 0.1
"""How often the thread looks: a held step is journaled at most this long after its time."""

Look = Callable[[], bool]
"""An execution's look at the step it holds: True while it must be looked at again."""


class _Watcher:
    def __init__(self) -> None:
        self._reset()
        # A prefork child starts afresh: the parent's thread is not in it, and
        # its lock may have been held by that thread at the fork.
        os.register_at_fork(after_in_child=self._reset)

    def _reset(self) -> None:
        self._lock = threading.Lock()
        self._looks: list[Look] = []
        self._pid = 0
        """The process whose thread looks: a forked child starts its own."""

    def watch(self, look: Look) -> None:
        with self._lock:
            self._looks.append(look)
            if self._pid != os.getpid():
                self._pid = os.getpid()
                threading.Thread(target=self._serve, name="celery-durable-held-steps", daemon=True).start()

    def _serve(self) -> None:
        while True:
            time.sleep(TICK_SECONDS)  # a period, not a synchronisation: nothing to wait on but time
            with self._lock:
                looks, self._looks = self._looks, []
            again = [look for look in looks if self._looked(look)]
            if again:
                with self._lock:
                    self._looks += again

    @staticmethod
    def _looked(look: Look) -> bool:
        try:
            return look()
        except Exception:  # one execution's trouble is its own; the thread serves the others
            logger.exception("journaling a held-back step failed")
            return False


watch = _Watcher().watch
