"""Running a fan-out's branches in this execution, each in its own sequence.

Whether a fan-out's branches are sent to the fleet or run here is decided
where the fan-out is dispatched (``fanout``). Those that run here run in one
of two ways:

- *one after another* in this thread (``BranchRunner``): a branch task's own
  branches, reached by replaying the main body up to their fan-out
  (``run_target``) or taken from the thunks this process kept of it
  (``run_kept``), and the narrow fan-out a coordinator pass runs itself
  (``run_inline``). Their steps' writes are held back, one ``Completions``
  owns every branch's completion, and the branches not begun are handed on
  when they run slow (``BranchWork``).
- *in threads* (``run_nested``): a fan-out nested inside a branch, on that
  branch's worker. Its branches write at once, each outcome alone.

A branch's outcome is its result, a failure (``None`` in the results), or a
fatal failure that aborts the whole call; never an ordinary exception.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, NoReturn

from celery_durable.broker import schema
from celery_durable.broker.schema import Outcome, describe
from celery_durable.errors import FATAL_ERRORS, StaleAttemptError, StorageUnavailableError
from celery_durable.workflows import jsonvalue
from celery_durable.workflows.branch_work import BranchWork, HandOff, KeptFanout, lent
from celery_durable.workflows.completion import COLLECTED, Completions
from celery_durable.workflows.cursor import Cursor
from celery_durable.workflows.unwind import BranchRerun, BranchSuspended, unwound

if TYPE_CHECKING:
    from celery_durable.workflows.replay import Replay

NESTED_FANOUT_THREADS = 32
READ_AHEAD = 64
"""Branch sequences a branch task reads in one round trip, before it runs them."""

Thunk = Callable[[], Any]


class BranchRunner:
    """Runs branches of the fan-out at ``parent``, one after another in this thread."""

    def __init__(self, replay: Replay, parent: Cursor, branches: list[Thunk], completions: Completions) -> None:
        self._replay = replay
        self._parent = parent
        self._branches = branches
        self._completions = completions

    def run(self, work: BranchWork, todo: Sequence[int]) -> None:
        """Run branches ``todo`` as ``work`` gives them (it may hand some on),
        each completion carried by the next branch's first write when it can be."""
        work.start(todo)
        try:
            self._run_all(work)
        finally:
            work.close()

    def _run_all(self, work: BranchWork) -> None:
        completions = self._completions
        try:
            while (index := work.take()) is not None:
                self._read_ahead(index, work)
                self._run(index, self._branches[index], work)
        except BaseException:
            # What ran is journaled all the same, as it was before it was
            # held: an execution that fails the same way each time still
            # gets one branch further each time.
            with contextlib.suppress(Exception):
                completions.flush()
            raise
        completions.flush()
        self._run_lost()

    def _run(self, index: int, fn: Thunk, work: BranchWork | None) -> None:
        """Run one branch until its completion is journaled or held back, or
        until it waits. It runs again when a step it held back was not
        written (another execution journaled that step first): its later
        code must see the journaled value. ``work``: whether another branch
        may follow it in this thread, to carry its completion."""
        while True:
            try:
                outcome, cursor = run_in_sequence(self._replay, self._parent, fn, index, self._completions)
            except BranchSuspended as waiting:
                unwound(waiting)
                return  # what it waits for sends this branch again
            except BranchRerun:
                continue  # a step it held back lost its first write
            self._run_lost()  # written before this completion, which may end the task's message
            carry = work is not None and bool(work.upcoming(1))
            if self._completions.finish(index, outcome, cursor.seq, cursor.take_held(), fn, carry=carry):
                return

    def _run_lost(self) -> None:
        """Run again the branches whose completion was not written."""
        for index, fn in self._completions.take_lost():
            self._run(index, fn, None)

    def _read_ahead(self, branch: int, work: BranchWork) -> None:
        """Read the sequences of this branch and of the next ones this thread
        holds in one round trip, instead of one each."""
        replay, parent = self._replay, self._parent
        if replay.has_read_ahead(schema.branch_seq(parent.seq, parent.index, branch)):
            return
        upcoming = (branch, *work.upcoming(READ_AHEAD - 1))
        replay.read_ahead([schema.branch_seq(parent.seq, parent.index, j) for j in upcoming])


def run_in_sequence(
    replay: Replay, parent: Cursor, fn: Thunk, index: int, completions: Completions | None
) -> tuple[Outcome, Cursor]:
    """Run branch ``index`` of the fan-out at ``parent`` in its own sequence:
    its outcome, never an ordinary exception, and its cursor. With
    ``completions`` its steps' writes are held back as the main body's are,
    and the last one is left on the cursor (``held``) for the caller to
    journal with the outcome, unless progress records must be written after it."""
    seq = schema.branch_seq(parent.seq, parent.index, index)
    cursor = replay.open_cursor(seq, writes=True, phase_id=parent.phase_id)
    cursor.completions = completions
    call = schema.call_id(parent.seq, parent.index)
    cursor.owner = parent.owner if not parent.is_main else schema.branch_owner(call, index)
    try:
        with replay.running(cursor):
            result = fn()
    except (StorageUnavailableError, StaleAttemptError, BranchSuspended, BranchRerun):
        raise  # nothing to record: this execution cannot, or the branch is not done
    except FATAL_ERRORS as exc:
        return schema.failure_outcome(replay.epoch, exc, fatal=True), cursor
    except Exception as exc:
        _flush_unless_held(replay, cursor)
        return schema.failure_outcome(replay.epoch, exc), cursor
    _flush_unless_held(replay, cursor)
    try:
        encoded = jsonvalue.encode_payload(result, replay.max_payload_bytes, noun="Branch result")
    except jsonvalue.PayloadError as exc:
        error = TypeError(str(exc)) if exc.reason == "not_json" else ValueError(str(exc))
        return schema.failure_outcome(replay.epoch, error), cursor
    return schema.value_outcome(jsonvalue.loads(encoded)), cursor


