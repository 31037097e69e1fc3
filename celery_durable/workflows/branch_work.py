"""What an execution holds of a fan-out: the branches it runs, and those it hands on.

A fan-out's branches run in this execution in three cases, each described
by one of the values below: a branch task's own branches (``BranchTarget``),
the narrow fan-out a coordinator pass runs itself (``InlineBranches``), and
a branch task's branches run from thunks this process kept of their fan-out
(``KeptFanout``). Taken one after another, the branches not begun yet are
handed on to the fleet when they turn out slow (``BranchWork``).
"""

from __future__ import annotations

import collections
import contextlib
import contextvars
import itertools
import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from celery_durable.broker.replies.run import BranchStart
from celery_durable.workflows.completion import CompletionRoute

if TYPE_CHECKING:
    from celery_durable.workflows.cursor import Cursor
    from celery_durable.workflows.replay import Replay

logger = logging.getLogger(__name__)

BranchSender = Callable[[str, Sequence[int], Callable[[Sequence[str]], None]], Sequence[str]]
"""Publishes branches ``indices`` of ``call`` as tasks, calling the third
argument with their task ids before it publishes any (``Journal.sending``)."""
HandOff = Callable[[list[int], int], bool]
"""Sends branches on to the fleet as new branch tasks (at most the given
number of tasks); False when the fleet has no room for them now."""


LENT: contextvars.ContextVar[tuple[Replay, Replay] | None] = contextvars.ContextVar(
    "celery_durable_lent_context", default=None
)
"""(home, execution): in this thread, a context made for ``home`` forwards to ``execution``."""


@contextlib.contextmanager
def lent(home: Replay, execution: Replay) -> Iterator[None]:
    """Make the context of ``home`` forward to ``execution`` in this thread.

    A fan-out's thunks close over the context of the execution that built
    them. A worker that kept them (``KeptFanout``) runs a thunk again in a
    later execution, with that execution's journal, fence and flags: inside
    this block, the thunk's ``ctx`` is the new execution's.
    """
    token = LENT.set((home, execution))
    try:
        yield
    finally:
        LENT.reset(token)


