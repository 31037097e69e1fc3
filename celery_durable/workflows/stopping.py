"""How an execution stops: ``Replay``'s stop state, and the only code that changes it.

Whatever ends or bends an execution — the run cancelled or paused, a
ceiling reached, a fatal error met, the store failing, the attempt losing
its authority, the pass unwinding to wait, a saga compensating — is kept
here, on the execution itself, and changed only by the methods below,
named for what happened (``lose_authority``, ``break_with``, ``suspend``,
``compensation``...); every other module reads it. No registry outside
the execution holds any of it (a saga's compensations used to be counted in
module-level weak maps), so what a heartbeat or a pass decides from it is
what this execution knows, and it goes when the execution goes.
"""

from __future__ import annotations

import contextlib
import contextvars
import enum
import threading
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

from celery_durable.broker import schema
from celery_durable.broker.journal import Flags, Journal
from celery_durable.broker.schema.run import RunRecord
from celery_durable.errors import EXECUTION_LOST, StaleAttemptError, WorkflowCancelled, WorkflowLimitReached
from celery_durable.workflows.unwind import BranchFinished, BranchSuspended, PauseRequested, Suspend

if TYPE_CHECKING:
    from celery_durable.workflows.cursor import Cursor
    from celery_durable.workflows.parking import ParkedBody

Error = TypeVar("Error", bound=BaseException)
Broken = TypeVar("Broken", bound=Exception)


class Mode(enum.Enum):
    """What an execution is for, fixed when it is made."""

    PASS = "coordinator pass"
    """Runs the main body, which journals: its steps' writes are held back to
    go with its next call, its fan-outs are dispatched (their branches sent,
    or run in the pass when narrow), and a wait ends the pass."""
    BRANCH_TASK = "branch task"
    """Replays the main body without writing (every op a journal hit) up to
    one fan-out, its ``target``, and runs some of that fan-out's branches,
    each in its own sequence."""
    DRY = "replay check"
    """Replays a run writing nothing and running nothing (``dry_replay``)."""


