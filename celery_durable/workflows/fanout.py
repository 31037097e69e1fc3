"""Fan-out: ``ctx.parallel`` and ``ctx.pipeline``, across the fleet.

In the coordinator's main body a fan-out journals its op, sends its
unfinished branches to the steps queue as Celery tasks and *suspends* the
pass; the last branch to finish wakes the coordinator, whose next pass
replays up to the fan-out and finds every outcome journaled. One narrow
enough to start as a single task runs in the pass itself, handing slow
branches on (``InlineBranches``). A branch task
replays the main body (all journal hits) up to its fan-out and runs only its
own thunks (``BranchTarget``); fan-outs nested inside a branch run on that
worker, in threads. A branch's outcome is its result, ``None`` for an
ordinary exception, or a fatal failure that aborts the whole call.
"""

from __future__ import annotations

import collections
import contextlib
import contextvars
import functools
import itertools
import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from celery_durable.broker import schema
from celery_durable.broker.journal import (
    Began,
    BeginCall,
    BranchStart,
    Conflict,
    Dispatch,
    HeldBranch,
    Journal,
    PendingCommit,
    Winner,
)
from celery_durable.broker.schema import Identity, Outcome, describe
from celery_durable.errors import (
    FATAL_ERRORS,
    NonDeterminismError,
    StaleAttemptError,
    StorageUnavailableError,
    WorkflowCancelled,
)
from celery_durable.workflows import jsonvalue
from celery_durable.workflows.cursor import Cursor
from celery_durable.workflows.unwind import BranchFinished, BranchRerun, BranchSuspended, unwound

if TYPE_CHECKING:
    from celery_durable.workflows.replay import Replay

logger = logging.getLogger(__name__)

NESTED_FANOUT_THREADS = 32
READ_AHEAD = 64
"""Branch sequences a branch task reads in one round trip, before it runs them."""


BranchSender = Callable[[str, Sequence[int], Callable[[Sequence[str]], None]], Sequence[str]]
"""Publishes branches ``indices`` of ``call`` as tasks, calling the third
argument with their task ids before it publishes any (``Journal.sending``)."""
HeldOutcome = Callable[[int, Outcome, str, PendingCommit], Winner | Conflict | None]
"""Journals a branch's outcome with its held-back last step (``BranchTarget.on_held``)."""
HandOff = Callable[[list[int], int], bool]
"""Sends branches on to the fleet as new branch tasks (at most the given
number of tasks); False when the fleet has no room for them now."""


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

    ``on_outcome`` journals each branch as soon as it finishes, so a task
    that dies halfway loses only the branch it was running. With ``on_held``
    a branch's last step is held back and journaled with its outcome, in one
    write (``Journal.complete_held``): ``Winner`` says another execution
    journaled that step first, and the branch runs again with its value.
    ``work`` hands on those not begun when they run slow (None: the task
    runs them all).
    """

    call: str
    indices: tuple[int, ...]
    on_outcome: Callable[[int, Outcome], None]
    work: BranchWork | None = None
    started: BranchStart | None = None
    """What the task's start read of its branches (``RunStore.branch_start``);
    None: they are read when the fan-out is reached."""
    on_held: HeldOutcome | None = None
    new_wake: Callable[[], str] = lambda: ""
    """A task id for the coordinator message a carried completion may need (``Carrier``)."""
    send_wake: Callable[[str], None] = lambda _task_id: None
    """Sends that message, once ``Journal.complete_begin`` said to."""


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
    execution (``context.lent``). The main body's replay up to the fan-out is
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
    keep: Callable[[KeptFanout], None] = lambda _kept: None
    """Keeps the thunks while the pass runs them, for branch tasks that run
    them later in this process: a branch woken by its call's answer, say."""
    forget: Callable[[str], None] = lambda _call: None
    """Lets go of them once every branch is in."""


