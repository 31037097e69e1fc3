"""Deterministic replay: the engine behind every ``WorkflowContext`` call.

A run's workflow function is re-executed from the top on every coordinator
pass. Each call it makes (step, fan-out, agent turn, now, uuid4) is an *op*
in a *sequence*: the main body is sequence ``m``; branch ``j`` of the fan-out
that was op ``i`` of sequence ``s`` is sequence ``s.i.j``. An op found in the
journal returns its journaled value; the first op past the journaled history
is new work. Order is checked per sequence, so the order in which branches
finish never matters (the DBOS check/record pair, per sequence).

``Replay`` holds what one execution knows: what it is for (its ``Mode``),
its journal, its cursors, the run's control flags and why it must stop. That
stop state is its base, ``stopping.StopState``, changed there only, by
methods named for what happened (``lose_authority``, ``break_with``,
``suspend``...); other modules read it. It reaches the fleet through one
``Port`` (``workflows/port.py``).
The ops themselves live beside it, one module each: ``steps`` (steps and
replay-safe values), ``fanout`` (parallel and pipeline, whose branches run in
``branches``), ``agent_ops`` (agent turns), ``waits``, ``calls``. Replay
talks to storage only through the ``Journal`` protocol, so a test can drive
it by hand on the real store (``tests/unit``).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, NoReturn

from celery_durable.broker import schema
from celery_durable.broker.journal import (
    Began,
    BeginCall,
    Conflict,
    GuardedJournal,
    Journal,
    LastWrites,
    PendingCommit,
    Recorded,
    Winner,
)
from celery_durable.broker.schema import Outcome, SequenceHistory, describe
from celery_durable.broker.schema.run import RunRecord
from celery_durable.errors import (
    NonDeterminismError,
    StaleAttemptError,
    StorageCorruptError,
    WorkflowDefinitionError,
)
from celery_durable.workflows import held, jsonvalue
from celery_durable.workflows.cursor import Cursor
from celery_durable.workflows.stopping import Mode, StopState
from celery_durable.workflows.unwind import BranchRerun
from celery_durable.workflows.versions import divergence_message

if TYPE_CHECKING:
    from celery_durable.workflows.agent_ops import AgentOps
    from celery_durable.workflows.branch_work import BranchTarget
    from celery_durable.workflows.calls import CallOps
    from celery_durable.workflows.children import ChildOps
    from celery_durable.workflows.definition import Workflow
    from celery_durable.workflows.fanout import FanoutOps
    from celery_durable.workflows.parking import ParkedBody
    from celery_durable.workflows.port import Port
    from celery_durable.workflows.steps import StepOps
    from celery_durable.workflows.throttles import ThrottleOps
    from celery_durable.workflows.waits import WaitOps

MAIN = schema.MAIN


@dataclass(frozen=True, slots=True)
class Recalled:
    """What the journal holds where an op is asked for that an older
    attempt's failure runs again (a step, a call, an agent turn)."""

    journaled: bool
    outcome: Outcome | None = None
    """This attempt's outcome: the op returns it (the cursor is past it)."""
    cut: str | None = None
    """An older attempt's failure, run again: the cut to journal with the op."""


