"""Deterministic replay: the engine behind every ``WorkflowContext`` call.

A run's workflow function is re-executed from the top on every coordinator
pass. Each call it makes (step, fan-out, agent turn, now, uuid4) is an *op*
in a *sequence*: the main body is sequence ``m``; branch ``j`` of the fan-out
that was op ``i`` of sequence ``s`` is sequence ``s.i.j``. An op found in the
journal returns its journaled value; the first op past the journaled history
is new work. Order is checked per sequence, so the order in which branches
finish never matters (the DBOS check/record pair, per sequence).

``Replay`` holds what one execution (a coordinator pass or a branch task)
knows: its journal, its cursors, the run's control flags and why it must
stop. The ops themselves live beside it, one module each: ``steps`` (steps
and replay-safe values), ``fanout`` (parallel and pipeline), ``agent_ops``
(agent turns). Replay talks to storage only through the ``Journal``
protocol, so a test can drive it by hand on the real store (``tests/unit``).
"""

from __future__ import annotations

import contextvars
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, NoReturn

from celery_durable.broker import schema
from celery_durable.broker.journal import (
    AgentCall,
    Began,
    BeginCall,
    Conflict,
    Dispatch,
    Flags,
    HeldBranch,
    Journal,
    PendingCommit,
    Recorded,
    TaskCall,
    WaitResult,
    Winner,
)
from celery_durable.broker.records import RunRecord
from celery_durable.broker.schema import Outcome, SequenceHistory, describe
from celery_durable.broker.scripts import now_ms
from celery_durable.errors import (
    EXECUTION_LOST,
    NonDeterminismError,
    StaleAttemptError,
    StorageCorruptError,
    WorkflowCancelled,
    WorkflowDefinitionError,
    WorkflowLimitReached,
)
from celery_durable.workflows import jsonvalue
from celery_durable.workflows.cursor import Cursor
from celery_durable.workflows.unwind import BranchRerun, BranchSuspended, PauseRequested, Suspend

if TYPE_CHECKING:
    from celery_durable.workflows.agent_ops import AgentOps
    from celery_durable.workflows.calls import CallOps, CallSender
    from celery_durable.workflows.definition import Workflow
    from celery_durable.workflows.fanout import BranchSender, BranchTarget, FanoutOps, InlineBranches, KeptFanout
    from celery_durable.workflows.parking import ParkedBody
    from celery_durable.workflows.steps import StepOps
    from celery_durable.workflows.waits import WaitOps

MAIN = schema.MAIN
MAX_KEY_LENGTH = 1024

AgentSender = Callable[[str, str, str], None]
"""Sends an agent task: (agent id, owner to wake, task id)."""