def _flush_unless_held(replay: Replay, cursor: Cursor) -> None:
    """Write what the branch buffered; a held step with nothing after it
    stays on the cursor, to go with the outcome."""
    if cursor.completions is not None and cursor.held is not None and not cursor.buffer:
        return
    replay.flush(cursor)


def is_done(replay: Replay, raw: str | None) -> bool:
    """A branch outcome journaled by this attempt (or a value, which every attempt keeps)."""
    return raw is not None and replay.decode(raw).is_live(replay.epoch)


# -- the ways branches come to run here ----------------------------------------------------


def run_target(replay: Replay, cursor: Cursor, identity: str, branches: list[Thunk]) -> NoReturn:
    """In a branch task that reached its fan-out at ``cursor``: run the
    target's branches that have no live outcome yet, then end the replay."""
    target = replay.target
    assert target is not None
    call = target.call
    if cursor.is_main:
        _keep(replay, cursor, call, identity, branches)
    for index in target.indices:
        if index >= len(branches):
            raise replay.nondeterminism(cursor, f"branch {index} of {describe(identity)} does not exist")
    started = target.started
    if started is not None:
        raws = started.outcomes
    else:
        raws = replay.journal.branch_outcomes(call, len(branches), only=target.indices)
    done = {j for j, raw in zip(target.indices, raws, strict=True) if is_done(replay, raw)}
    work = target.work or BranchWork()
    # A redelivered task: branches journaled already, or handed on to others.
    given: set[int] = set()
    if work.can_hand_off:
        given = set(started.handed_off if started is not None else replay.journal.handed_off(call, work.giver))
    todo = [j for j in target.indices if j not in given and j not in done]
    BranchRunner(replay, cursor, branches, Completions(replay.journal, call, target.route)).run(work, todo)
    raise replay.finish_branches()


def run_kept(replay: Replay, kept: KeptFanout) -> None:
    """In a branch task: run the target's branches from thunks a replay of
    this attempt built before, without replaying the main body."""
    parent = Cursor(seq=kept.seq, history=[], high_water=0, writes=False, phase_id=kept.phase_id, index=kept.index)
    with lent(kept.home, replay), replay.running(parent):
        run_target(replay, parent, kept.identity, kept.branches)


def run_inline(
    replay: Replay,
    cursor: Cursor,
    call: str,
    identity: str,
    branches: list[Thunk],
    indices: Sequence[int],
    hand_off: HandOff,
) -> None:
    """In a coordinator pass: run the branches of a narrow fan-out that its
    dispatch left to send, handing on those not begun once one runs slow
    (``InlineBranches``). The pass collects their outcomes: nothing wakes."""
    inline = replay.port.inline
    assert inline is not None
    _keep(replay, cursor, call, identity, branches)
    work = BranchWork(hand_off=hand_off, after=inline.after)
    BranchRunner(replay, cursor, branches, Completions(replay.journal, call, COLLECTED)).run(work, indices)


def _keep(replay: Replay, cursor: Cursor, call: str, identity: str, branches: list[Thunk]) -> None:
    """Keep the thunks of the top-level fan-out at ``cursor``, as this execution built them."""
    replay.port.keep_fanout(KeptFanout.of(replay, cursor, call, identity, branches))


def run_nested(replay: Replay, cursor: Cursor, call: str, branches: list[Thunk]) -> None:
    """Run a nested fan-out's unfinished branches on this worker, in threads;
    the branch around them waits when one of them does."""
    raws = replay.journal.branch_outcomes(call, len(branches))
    todo = [j for j, raw in enumerate(raws) if not is_done(replay, raw)]
    completions = Completions(replay.journal, call, COLLECTED)  # the branch around them collects

    def run_one(j: int) -> bool:
        try:
            outcome, _ = run_in_sequence(replay, cursor, branches[j], j, None)
        except BranchSuspended as waiting:
            unwound(waiting)
            return False
        completions.alone(j, outcome)
        return True

    if not todo:
        return
    with ThreadPoolExecutor(max_workers=min(len(todo), NESTED_FANOUT_THREADS)) as pool:
        # Each branch in a copy of this thread's context: kept thunks
        # (branch_work.lent) must forward to this execution there too.
        futures = [pool.submit(contextvars.copy_context().run, run_one, j) for j in todo]
        finished = [future.result() for future in futures]
    if not all(finished):
        raise replay.suspend_branch(cursor)