class Replay(StopState):
    """One execution of a run's workflow function: a coordinator pass or a
    branch task (one given a ``target``)."""

    def __init__(
        self,
        *,
        journal: Journal,
        run: RunRecord,
        workflow: Workflow,
        port: Port,
        target: BranchTarget | None = None,
        token: str = "",
        mode: Mode | None = None,
    ) -> None:
        # Sticky: once the store fails or the fence refuses a write, the
        # error is kept (``broken``) and raised at every later op, so workflow
        # code that catches it with ``except Exception`` cannot journal past it.
        self.journal: Journal = GuardedJournal(journal, self._guard)
        self.run = run
        self.workflow = workflow
        self.epoch = journal.epoch
        self.port: Final = port
        """All this execution asks of the fleet (``workflows/port.py``)."""
        self.max_fanout = port.max_fanout
        self.max_payload_bytes = port.max_payload_bytes
        self.target = target
        self.mode = mode or (Mode.BRANCH_TASK if target is not None else Mode.PASS)
        self.token = token
        self._read_ahead: dict[str, SequenceHistory] = {}
        """Branch sequences read before their branches run (``read_ahead``)."""
        StopState.__init__(self)
        self.parking: ParkedBody | None = None
        """Set while the main body runs on a thread a worker may keep parked
        at a task call (``parking.py``)."""
        self._cursor: contextvars.ContextVar[Cursor] = contextvars.ContextVar(f"cursor-{run.run_id}")
        from celery_durable.workflows.steps import StepOps

        # Made now, not when first asked for as the other ops are: it keeps
        # what ran (``ran``), and branches in threads may ask first at once.
        self.steps: StepOps = StepOps(self)
        self._held_lock = threading.Lock()
        """Who journals a held-back main-body step: its next call, or ``held.watch``."""
        self._held_at = 0.0
        self._held_watched = False
        self._held_trouble: tuple[Cursor, PendingCommit, Recorded | Conflict] | None = None
        """What ``held.watch`` met journaling a held step: for the body to act on at its next call."""

    # -- the other ops, one module each, made when a workflow first asks for one -------

    @functools.cached_property
    def fanout(self) -> FanoutOps:
        from celery_durable.workflows.fanout import FanoutOps

        return FanoutOps(self)

    @functools.cached_property
    def agents(self) -> AgentOps:
        from celery_durable.workflows.agent_ops import AgentOps

        return AgentOps(self)

    @functools.cached_property
    def waits(self) -> WaitOps:
        from celery_durable.workflows.waits import WaitOps

        return WaitOps(self)

    @functools.cached_property
    def calls(self) -> CallOps:
        from celery_durable.workflows.calls import CallOps

        return CallOps(self)

    @functools.cached_property
    def children(self) -> ChildOps:
        from celery_durable.workflows.children import ChildOps

        return ChildOps(self, self.port.children)

    @functools.cached_property
    def throttles(self) -> ThrottleOps:
        """Slots of throttled ops (``throttle=``; ``workflows/throttles.py``)."""
        from celery_durable.workflows.throttles import ThrottleOps

        return ThrottleOps(self, self.port.throttles)

    # -- sequences -------------------------------------------------------------

    def open_cursor(self, seq: str, *, writes: bool, phase_id: str = "") -> Cursor:
        history = self._read_ahead.pop(seq, None)
        if history is None:
            history = self.journal.read_sequence(seq)
        return Cursor(
            seq=seq,
            history=history.live_entries(),
            high_water=history.high_water,
            writes=writes,
            phase_id=phase_id,
            compensated=history.last_compensation(),
        )

    def read_ahead(self, seqs: Sequence[str]) -> None:
        """Read sequences that are about to be opened, in one round trip.

        Safe though older than a read at ``open_cursor`` would be. Ops are
        journaled by the branch the sequence belongs to, and what a second
        delivery of that branch journals meanwhile meets the scripts'
        first-write-wins checks, as when it journals just after the read.
        What others write into it (a call's answer, how a wait ended) is
        found missing by a read that is too early: the branch then waits,
        and the wake that answer sent runs it again.
        """
        wanted = [seq for seq in seqs if seq not in self._read_ahead]
        if wanted:
            self._read_ahead.update(zip(wanted, self.journal.read_sequences(wanted), strict=False))

    def prime(self, histories: Mapping[str, SequenceHistory]) -> None:
        """Sequences read ahead elsewhere (a branch task's start), taken as ``read_ahead`` would."""
        self._read_ahead.update(histories)

    def has_read_ahead(self, seq: str) -> bool:
        """Whether ``open_cursor`` will take this sequence from the read-ahead."""
        return seq in self._read_ahead

    def current(self) -> Cursor:
        try:
            return self._cursor.get()
        except LookupError:
            raise RuntimeError(
                "WorkflowContext was used outside the workflow's own thread; use ctx.parallel to run work concurrently"
            ) from None

    @contextlib.contextmanager
    def running(self, cursor: Cursor) -> Iterator[None]:
        """The ops of the block run at ``cursor`` (a block, not a callback:
        the code that runs a sequence stays in its own module's frame)."""
        token = self._cursor.set(cursor)
        try:
            yield
        finally:
            self._cursor.reset(token)

    def expect(self, cursor: Cursor, identity: str) -> tuple[bool, str | None]:
        """Check op ``identity`` against the journal: (journaled?, journaled value)."""
        journaled = cursor.journaled()
        if journaled is not None:
            found, value = journaled
            if found != identity:
                raise self.nondeterminism(cursor, f"expected {describe(found)}, got {describe(identity)}")
            return True, value
        if not cursor.writes:
            raise StaleAttemptError(
                f"Run {self.run.run_id}: {describe(identity)} at call {cursor.index} of sequence {cursor.seq} "
                "is not journaled yet; this branch task is older than the run's history"
            )
        return False, None

    def recall(self, cursor: Cursor, identity: str, what: str, *, answered_elsewhere: bool = False) -> Recalled:
        """``expect`` for an op that runs again after an older attempt's failure.

        A live outcome is the op's (the cursor moves past it), and so is a
        failure with a compensation journaled after it (``Cursor.compensated_after``). Any
        other failure is cut here when this execution writes; one that only
        replays cannot run the op again, nor wait for one another task
        answers (``answered_elsewhere``): it is older than the run's history.
        """
        journaled, raw = self.expect(cursor, identity)
        if raw is not None:
            outcome = self.decode(raw)
            if outcome.is_live(self.epoch) or cursor.compensated_after():
                self.flush(cursor)
                cursor.advance()
                return Recalled(True, outcome)
            if not cursor.writes:
                raise StaleAttemptError(f"Run {self.run.run_id}: {what} holds an older attempt's failure")
            return Recalled(True, cut=cursor.cut_here())
        if journaled and answered_elsewhere and not cursor.writes:
            raise StaleAttemptError(f"Run {self.run.run_id}: {what} is not finished yet")
        return Recalled(journaled)

    def nondeterminism(self, cursor: Cursor, detail: str, *, index: int | None = None) -> NonDeterminismError:
        where = "the main body" if cursor.is_main else f"branch {cursor.seq}"
        call = cursor.index if index is None else index
        message = divergence_message(self.workflow, self.run, where, call, detail)
        return self.meet_fatal(NonDeterminismError(message))

    def conflict(self, cursor: Cursor, found: Conflict, requested: str, *, index: int | None = None) -> NoReturn:
        """The journal holds another op where this one was asked for."""
        detail = f"expected {describe(found.journaled)}, got {describe(requested)}"
        raise self.nondeterminism(cursor, detail, index=index)

    def decode(self, raw: str) -> Outcome:
        """A journaled outcome; one that does not parse breaks this execution
        (sticky, like every storage error), so user code that catches it
        cannot journal past it."""
        try:
            return schema.decode_outcome(raw)
        except StorageCorruptError as exc:
            self.break_with(exc)
            raise

    # -- progress ----------------------------------------------------------------

    def phase(self, title: str) -> None:
        phase = self.workflow.phase_named(title) if isinstance(title, str) else None
        if phase is None:
            raise WorkflowDefinitionError(f"Workflow {self.workflow.name!r} declares no phase titled {title!r}")
        cursor = self.current()
        cursor.phase_id = phase.phase_id
        self._record(cursor, "phase", title)

    def log(self, message: str) -> None:
        if not isinstance(message, str):
            raise ValueError(f"ctx.log takes a string, got {type(message).__name__}")
        jsonvalue.encode_payload(
            message, self.max_payload_bytes, noun="ctx.log message", text=True, not_json="{noun} holds a lone surrogate"
        )
        self._record(self.current(), "log", message)

    def system(self, message: str) -> None:
        """A ``system`` progress record of the engine's own, in the current sequence."""
        self._record(self.current(), "system", message, phase_id="")

    def _record(self, cursor: Cursor, kind: str, message: str, phase_id: str | None = None) -> None:
        position = cursor.position()
        if cursor.logs_since_op + 1 >= schema.POSITION_STRIDE:
            raise ValueError(f"More than {schema.POSITION_STRIDE - 1} progress records between two calls")
        cursor.logs_since_op += 1
        if cursor.writes and position > cursor.high_water:
            cursor.buffer.append((position, kind, cursor.phase_id if phase_id is None else phase_id, message))

    # -- writing ---------------------------------------------------------------------

    def flush(self, cursor: Cursor, *, step_key: str = "", step_row: str = "", cut: str | None = None) -> str | None:
        """Write buffered progress (and a running row for ``step_key``) before an op,
        with what the sequence held back: its last step, or, first in a branch,
        the completion of the branch its thread ran before (``Completions``).

        Returns the step's live journaled outcome when the key was journaled
        meanwhile by another sequence.
        """
        if not cursor.writes:
            return None
        held = self._take_held(cursor)
        if not (cursor.buffer or step_key or cut is not None or held):
            return None  # a branch completion held back waits for a write to travel with
        call = BeginCall(cut=cut, step_key=step_key, step_row=step_row, records=list(cursor.buffer))
        if held is not None:
            began = self._commit_and_begin(cursor, held, call)
        elif cursor.completions is not None:
            began = cursor.completions.begin(cursor.seq, call)
        else:
            began = self.journal.begin(cursor.seq, call)
        if cursor.buffer:
            cursor.high_water = max(cursor.high_water, cursor.buffer[-1][0])
            cursor.buffer.clear()
        self.apply_flags(began.flags)
        return began.existing

    def last_writes(self, cursor: Cursor) -> LastWrites | None:
        """What ``flush`` would write as the main body ends, taken to go out
        with the run's settlement (``finish.lua``): one round trip for both.
        None when there is nothing to write. Should the settlement not take
        them, ``write_back`` hands them back to ``flush``."""
        if not cursor.writes:
            return None
        held = self._take_held(cursor)
        if not (cursor.buffer or held):
            return None
        return LastWrites(cursor.seq, held, BeginCall(records=list(cursor.buffer)), self.cancelled())

    def write_back(self, cursor: Cursor, last: LastWrites) -> None:
        """``last_writes`` untaken (their progress is still the cursor's): the next ``flush`` writes them."""
        cursor.held = last.commit

    def _commit_and_begin(self, cursor: Cursor, held: PendingCommit, call: BeginCall) -> Began:
        """Journal the held-back step and begin the next call in one round trip."""
        result = self.journal.commit_begin(cursor.seq, held, call)
        self._journaled_held(cursor, held, result)
        assert isinstance(result, Began)
        return result

    def _journaled_held(self, cursor: Cursor, held: PendingCommit, result: object) -> None:
        if isinstance(result, Conflict):
            self.conflict(cursor, result, held.identity, index=held.index)
        if isinstance(result, Winner) or (isinstance(result, Recorded) and result.winner is not None):
            # Another execution journaled this step first while its producer
            # ran (first write wins). The workflow code since saw this pass's
            # value, but no work has run on it: end the pass (in a branch, the
            # branch's run), and the next one replays with the journaled value.
            if cursor.completions is not None:
                raise BranchRerun()
            raise self.rerun_pass()

    def hold(self, cursor: Cursor, commit: PendingCommit) -> None:
        """Hold ``commit`` back to travel with the sequence's next write
        (``holds_steps``); in the main body, journal it by itself should that
        write not come within ``port.held_step_seconds`` (``held.py``)."""
        with self._held_lock:
            cursor.held = commit
            self._held_at = time.monotonic()
            bound = self.port.held_step_seconds if cursor.is_main else None
            if bound is None or self._held_watched:
                return
            self._held_watched = True
        held.watch(functools.partial(self._journal_held, cursor, bound))

    def _journal_held(self, cursor: Cursor, bound: float) -> bool:
        """``held.watch``'s look: journal the step the body still holds past
        its time (``record``, the script a step not held back is journaled
        by); True while a step held now is not due yet. What the write meets
        the body meets at its next call: a lost authority or an unavailable
        store is kept (``broken``, by the journal's guard), a first write won
        elsewhere or a conflict here (``_held_trouble``)."""
        with self._held_lock:
            commit = cursor.held
            if commit is not None and self.broken is None and time.monotonic() < self._held_at + bound:
                return True
            self._held_watched = False
            if commit is None or self.broken is not None:
                return False
            cursor.held = None
            try:
                result = self.journal.record(cursor.seq, commit)
            except Exception:  # kept by the guard (``broken``), or met again at the next call
                cursor.held = commit
                return False
            if isinstance(result, Recorded) and result.winner is None:
                self.apply_flags(result.flags)
            else:
                self._held_trouble = (cursor, commit, result)
            return False

    def _take_held(self, cursor: Cursor) -> PendingCommit | None:
        """The step the sequence holds back, now the caller's to journal; what
        ``held.watch`` met journaling it, raised here."""
        if cursor.held is None and self._held_trouble is None:
            return None  # nothing held: no lock to take
        with self._held_lock:
            taken, cursor.held = cursor.held, None
            trouble = self._held_trouble
            if trouble is not None and trouble[0] is cursor:
                self._held_trouble = None
            else:
                trouble = None  # the main body's: met at its own next call
        if trouble is not None:
            self._journaled_held(cursor, trouble[1], trouble[2])
        return taken

    def holds_steps(self, cursor: Cursor) -> bool:
        """Whether a step's write waits for the sequence's next call. A pass's
        main body holds each step back: the one place where nothing else
        journals the same keys meanwhile (a fan-out is a barrier), so the
        held-back value is what the journal will say. So do branches run one
        after another in one thread (``cursor.completions``), whose last step
        goes with the branch's outcome: there another execution may journal
        the key first, and the branch runs again (``BranchRerun``).
        A compensation is never held: journaled before the next one runs, it
        is what keeps the failure it undoes standing (``Cursor.compensated_after``)."""
        if cursor.compensating:
            return False
        return cursor.completions is not None or (cursor.is_main and self.mode is Mode.PASS)

    def commit(self, cursor: Cursor, commit: PendingCommit) -> str | None:
        """Journal the op at the cursor and advance; returns a winning earlier value.
        A saga's compensation is named in the journal as its sequence's last
        (``Cursor.compensated_after``), its outcome new or found under its key
        (journaled by an attempt whose entry a cut abandoned)."""
        result = self.journal.record(cursor.seq, commit, compensation=bool(cursor.compensating))
        if isinstance(result, Conflict):
            self.conflict(cursor, result, commit.identity)
        self.apply_flags(result.flags)
        cursor.advance()
        return result.winner

    def step_row(self, cursor: Cursor, started: int, outcome: Outcome) -> str:
        """The row a journaled step leaves: the run detail lists journaled
        steps as well as running ones (SPEC §3)."""
        row = schema.StepRow.running(self.run.attempt, started, schema.call_id(cursor.seq, cursor.index))
        return row.settled(outcome, self.journal.now_ms()).encode()