class StickyJournal:
    """The journal as a replay sees it: a lost execution stays lost.

    Once the store fails or the fence refuses a write, every later call
    raises the same error (``Replay.broken``), so workflow code that catches
    it with ``except Exception`` cannot journal past it.
    """

    def __init__(self, inner: Journal, replay: Replay) -> None:
        self._inner = inner
        self._replay = replay

    @property
    def run_id(self) -> str:
        return self._inner.run_id

    @property
    def epoch(self) -> int:
        return self._inner.epoch

    def now_ms(self) -> int:
        return self._inner.now_ms()

    def _guard(self, call: Callable[[], Any]) -> Any:
        try:
            return call()
        except EXECUTION_LOST as exc:
            self._replay.broken = self._replay.broken or exc
            raise

    def read_sequence(self, seq: str, start: int = 0) -> SequenceHistory:
        result: SequenceHistory = self._guard(lambda: self._inner.read_sequence(seq, start))
        return result

    def read_sequences(self, seqs: Sequence[str]) -> list[SequenceHistory]:
        result: list[SequenceHistory] = self._guard(lambda: self._inner.read_sequences(seqs))
        return result

    def begin(self, seq: str, call: BeginCall) -> Began:
        result: Began = self._guard(lambda: self._inner.begin(seq, call))
        return result

    def commit_begin(self, seq: str, commit: PendingCommit, call: BeginCall) -> Began | Conflict | Winner:
        result: Began | Conflict | Winner = self._guard(lambda: self._inner.commit_begin(seq, commit, call))
        return result

    def record(self, seq: str, commit: PendingCommit) -> Recorded | Conflict:
        result: Recorded | Conflict = self._guard(lambda: self._inner.record(seq, commit))
        return result

    def dispatch(
        self, seq: str, index: int, identity: str, width: int, token: str, position: int
    ) -> Dispatch | Conflict:
        result: Dispatch | Conflict = self._guard(
            lambda: self._inner.dispatch(seq, index, identity, width, token, position)
        )
        return result

    def sending(self, call: str, messages: Sequence[str]) -> None:
        self._guard(lambda: self._inner.sending(call, messages))

    def mark_sent(self, call: str) -> None:
        self._guard(lambda: self._inner.mark_sent(call))

    def branch_outcomes(self, call: str, count: int, only: Sequence[int] | None = None) -> list[str | None]:
        result: list[str | None] = self._guard(lambda: self._inner.branch_outcomes(call, count, only))
        return result

    def hand_off(self, call: str, giver: str, branches: Sequence[int], messages: Sequence[str]) -> None:
        self._guard(lambda: self._inner.hand_off(call, giver, branches, messages))

    def handed_off(self, call: str, giver: str) -> list[int]:
        result: list[int] = self._guard(lambda: self._inner.handed_off(call, giver))
        return result

    def complete_branch(self, call: str, branch: int, outcome: str, wake: str, ending: str = "") -> bool:
        return bool(self._guard(lambda: self._inner.complete_branch(call, branch, outcome, wake, ending)))

    def complete_held(
        self, call: str, branch: int, outcome: str, wake: str, ending: str, seq: str, held: PendingCommit
    ) -> bool | Winner | Conflict:
        result: bool | Winner | Conflict = self._guard(
            lambda: self._inner.complete_held(call, branch, outcome, wake, ending, seq, held)
        )
        return result

    def complete_begin(self, seq: str, held: HeldBranch, call: BeginCall) -> Began | Winner | Conflict:
        result: Began | Winner | Conflict = self._guard(lambda: self._inner.complete_begin(seq, held, call))
        return result

    def agent_call(
        self,
        seq: str,
        index: int,
        agent_id: str,
        request_json: str,
        owner: str,
        row_json: str,
        cut: str | None,
        message: str,
    ) -> AgentCall | Conflict:
        result: AgentCall | Conflict = self._guard(
            lambda: self._inner.agent_call(seq, index, agent_id, request_json, owner, row_json, cut, message)
        )
        return result

    def call(self, seq: str, index: int, key: str, owner: str, due_ms: int | None, cut: str | None,
             running_row: str, timeout_outcome: str) -> TaskCall | Conflict:
        result: TaskCall | Conflict = self._guard(
            lambda: self._inner.call(seq, index, key, owner, due_ms, cut, running_row, timeout_outcome)
        )
        return result

    def wait(
        self, seq: str, index: int, identity: str, kind: str, name: str, due_ms: int | None, owner: str
    ) -> WaitResult | Conflict:
        result: WaitResult | Conflict = self._guard(
            lambda: self._inner.wait(seq, index, identity, kind, name, due_ms, owner)
        )
        return result