class Carrier:
    """The completion of the branch an execution ran last, held back to travel
    with the first write of the next branch it runs (``Journal.complete_begin``).

    Quick branches run one after another (a branch task's, or a pass's
    ``InlineBranches``) then cost one script each: the next branch's first
    begin carries the last one's held step and outcome. A completion is held
    only when another branch follows in the same thread, and never a fatal
    one (that wakes the coordinator at once); what is still held when that
    branch makes no write first goes alone, as before (``on_held``). Holding
    it is safe as holding a step is: an execution that dies with a completion
    held lost only that branch's write, and the branch runs again.
    """

    def __init__(self, call: str, on_held: HeldOutcome, new_wake: Callable[[], str], send_wake: Callable[[str], None]):
        self._call = call
        self._on_held = on_held
        self._new_wake = new_wake
        self._send_wake = send_wake
        self._held: tuple[HeldBranch, Outcome, Callable[[], Any]] | None = None
        self.lost: list[tuple[int, Callable[[], Any]]] = []
        """Branches whose held step another execution journaled first (or
        whose place holds another op): nothing of them was written, and they
        run again, on the journaled value (or into the conflict)."""

    @property
    def holds(self) -> bool:
        return self._held is not None

    def hold(self, index: int, outcome: Outcome, seq: str, step: PendingCommit, fn: Callable[[], Any]) -> None:
        self.flush()
        held = HeldBranch(self._call, index, outcome.encode(), seq, step, self._new_wake())
        self._held = (held, outcome, fn)

    def begin_with(self, journal: Journal, seq: str, call: BeginCall) -> Began:
        """``Journal.begin`` of ``call``, carrying the held completion."""
        assert self._held is not None
        held, _, fn = self._held
        self._held = None
        result = journal.complete_begin(seq, held, call)
        if isinstance(result, Winner | Conflict):
            self.lost.append((held.branch, fn))
            return journal.begin(seq, call)
        if result.woke:
            self._send_wake(held.wake)
        return result

    def flush(self) -> None:
        """Journal the held completion on its own."""
        if self._held is None:
            return
        held, outcome, fn = self._held
        self._held = None
        if self._on_held(held.branch, outcome, held.seq, held.step) is not None:
            self.lost.append((held.branch, fn))