class StopState:
    """What stops one execution (the base of ``Replay``, which sets the
    attributes declared here)."""

    run: RunRecord
    epoch: int
    journal: Journal
    mode: Mode
    parking: ParkedBody | None
    _cursor: contextvars.ContextVar[Cursor]

    def __init__(self) -> None:
        self._cancel = threading.Event()
        self._pause = False
        self._limit = ""
        self._fatal: BaseException | None = None
        self._broken: Exception | None = None
        self._unwinding: BaseException | None = None
        self._rerun = False
        self._compensating = 0
        """Sagas compensating now, in any thread of the execution (``_lock``)."""
        self._compensable = False
        """Whether this execution marked its run compensable (once is enough)."""
        self._lock = threading.Lock()

    @property
    def cancel_event(self) -> threading.Event:
        """Set once the run is cancelled or this attempt lost its authority."""
        return self._cancel

    @property
    def fatal(self) -> BaseException | None:
        """The first fatal error the workflow met; it decides how the run
        settles even when user code swallowed it."""
        return self._fatal

    @property
    def broken(self) -> Exception | None:
        """Why this execution can journal nothing more (``break_with``)."""
        return self._broken

    @property
    def unwinding(self) -> BaseException | None:
        """The engine's own way out under way: ``Suspend``, ``PauseRequested``
        or ``BranchFinished``, raised again at every later op."""
        return self._unwinding

    @property
    def rerun(self) -> bool:
        """A pass that ended because its view of the journal went stale; the
        coordinator runs the next one at once."""
        return self._rerun

    def apply_flags(self, flags: Flags) -> None:
        """The run's control flags came back with a write (or a heartbeat)."""
        if flags.cancel:
            self._cancel.set()
        if flags.pause:
            self._pause = True
        if flags.limit:
            self._limit = flags.limit

    def lose_authority(self) -> None:
        """A newer attempt owns the run, or it settled without this pass: the
        execution stops at its next op, and code waiting on ``cancel_event`` wakes."""
        self.break_with(StaleAttemptError(f"Run {self.run.run_id}: this attempt lost execution authority"))
        self._cancel.set()

    def break_with(self, error: Broken) -> Broken:
        """The store failed, the fence refused a write or what was read is
        corrupt: the first such error is raised at every later op."""
        self._broken = self._broken or error
        return error

    def meet_fatal(self, error: Error) -> Error:
        """The workflow met a fatal error (cancelled, a ceiling, nondeterminism)."""
        self._fatal = self._fatal or error
        return error

    def _guard(self, method: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Every journal call: what loses this execution is kept (``broken``)."""
        try:
            return method(*args, **kwargs)
        except EXECUTION_LOST as exc:
            self.break_with(exc)
            raise

    def cancelled(self) -> bool:
        return self._cancel.is_set()

    def check_cancelled(self) -> None:
        """Run before every op: an unwinding pass or a broken execution makes
        no more calls, even from user ``finally`` blocks."""
        if self._unwinding is not None:
            raise self._unwinding
        cursor = self._cursor.get(None)
        if cursor is not None and cursor.suspended is not None:
            raise cursor.suspended
        if self._broken is not None:
            raise self._broken
        if self._cancel.is_set() and (cursor is None or self._stops_cancelled(cursor)):
            raise self.meet_fatal(WorkflowCancelled(f"Run {self.run.run_id} was cancelled"))
        if self._limit:
            raise self.meet_fatal(WorkflowLimitReached(self._limit))

    def _stops_cancelled(self, cursor: Cursor) -> bool:
        """``Cursor.stops_cancelled``; an op it stepped over is journaled so
        (``Journal.step_over``) before anything is journaled after it."""
        at = cursor.index
        if not cursor.stops_cancelled(self.epoch):
            return False
        if cursor.index != at and cursor.writes and self.mode is Mode.PASS:
            self.apply_flags(self.journal.step_over(cursor.seq, at))
        return True

    def check_pause(self, cursor: Cursor) -> None:
        """Before the main body starts new work: settle as paused if asked to.
        Work already in flight (a fan-out's branches) is waited for, not paused."""
        if self._pause and cursor.is_main and self.mode is Mode.PASS:
            raise self._unwind(PauseRequested())

    def suspend(self) -> Suspend:
        """End this pass: it waits for something that wakes the coordinator."""
        return self._unwind(Suspend())

    def rerun_pass(self) -> Suspend:
        """End this pass, whose view of the journal went stale: the next runs at once."""
        self._rerun = True
        return self.suspend()

    def finish_branches(self) -> BranchFinished:
        """End a branch task's replay: its own branches have outcomes."""
        return self._unwind(BranchFinished())

    def suspend_branch(self, cursor: Cursor) -> BranchSuspended:
        """End one branch that waits; what it waits for sends it again."""
        cursor.suspended = BranchSuspended()
        return cursor.suspended

    def _unwind(self, exc: Error) -> Error:
        self._unwinding = exc
        return exc

    def wait_for_answer(self, cursor: Cursor, identity: str) -> str | None:
        """Wait until the op at the cursor, a task call, is answered. A main
        body a worker may keep parks its thread until a pass resumes it, with
        the journaled outcome or None (woken with no answer); any other
        sequence suspends, as every wait does, and replays when woken."""
        parking = self.parking  # set only in a coordinator pass, whose main cursor writes
        if parking is None or not cursor.is_main:
            self.wait_for_wake(cursor)
        return parking.park(cursor, identity)

    def wait_for_wake(self, cursor: Cursor) -> NoReturn:
        """Suspend the sequence until what it waits for wakes its owner: the
        whole pass for the main body, this branch alone for a branch."""
        if cursor.owner == schema.MAIN:
            raise self.suspend()
        raise self.suspend_branch(cursor)

    # -- sagas (``saga.py``) ---------------------------------------------------------

    @property
    def compensating(self) -> bool:
        """A saga of this execution runs its compensations now: the pass
        honours its cancellation, slowly, and the heartbeat must not settle
        the run from under it."""
        with self._lock:
            return self._compensating > 0

    @contextlib.contextmanager
    def compensation(self, cursor: Cursor, count: int) -> Iterator[None]:
        """A saga's ``count`` compensations run at ``cursor``, one op each:
        its ops are not cancelled, and they end at ``Cursor.compensation_end``."""
        outer_end, cursor.compensation_end = cursor.compensation_end, cursor.index + count - 1
        cursor.compensating += 1
        with self._lock:
            self._compensating += 1
        try:
            yield
        finally:
            cursor.compensation_end = outer_end
            cursor.compensating -= 1
            with self._lock:
                self._compensating -= 1

    def mark_compensable(self, cursor: Cursor) -> None:
        """A saga registered an undo at ``cursor``: mark the run once, so that
        a cancelled pass replays it to where it stands and compensates there."""
        if self.run.compensates or self._compensable:
            return
        if not cursor.writes:
            return  # a branch task's replay of the main body: the pass marked it
        self.apply_flags(self.journal.mark_compensable())
        self._compensable = True