class BranchWork:
    """The branches one branch task holds, taken one after another; those not
    begun yet are handed on to the fleet when they turn out slow.

    Quick branches (no-op steps, cache hits) then share one task and one
    replay of the body, where a task each would cost the fleet more than the
    work. Slow ones (a model call, a sleep) still spread over the fleet: a
    watcher thread looks every ``after`` seconds and hands on the rest when
    the branch running has run that long, unless the fleet is busy (its
    steps queue has a backlog: new tasks would only wait in it, and a
    starved thread's slowness is no sign of slow branches). Quick branches
    are never handed on: each new task replays the whole body first.
    """

    def __init__(
        self,
        giver: str = "",
        hand_off: HandOff | None = None,
        after: float = 0.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.giver = giver
        """The task id of the message that holds these branches."""
        self._hand_off = hand_off
        self._after = after
        self._clock = clock
        self._left: collections.deque[int] = collections.deque()
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._current_since = 0.0
        self._started = False
        self._watcher: threading.Thread | None = None

    @property
    def can_hand_off(self) -> bool:
        return self._hand_off is not None and self._after > 0

    def start(self, todo: Sequence[int]) -> None:
        self._started = True
        self._left.extend(todo)
        self._current_since = self._clock()
        if self.can_hand_off and len(self._left) > 1:
            self._watcher = threading.Thread(target=self._watch, name="branch-hand-off", daemon=True)
            self._watcher.start()

    def take(self) -> int | None:
        """The next branch to run (the one before it is done), or None."""
        with self._lock:
            self._current_since = self._clock()
            return self._left.popleft() if self._left else None

    def upcoming(self, count: int) -> list[int]:
        """The next ``count`` branches ``take`` would give, left in place."""
        with self._lock:
            return list(itertools.islice(self._left, count))

    def finishing(self) -> bool:
        """True once ``take`` has nothing more to give: the branch running is
        the last this task journals (a hand-off under way has finished, as
        it holds the lock)."""
        with self._lock:
            return self._started and not self._left

    def close(self) -> None:
        """No more hand-offs; waits for one under way, so the task's message
        ends only once the tasks it handed on are counted in flight."""
        self._closed.set()
        with self._lock:
            self._left.clear()

    def _watch(self) -> None:
        while not self._closed.wait(self._after):
            if self.tick():
                return

    def tick(self) -> bool:
        """Hand on the rest if it is slow; True once nothing is left to hand on."""
        with self._lock:
            if self._closed.is_set() or not self._left:
                return True
            if self._clock() - self._current_since < self._after:
                # Quick branches stay: a new task would replay the whole body
                # (and rebuild every thunk of a wide fan-out) to run them.
                return False
            given = list(self._left)
            assert self._hand_off is not None
            try:
                if not self._hand_off(given, len(given)):  # a slow branch holds the rest back
                    return False  # the fleet is busy: new tasks would only queue; look again later
            except Exception:
                logger.exception("handing on %d branches failed: this task runs them", len(given))
                return True
            self._left.clear()
            return True


@dataclass(frozen=True, slots=True)
class BranchTarget:
    """The thunks a branch task runs: branches ``indices`` of op ``call``.

    Each branch's completion is journaled as soon as it can be (``route``
    says whom it wakes and which message it ends), so a task that dies
    halfway loses only what it was running. ``work`` hands on those not
    begun when they run slow (None: the task runs them all).
    """

    call: str
    indices: tuple[int, ...]
    route: CompletionRoute
    work: BranchWork | None = None
    started: BranchStart | None = None
    """What the task's start read of its branches (``RunStore.branch_start``);
    None: they are read when the fan-out is reached."""


@dataclass(frozen=True, slots=True)
class KeptFanout:
    """A top-level fan-out's thunks, as a branch task's replay built them.

    Every branch task replays the main body up to its fan-out, and that
    replay rebuilds all n thunks. A fan-out whose branches each wait (a task
    call, an agent turn, a timer) is woken once per branch: n replays of size
    n, which made a 4,096-wide fan-out of calls cost 35 ms per branch, most of
    it the collector walking the rebuilt thunks. A worker process keeps the
    thunks its branch task built, and a later branch task of the same attempt
    and fan-out in that process runs its thunks from them (``run_kept``)
    instead of replaying: inside it, the thunks' ``ctx`` forwards to the new
    execution (``lent``). The main body's replay up to the fan-out is
    the same in every execution of one attempt, so its thunks are too.
    """

    home: Replay
    """The execution whose context the thunks close over."""
    call: str
    identity: str
    branches: list[Callable[[], Any]]
    seq: str
    index: int
    phase_id: str

    @classmethod
    def of(
        cls, replay: Replay, cursor: Cursor, call: str, identity: str, branches: list[Callable[[], Any]]
    ) -> KeptFanout:
        """The fan-out at ``cursor``, as ``replay`` built it."""
        return cls(replay, call, identity, branches, cursor.seq, cursor.index, cursor.phase_id)


@dataclass(frozen=True, slots=True)
class InlineBranches:
    """How a coordinator pass runs a narrow fan-out's branches itself.

    A fan-out no wider than ``widest`` starts as one branch task
    (``tasks.sending.first_chunks``), which replays the body up to the
    fan-out, runs the branches one after another and wakes a second pass to
    collect them: two messages, two replays and a dozen round trips more than
    the work itself, for a handful of quick steps. The pass that dispatched
    the fan-out is that task already, with the thunks in hand: it runs the
    branches in place, hands those not begun on to the fleet once one has run
    ``after`` seconds (``BranchWork``, as the task would), and goes on past
    the fan-out when all are in.
    """

    widest: int
    after: float
    send: BranchSender
    """Publishes branches handed on, one task each."""
    forget: Callable[[str], None] = lambda _call: None
    """Lets go of the thunks the pass kept while it ran them
    (``Port.keep_fanout``) once every branch is in."""