class FanoutOps:
    """``ctx.parallel`` and ``ctx.pipeline`` of one execution."""

    def __init__(self, replay: Replay) -> None:
        self._replay = replay

    def parallel(self, thunks: Iterable[Callable[[], Any]]) -> list[Any]:
        items = self._items(thunks, "parallel", "thunks")
        for index, thunk in enumerate(items):
            if not callable(thunk):
                raise ValueError(f"parallel thunk {index} is not callable: {type(thunk).__name__}")
        return self._fanout("p", list(items))

    def pipeline(self, items: Iterable[Any], stages: Sequence[Callable[[Any, Any, int], Any]]) -> list[Any]:
        values = self._items(items, "pipeline", "items")
        for index, stage in enumerate(stages):
            if not callable(stage):
                raise ValueError(f"pipeline stage {index} is not callable: {type(stage).__name__}")

        def through_stages(item: Any, index: int) -> Any:
            previous = item
            for stage in stages:
                previous = stage(previous, item, index)
            return previous

        return self._fanout("l", [functools.partial(through_stages, item, i) for i, item in enumerate(values)])

    def _items(self, items: Iterable[Any], name: str, noun: str) -> list[Any]:
        if isinstance(items, str | bytes | dict) or not isinstance(items, Iterable):
            raise ValueError(f"{name} takes a list of {noun}, got {type(items).__name__}")
        values = list(items)
        limit = self._replay.max_fanout
        if len(values) > limit:
            raise ValueError(f"{name} accepts at most {limit} {noun} (settings.max_fanout), got {len(values)}")
        return values

    def _fanout(self, kind: str, branches: list[Callable[[], Any]]) -> list[Any]:
        replay = self._replay
        cursor = replay.current()
        replay.check_cancelled()
        identity = Identity.fanout(kind, len(branches))
        journaled, _ = replay.expect(cursor, identity)
        call = schema.call_id(cursor.seq, cursor.index)
        target = replay.target
        if target is not None and target.call == call:
            if cursor.is_main and replay.keep_fanout is not None:
                replay.keep_fanout(
                    KeptFanout(replay, call, identity, branches, cursor.seq, cursor.index, cursor.phase_id)
                )
            self._run_target(cursor, call, identity, branches)
        if not cursor.writes:
            results = self._collect(call, len(branches))
            if results is None:
                raise StaleAttemptError(f"Run {replay.run.run_id}: {describe(identity)} {call} is not finished yet")
            cursor.advance()
            return results
        replay.flush(cursor)
        if journaled:
            results = self._collect(call, len(branches))
            if results is not None:
                cursor.advance()
                return results
        else:
            replay.check_pause(cursor)
        result = replay.journal.dispatch(
            cursor.seq, cursor.index, identity, len(branches), replay.token, cursor.position()
        )
        if isinstance(result, Conflict):
            replay.conflict(cursor, result, identity)
        if result.cut:
            cursor.cut_here()
        results = None
        if cursor.is_main and replay.send_branches is not None:
            results = self._dispatched(cursor, call, identity, branches, result)
        else:
            self._run_locally(call, cursor, branches)
        if results is None:
            results = self._collect(call, len(branches))
        if results is None:
            raise StaleAttemptError(f"Run {replay.run.run_id}: branches of {call} did not all finish")
        cursor.advance()
        return results

    def _dispatched(
        self, cursor: Cursor, call: str, identity: str, branches: list[Callable[[], Any]], result: Dispatch
    ) -> list[Any] | None:
        """In a coordinator pass: run or send the branches the dispatch left;
        the results when this pass has them all, else it suspends until the
        outcomes still to come wake the next (None: nothing was left)."""
        replay = self._replay
        if result.pending and result.in_flight <= 1:
            # No branch runs or waits in a queue: those left wait for the
            # outside world (a timer, a signal, a task). A pause asked for
            # settles the run now instead of waiting with them.
            replay.check_pause(cursor)
        if result.indices and self._runs_inline(result.indices):
            results = self._run_inline(cursor, call, identity, branches, result.indices)
            if results is not None:
                return results
        elif result.indices:
            self._send(call, result.indices)
            replay.journal.mark_sent(call)
        if result.pending or result.indices:
            raise replay.suspend()
        return None

    def run_kept(self, kept: KeptFanout) -> None:
        """In a branch task: run the target's branches from thunks a replay of
        this attempt built before, without replaying the main body."""
        from celery_durable.workflows.context import lent

        replay = self._replay
        parent = Cursor(seq=kept.seq, history=[], high_water=0, writes=False, phase_id=kept.phase_id, index=kept.index)
        with lent(kept.home, replay):
            replay.run_in(parent, lambda: self._run_target(parent, kept.call, kept.identity, kept.branches))

    def _run_target(self, cursor: Cursor, call: str, identity: str, branches: list[Callable[[], Any]]) -> None:
        """In a branch task: run the target's branches that have no live outcome yet."""
        replay = self._replay
        target = replay.target
        assert target is not None
        for index in target.indices:
            if index >= len(branches):
                raise replay.nondeterminism(cursor, f"branch {index} of {describe(identity)} does not exist")
        started = target.started
        if started is not None:
            raws = started.outcomes
        else:
            raws = replay.journal.branch_outcomes(call, len(branches), only=target.indices)
        done = {j for j, raw in zip(target.indices, raws, strict=True) if self._is_done(raw)}
        work = target.work or BranchWork()
        # A redelivered task: branches journaled already, or handed on to others.
        given: set[int] = set()
        if work.can_hand_off:
            given = set(started.handed_off if started is not None else replay.journal.handed_off(call, work.giver))
        work.start([j for j in target.indices if j not in given and j not in done])
        on_held = target.on_held
        carrier = Carrier(call, on_held, target.new_wake, target.send_wake) if on_held is not None else None
        try:
            self._run_work(cursor, branches, work, target.on_outcome, on_held, carrier)
        finally:
            work.close()
        replay.unwinding = BranchFinished()
        raise replay.unwinding

    def _run_work(
        self,
        parent: Cursor,
        branches: list[Callable[[], Any]],
        work: BranchWork,
        on_outcome: Callable[[int, Outcome], None],
        on_held: HeldOutcome | None,
        carrier: Carrier | None,
    ) -> None:
        """Run the branches ``work`` gives, one after another, each
        completion carried by the next branch's first write when it can be."""
        try:
            while (branch := work.take()) is not None:
                self._read_ahead(parent, branch, work)
                self._run_journaled(parent, branches[branch], branch, on_outcome, on_held, carrier, work)
        except BaseException:
            if carrier is not None:
                # What ran is journaled all the same, as it was before it was
                # held: an execution that fails the same way each time still
                # gets one branch further each time.
                with contextlib.suppress(Exception):
                    carrier.flush()
            raise
        if carrier is None:
            return
        carrier.flush()
        self._run_lost(parent, carrier, on_outcome, on_held)

    def _run_lost(
        self,
        parent: Cursor,
        carrier: Carrier,
        on_outcome: Callable[[int, Outcome], None],
        on_held: HeldOutcome | None,
    ) -> None:
        """Run again the branches whose carried completion was not written."""
        while carrier.lost:
            index, fn = carrier.lost.pop(0)
            self._run_journaled(parent, fn, index, on_outcome, on_held)

    def _run_journaled(
        self,
        parent: Cursor,
        fn: Callable[[], Any],
        index: int,
        on_outcome: Callable[[int, Outcome], None],
        on_held: HeldOutcome | None,
        carrier: Carrier | None = None,
        work: BranchWork | None = None,
    ) -> None:
        """Run one branch and journal its outcome, its last step with it when
        steps are held back (``on_held``); with a ``carrier``, hold both for
        the next branch ``work`` gives to carry."""
        replay = self._replay
        while True:
            try:
                outcome, cursor = self._run_in_branch(
                    parent, fn, index, hold_last=on_held is not None, carrier=carrier
                )
            except BranchSuspended as waiting:
                unwound(waiting)
                return  # waits for something whose completion sends this branch again
            except BranchRerun:
                continue  # a held step lost its first write: its value is journaled now
            held = cursor.pending
            if carrier is not None and carrier.lost:
                # Written before this branch's own completion, which may end the task's message.
                self._run_lost(parent, carrier, on_outcome, on_held)
            if held is None or on_held is None:
                on_outcome(index, outcome)
                return
            cursor.pending = None
            if carrier is not None and work is not None and outcome.kind != "f" and work.upcoming(1):
                carrier.hold(index, outcome, cursor.seq, held, fn)
                return
            found = on_held(index, outcome, cursor.seq, held)
            if isinstance(found, Winner):
                continue  # the journal's value, not this run's, is the step's result: run the branch on it
            if isinstance(found, Conflict):
                detail = f"expected {describe(found.journaled)}, got {describe(held.identity)}"
                error = replay.nondeterminism(cursor, detail, index=held.index)
                on_outcome(index, schema.failure_outcome(replay.epoch, error, fatal=True))
            return

    def _runs_inline(self, indices: Sequence[int]) -> bool:
        inline = self._replay.inline
        return inline is not None and len(indices) <= inline.widest

    def _run_inline(
        self, cursor: Cursor, call: str, identity: str, branches: list[Callable[[], Any]], indices: Sequence[int]
    ) -> list[Any] | None:
        """Run the branches a dispatch left to send in this pass (``InlineBranches``);
        their results, or None when some wait or were handed on: their
        outcomes wake the next pass, as those of sent branches do."""
        replay = self._replay
        inline = replay.inline
        assert inline is not None
        journal = replay.journal

        def hand_off(given: list[int], _tasks: int) -> bool:
            self._send(call, given, inline.send)
            return True

        def on_outcome(index: int, outcome: Outcome) -> None:
            journal.complete_branch(call, index, outcome.encode(), wake="")  # this pass collects them

        def on_held(index: int, outcome: Outcome, seq: str, step: PendingCommit) -> Winner | Conflict | None:
            found = journal.complete_held(call, index, outcome.encode(), "", "", seq, step)
            return found if isinstance(found, Winner | Conflict) else None

        inline.keep(KeptFanout(replay, call, identity, branches, cursor.seq, cursor.index, cursor.phase_id))
        work = BranchWork(hand_off=hand_off, after=inline.after)
        work.start(list(indices))
        carrier = Carrier(call, on_held, lambda: "", lambda _task_id: None)  # this pass collects them
        try:
            self._run_work(cursor, branches, work, on_outcome, on_held, carrier)
        finally:
            work.close()
        results = self._collect(call, len(branches))
        if results is None:
            # Handed on or waiting: in flight as sent branches would be, and
            # not to be sent again by a later execution of this attempt.
            journal.mark_sent(call)
        else:
            inline.forget(call)
        return results

    def _read_ahead(self, parent: Cursor, branch: int, work: BranchWork) -> None:
        """Read the sequences of this branch and of the next ones this task
        holds in one round trip, instead of one each."""
        replay = self._replay
        if replay.has_read_ahead(schema.branch_seq(parent.seq, parent.index, branch)):
            return
        upcoming = (branch, *work.upcoming(READ_AHEAD - 1))
        replay.read_ahead([schema.branch_seq(parent.seq, parent.index, j) for j in upcoming])

    def _is_done(self, raw: str | None) -> bool:
        return raw is not None and self._replay.decode(raw).is_live(self._replay.epoch)

    def _send(self, call: str, indices: Sequence[int], sender: BranchSender | None = None) -> Sequence[str]:
        replay = self._replay
        send = sender or replay.send_branches
        assert send is not None
        journal_failed: list[BaseException] = []

        def count(messages: Sequence[str]) -> None:
            try:
                replay.journal.sending(call, messages)
            except BaseException as exc:
                journal_failed.append(exc)
                raise

        try:
            return send(call, indices, count)
        except Exception as exc:  # kombu/amqp connection errors have no common base
            if journal_failed:
                raise  # the journal's own error (an outage, a lost attempt), not the broker's
            error = StorageUnavailableError(f"Broker unavailable while sending branches of {call}: {exc}")
            replay.broken = replay.broken or error
            raise error from None

    def _collect(self, call: str, count: int) -> list[Any] | None:
        """All branch results when every outcome is journaled and live, else None.

        A live fatal outcome is raised at once: fatal errors abort the whole call.
        """
        replay = self._replay
        raws = replay.journal.branch_outcomes(call, count)
        decoded = [replay.decode(raw) if raw is not None else None for raw in raws]
        for outcome in decoded:
            if outcome is not None and outcome.kind == "f" and outcome.is_live(replay.epoch):
                error = outcome.fatal_error()
                if isinstance(error, WorkflowCancelled | NonDeterminismError):
                    replay.fatal = replay.fatal or error
                raise error
        if any(outcome is None or not outcome.is_live(replay.epoch) for outcome in decoded):
            return None
        return [outcome.result for outcome in decoded if outcome is not None]

    def _run_locally(self, call: str, cursor: Cursor, branches: list[Callable[[], Any]]) -> None:
        """Run a nested fan-out's unfinished branches on this worker, in threads."""
        replay = self._replay
        raws = replay.journal.branch_outcomes(call, len(branches))
        todo = [j for j, raw in enumerate(raws) if not self._is_done(raw)]

        def run_one(j: int) -> bool:
            try:
                outcome = self.run_branch(cursor, branches[j], j)
            except BranchSuspended as waiting:
                unwound(waiting)
                return False
            replay.journal.complete_branch(call, j, outcome.encode(), wake="")  # nested: nothing to wake
            return True

        if not todo:
            return
        with ThreadPoolExecutor(max_workers=min(len(todo), NESTED_FANOUT_THREADS)) as pool:
            # Each branch in a copy of this thread's context: kept thunks
            # (context.lent) must forward to this execution there too.
            futures = [pool.submit(contextvars.copy_context().run, run_one, j) for j in todo]
            finished = [future.result() for future in futures]
        if not all(finished):
            # A nested branch waits: so does the branch around it.
            cursor.suspended = BranchSuspended()
            raise cursor.suspended

    def run_branch(self, parent: Cursor, fn: Callable[[], Any], index: int) -> Outcome:
        """Run one branch in its own sequence; its outcome, never an ordinary exception."""
        return self._run_in_branch(parent, fn, index, hold_last=False)[0]

    def _run_in_branch(
        self, parent: Cursor, fn: Callable[[], Any], index: int, *, hold_last: bool, carrier: Carrier | None = None
    ) -> tuple[Outcome, Cursor]:
        """``run_branch``, and the branch's cursor. With ``hold_last`` its steps'
        writes are held back as the main body's are, and the last one is left
        on the cursor (``pending``) for the caller to journal with the outcome,
        unless progress records must be written after it."""
        replay = self._replay
        seq = schema.branch_seq(parent.seq, parent.index, index)
        cursor = replay.open_cursor(seq, writes=True, phase_id=parent.phase_id)
        cursor.holds_steps = hold_last
        cursor.carrier = carrier
        call = schema.call_id(parent.seq, parent.index)
        cursor.owner = parent.owner if not parent.is_main else schema.branch_owner(call, index)
        try:
            result = replay.run_in(cursor, fn)
        except (StorageUnavailableError, StaleAttemptError, BranchSuspended, BranchRerun):
            raise  # nothing to record: this execution cannot, or the branch is not done
        except FATAL_ERRORS as exc:
            return schema.failure_outcome(replay.epoch, exc, fatal=True), cursor
        except Exception as exc:
            self._flush_unless_held(cursor)
            return schema.failure_outcome(replay.epoch, exc), cursor
        self._flush_unless_held(cursor)
        try:
            encoded = jsonvalue.encode_payload(result, replay.max_payload_bytes, noun="Branch result")
        except jsonvalue.PayloadError as exc:
            error = TypeError(str(exc)) if exc.reason == "not_json" else ValueError(str(exc))
            return schema.failure_outcome(replay.epoch, error), cursor
        return schema.value_outcome(jsonvalue.loads(encoded)), cursor

    def _flush_unless_held(self, cursor: Cursor) -> None:
        """Write what the branch buffered; a held step with nothing after it
        stays on the cursor, to go with the outcome."""
        if cursor.holds_steps and cursor.pending is not None and not cursor.buffer:
            return
        self._replay.flush(cursor)