class Replay:
    """One execution of a run's workflow function: a coordinator pass or a branch task."""

    def __init__(
        self,
        *,
        journal: Journal,
        run: RunRecord,
        workflow: Workflow,
        max_fanout: int,
        max_payload_bytes: int,
        send_branches: BranchSender | None = None,
        target: BranchTarget | None = None,
        token: str = "",
        send_agent: AgentSender | None = None,
        send_call: CallSender | None = None,
        keep_fanout: Callable[[KeptFanout], None] | None = None,
        inline: InlineBranches | None = None,
    ) -> None:
        from celery_durable.workflows.agent_ops import AgentOps
        from celery_durable.workflows.calls import CallOps
        from celery_durable.workflows.fanout import FanoutOps
        from celery_durable.workflows.steps import StepOps
        from celery_durable.workflows.waits import WaitOps

        self.journal = StickyJournal(journal, self)
        self.run = run
        self.workflow = workflow
        self.epoch = journal.epoch
        self.max_fanout = max_fanout
        self.max_payload_bytes = max_payload_bytes
        self.send_branches = send_branches
        self.send_agent = send_agent
        self.send_call = send_call
        self.keep_fanout = keep_fanout
        """Given a top-level fan-out's thunks when this branch task built them (``KeptFanout``)."""
        self.inline = inline
        """Set in a coordinator pass that runs narrow fan-outs itself."""
        self.target = target
        self.token = token
        self.cancel_event = threading.Event()
        self._read_ahead: dict[str, SequenceHistory] = {}
        """Branch sequences read before their branches run (``read_ahead``)."""
        self.lost_authority = False
        self.fatal: BaseException | None = None
        """The first fatal error the workflow met; it decides how the run settles
        even when user code swallowed it."""
        self.broken: Exception | None = None
        self.unwinding: BaseException | None = None
        self.pause_requested = False
        self.limit_reached = ""
        self.rerun = False
        """A pass that ended because its view of the journal went stale; the
        coordinator runs the next one at once."""
        self.parking: ParkedBody | None = None
        """Set while the main body runs on a thread a worker may keep parked
        at a task call (``parking.py``)."""
        self._cursor: contextvars.ContextVar[Cursor] = contextvars.ContextVar(f"cursor-{run.run_id}")
        self.steps: StepOps = StepOps(self)
        self.fanout: FanoutOps = FanoutOps(self)
        self.agents: AgentOps = AgentOps(self)
        self.waits: WaitOps = WaitOps(self)
        self.calls: CallOps = CallOps(self)

    # -- sequences -------------------------------------------------------------

    def open_cursor(self, seq: str, *, writes: bool, phase_id: str = "") -> Cursor:
        history = self._read_ahead.pop(seq, None)
        if history is None:
            history = self.journal.read_sequence(seq)
        return Cursor(
            seq=seq, history=history.live_entries(), high_water=history.high_water, writes=writes, phase_id=phase_id
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

    def run_in(self, cursor: Cursor, fn: Callable[[], Any]) -> Any:
        token = self._cursor.set(cursor)
        try:
            return fn()
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

    def nondeterminism(self, cursor: Cursor, detail: str, *, index: int | None = None) -> NonDeterminismError:
        where = "the main body" if cursor.is_main else f"branch {cursor.seq}"
        call = cursor.index if index is None else index
        error = NonDeterminismError(
            f"Workflow {self.workflow.name!r} replayed differently in {where} at call {call}: {detail}. "
            "Check that your workflow is deterministic: move clocks, randomness and I/O into steps, "
            "or use ctx.now() and ctx.uuid4()"
        )
        self.fatal = self.fatal or error
        return error

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
            self.broken = self.broken or exc
            raise

    # -- control flags -------------------------------------------------------------

    def apply_flags(self, flags: Flags) -> None:
        if flags.cancel:
            self.cancel_event.set()
        if flags.pause:
            self.pause_requested = True
        if flags.limit:
            self.limit_reached = flags.limit

    def cancelled(self) -> bool:
        return self.cancel_event.is_set()

    def check_cancelled(self) -> None:
        """Run before every op: an unwinding pass or a broken execution makes
        no more calls, even from user ``finally`` blocks."""
        if self.unwinding is not None:
            raise self.unwinding
        cursor = self._cursor.get(None)
        if cursor is not None and cursor.suspended is not None:
            raise cursor.suspended
        if self.broken is not None:
            raise self.broken
        if self.lost_authority:
            raise StaleAttemptError(f"Run {self.run.run_id}: this attempt lost execution authority")
        if self.cancel_event.is_set():
            error = WorkflowCancelled(f"Run {self.run.run_id} was cancelled")
            self.fatal = self.fatal or error
            raise error
        if self.limit_reached:
            limit = WorkflowLimitReached(self.limit_reached)
            self.fatal = self.fatal or limit
            raise limit

    def check_pause(self, cursor: Cursor) -> None:
        """Before the main body starts new work: settle as paused if asked to.
        Work already in flight (a fan-out's branches) is waited for, not paused."""
        if self.pause_requested and cursor.is_main and cursor.writes:
            self.unwinding = PauseRequested()
            raise self.unwinding

    def suspend(self) -> Suspend:
        """End this pass: it waits for something that wakes the coordinator."""
        self.unwinding = Suspend()
        return self.unwinding

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
        if cursor.owner == MAIN:
            raise self.suspend()
        cursor.suspended = BranchSuspended()
        raise cursor.suspended

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

    def _record(self, cursor: Cursor, kind: str, message: str) -> None:
        position = cursor.position()
        if cursor.logs_since_op + 1 >= schema.POSITION_STRIDE:
            raise ValueError(f"More than {schema.POSITION_STRIDE - 1} progress records between two calls")
        cursor.logs_since_op += 1
        if cursor.writes and position > cursor.high_water:
            cursor.buffer.append((position, kind, cursor.phase_id, message))

    # -- writing ---------------------------------------------------------------------

    def flush(self, cursor: Cursor, *, step_key: str = "", step_row: str = "", cut: str | None = None) -> str | None:
        """Write buffered progress (and a running row for ``step_key``) before an op.

        Returns the step's live journaled outcome when the key was journaled
        meanwhile by another sequence.
        """
        if not cursor.writes or not (cursor.buffer or step_key or cut is not None or cursor.pending):
            return None  # a held branch completion (cursor.carrier) waits for a write to travel with
        call = BeginCall(cut=cut, step_key=step_key, step_row=step_row, records=list(cursor.buffer))
        if cursor.pending is not None:
            began = self._commit_and_begin(cursor, call)
        elif cursor.carrier is not None and cursor.carrier.holds:
            began = cursor.carrier.begin_with(self.journal, cursor.seq, call)
        else:
            began = self.journal.begin(cursor.seq, call)
        if cursor.buffer:
            cursor.high_water = max(cursor.high_water, cursor.buffer[-1][0])
            cursor.buffer.clear()
        self.apply_flags(began.flags)
        return began.existing

    def _commit_and_begin(self, cursor: Cursor, call: BeginCall) -> Began:
        """Journal the held-back step and begin the next call in one round trip."""
        pending = cursor.pending
        assert pending is not None
        cursor.pending = None
        result = self.journal.commit_begin(cursor.seq, pending, call)
        if isinstance(result, Conflict):
            self.conflict(cursor, result, pending.identity, index=pending.index)
        if isinstance(result, Winner):
            # Another execution journaled this step first while its producer
            # ran (first write wins). The workflow code since saw this pass's
            # value, but no work has run on it: end the pass (in a branch, the
            # branch's run), and the next one replays with the journaled value.
            if cursor.holds_steps:
                raise BranchRerun()
            self.rerun = True
            raise self.suspend()
        return result

    def defers_commits(self, cursor: Cursor) -> bool:
        """A coordinator's main body holds each step's write back to send it
        with the next call: the one place where nothing else journals the
        same keys meanwhile (a fan-out is a barrier), so the held-back value
        is what the journal will say. A branch task's branch may too
        (``holds_steps``): there another execution may journal the key
        first, and the branch runs again (``BranchRerun``)."""
        return cursor.writes and ((cursor.is_main and self.target is None) or cursor.holds_steps)

    def commit(self, cursor: Cursor, commit: PendingCommit) -> str | None:
        """Journal the op at the cursor and advance; returns a winning earlier value."""
        result = self.journal.record(cursor.seq, commit)
        if isinstance(result, Conflict):
            self.conflict(cursor, result, commit.identity)
        self.apply_flags(result.flags)
        cursor.advance()
        return result.winner

    def step_row(self, cursor: Cursor, started: int, outcome: Outcome) -> str:
        """The row a journaled step leaves: the run detail lists journaled
        steps as well as running ones (SPEC §3)."""
        row = schema.StepRow.running(self.run.attempt, started, schema.call_id(cursor.seq, cursor.index))
        return row.settled(outcome, now_ms()).encode()
