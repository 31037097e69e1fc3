"""Deterministic replay: the engine behind every ``WorkflowContext`` call.

A run's workflow function is re-executed from the top on every coordinator
pass. Each call it makes (step, fan-out, now, uuid4) is an *op* in a
*sequence*: the main body is sequence ``m``; branch ``j`` of the fan-out that
was op ``i`` of sequence ``s`` is sequence ``s.i.j``. An op found in the
journal returns its journaled value; the first op past the journaled history
is new work. Order is checked per sequence, so the order in which branches
finish never matters (the DBOS check/record pair, per sequence).

Straight-line steps run inline in the coordinator: one fenced Lua script
each (a step's journal write travels with the next call's begin, see
``Replay._commit_and_begin``), no broker hop and no replay of their own. A
fan-out journals its op, sends its unfinished branches to the steps queue as
Celery tasks and *suspends* the pass; the last branch to finish wakes the
coordinator, whose next pass replays up to the fan-out and finds every
outcome journaled. A branch task
replays the main body (all journal hits) up to its fan-out and runs only its
own thunk; fan-outs nested inside a branch run on that worker, in threads.
"""

from __future__ import annotations

import contextvars
import functools
import hashlib
import threading
import uuid
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, NoReturn

import jsonschema
import jsonschema.exceptions

from celery_durable.broker import Flags, PendingCommit, RunRecord, RunStore, now_ms
from celery_durable.errors import (
    FATAL_ERRORS,
    NonDeterminismError,
    StaleAttemptError,
    StepFailed,
    StorageCorruptError,
    StorageUnavailableError,
    WorkflowCancelled,
    WorkflowDefinitionError,
    WorkflowLimitReached,
)
from celery_durable.workflows import jsonvalue, outcomes
from celery_durable.workflows.outcomes import Outcome

if TYPE_CHECKING:
    from celery_durable.workflows.definition import Workflow
    from celery_durable.workflows.retry import RetryPolicy

MAIN = "m"
POSITION_STRIDE = 1 << 20
"""Progress positions are ``ops_before * STRIDE + n``: the n-th record logged
after the sequence's ops_before-th op. Replays log the same records at the
same positions, which is how they are recognised and not written twice."""
MAX_KEY_LENGTH = 1024
NESTED_FANOUT_THREADS = 32

BranchSender = Callable[[str, Sequence[int]], None]
"""Sends branch tasks: (call id "<seq>:<op index>", branch indices)."""

INFRASTRUCTURE_ERRORS = (StorageUnavailableError, StorageCorruptError, StaleAttemptError)
"""Errors that mean this execution cannot go on. They are sticky: once one
is raised, every later call raises it again, so workflow code that catches
it with ``except Exception`` cannot journal past it."""


class _GuardedStore:
    """The store as a replay sees it: infrastructure errors become sticky."""

    def __init__(self, store: RunStore, replay: Replay) -> None:
        self._store = store
        self._replay = replay

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._store, name)

        def call(*args: Any, **kwargs: Any) -> Any:
            try:
                return method(*args, **kwargs)
            except INFRASTRUCTURE_ERRORS as exc:
                self._replay.broken = self._replay.broken or exc
                raise

        return call


class Suspend(BaseException):
    """Unwinds the workflow when the coordinator must wait for branches.

    A ``BaseException`` so that user code's ``except Exception`` cannot
    swallow it: the pass must end here, and the next one replays.
    """


class BranchFinished(BaseException):
    """Unwinds a branch task's replay once its own thunks have outcomes."""


class BranchSuspended(BaseException):
    """Unwinds one branch that waits for an agent turn; it has no outcome yet,
    and the turn's agent task sends the branch task again when it is done."""


class PauseRequested(BaseException):
    """Unwinds the main body at its first new call after a pause was requested."""


@dataclass(slots=True)
class Cursor:
    """Where one sequence stands in this execution."""

    seq: str
    history: list[tuple[str, str | None]]
    high_water: int
    writes: bool
    phase_id: str = ""
    owner: str = "m"
    """Whom an agent turn of this sequence wakes: "m" (the coordinator) or
    "<call>/<branch>" (the branch task of a top-level branch)."""
    suspended: BaseException | None = None
    index: int = 0
    logs_since_op: int = 0
    buffer: list[tuple[int, str, str, str]] = field(default_factory=list)
    pending: PendingCommit | None = None
    """The last step's journal write, not sent yet: it goes with this
    sequence's next store write (``Replay.flush``), before any more work runs."""

    def position(self) -> int:
        return self.index * POSITION_STRIDE + self.logs_since_op

    def advance(self) -> None:
        self.index += 1
        self.logs_since_op = 0

    def has_new_records(self) -> bool:
        return bool(self.buffer)


def describe(identity: str) -> str:
    """An op identity as users read it in errors."""
    kind, _, rest = identity.partition("|")
    return {
        "s": rest,
        "p": f"parallel({rest})",
        "l": f"pipeline({rest})",
        "t": "now()",
        "u": "uuid4()",
    }.get(kind, identity)


@dataclass(frozen=True, slots=True)
class BranchTarget:
    """The thunks a branch task runs: branches ``indices`` of op ``call``.

    ``on_outcome`` journals each branch as soon as it finishes, so a task
    that dies halfway loses only the branch it was running.
    """

    call: str
    indices: tuple[int, ...]
    on_outcome: Callable[[int, Outcome], None]


class Replay:
    """One execution of a run's workflow function: a coordinator pass or a branch task."""

    def __init__(
        self,
        *,
        store: RunStore,
        run: RunRecord,
        workflow: Workflow,
        epoch: int,
        max_fanout: int,
        max_payload_bytes: int,
        send_branches: BranchSender | None = None,
        target: BranchTarget | None = None,
        token: str = "",
        send_agent: Callable[[str, str], None] | None = None,
    ) -> None:
        self.send_agent = send_agent
        self.store: RunStore = _GuardedStore(store, self)  # type: ignore[assignment]
        self.token = token
        self.run = run
        self.workflow = workflow
        self.epoch = epoch
        self.max_fanout = max_fanout
        self.max_payload_bytes = max_payload_bytes
        self.send_branches = send_branches
        self.target = target
        self.cancel_event = threading.Event()
        self.lost_authority = False
        self.fatal: BaseException | None = None
        self.broken: Exception | None = None
        self.unwinding: BaseException | None = None
        self.pause_requested = False
        self.limit_reached = ""
        self.rerun = False
        """A pass that ended because its view of the journal went stale; the
        coordinator runs the next one at once."""
        self._cursor: contextvars.ContextVar[Cursor] = contextvars.ContextVar(f"cursor-{run.run_id}")

    # -- sequences -------------------------------------------------------------

    def open_cursor(self, seq: str, *, writes: bool, phase_id: str = "") -> Cursor:
        history = self.store.read_sequence(self.run.run_id, seq)
        return Cursor(
            seq=seq,
            history=history.live_entries(),
            high_water=history.high_water,
            writes=writes,
            phase_id=phase_id,
        )

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

    def _expect(self, cursor: Cursor, identity: str) -> tuple[bool, str | None]:
        """Check op ``identity`` against the journal: (journaled?, journaled value)."""
        if cursor.index < len(cursor.history):
            journaled, value = cursor.history[cursor.index]
            if journaled != identity:
                raise self._nondeterminism(cursor, f"expected {describe(journaled)}, got {describe(identity)}")
            return True, value
        if not cursor.writes:
            raise StaleAttemptError(
                f"Run {self.run.run_id}: {describe(identity)} at call {cursor.index} of sequence {cursor.seq} "
                "is not journaled yet; this branch task is older than the run's history"
            )
        return False, None

    def _nondeterminism(self, cursor: Cursor, detail: str, *, index: int | None = None) -> NonDeterminismError:
        where = "the main body" if cursor.seq == MAIN else f"branch {cursor.seq}"
        call = cursor.index if index is None else index
        error = NonDeterminismError(
            f"Workflow {self.workflow.name!r} replayed differently in {where} at call {call}: {detail}. "
            "Check that your workflow is deterministic: move clocks, randomness and I/O into steps, "
            "or use ctx.now() and ctx.uuid4()"
        )
        self.fatal = self.fatal or error
        return error

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

    def _check_pause(self, cursor: Cursor) -> None:
        """Before the main body starts new work: settle as paused if asked to.
        Work already in flight (a fan-out's branches) is waited for, not paused."""
        if self.pause_requested and cursor.seq == MAIN and cursor.writes:
            self.unwinding = PauseRequested()
            raise self.unwinding

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
        if not jsonvalue.is_json_value(message):
            raise ValueError("ctx.log message holds a lone surrogate")
        size = len(message.encode("utf-8"))
        if size > self.max_payload_bytes:
            raise ValueError(f"ctx.log message is {size} bytes, above max_payload_bytes ({self.max_payload_bytes})")
        self._record(self.current(), "log", message)

    def _record(self, cursor: Cursor, kind: str, message: str) -> None:
        position = cursor.position()
        if cursor.logs_since_op + 1 >= POSITION_STRIDE:
            raise ValueError(f"More than {POSITION_STRIDE - 1} progress records between two calls")
        cursor.logs_since_op += 1
        if cursor.writes and position > cursor.high_water:
            cursor.buffer.append((position, kind, cursor.phase_id, message))

    def flush(self, cursor: Cursor, *, step_key: str = "", cut: str | None = None) -> str | None:
        """Write buffered progress (and a running row for ``step_key``) before an op.

        Returns the step's live journaled outcome when the key was journaled
        meanwhile by another sequence.
        """
        if not cursor.writes or not (cursor.buffer or step_key or cut is not None or cursor.pending):
            return None
        row = f"running|{self.epoch}|{now_ms()}|" if step_key else ""
        if cursor.pending is not None:
            flags, existing = self._commit_and_begin(cursor, cut, step_key, row)
        else:
            flags, existing = self.store.begin_op(
                self.run.run_id,
                self.epoch,
                self.run.namespace,
                cursor.seq,
                cut,
                step_key,
                row,
                cursor.buffer,
            )
        if cursor.buffer:
            cursor.high_water = max(cursor.high_water, cursor.buffer[-1][0])
            cursor.buffer.clear()
        self.apply_flags(flags)
        return existing

    def _commit_and_begin(self, cursor: Cursor, cut: str | None, step_key: str, row: str) -> tuple[Flags, str | None]:
        """Journal the held-back step and begin the next call in one round trip."""
        pending = cursor.pending
        assert pending is not None
        cursor.pending = None
        verdict, flags, detail = self.store.commit_begin(
            self.run.run_id, self.epoch, self.run.namespace, cursor.seq, pending, cut, step_key, row, cursor.buffer
        )
        if verdict == "conflict":
            raise self._nondeterminism(
                cursor, f"expected {describe(str(detail))}, got {describe(pending.identity)}", index=pending.index
            )
        if verdict == "winner":
            # Another execution journaled this step first while its producer
            # ran (first write wins). The workflow code since saw this pass's
            # value, but no work has run on it: end the pass, and the next
            # one replays with the journaled value.
            self.rerun = True
            self.unwinding = Suspend()
            raise self.unwinding
        return flags, detail

    def _defers_commits(self, cursor: Cursor) -> bool:
        """A coordinator's main body holds each step's write back to send it
        with the next call: the one place where nothing else journals the
        same keys meanwhile (a fan-out is a barrier), so the held-back value
        is what the journal will say."""
        return cursor.seq == MAIN and cursor.writes and self.target is None

    # -- steps ---------------------------------------------------------------------

    def step(self, key: str, producer: Callable[[], Any], *, volatile: bool, retry: RetryPolicy | None) -> Any:
        if not isinstance(key, str) or not key or len(key) > MAX_KEY_LENGTH:
            raise ValueError(f"Step key must be a non-empty string of at most {MAX_KEY_LENGTH} characters: {key!r}")
        if not callable(producer):
            raise ValueError(f"Step {key!r} producer must be callable, got {type(producer).__name__}")
        cursor = self.current()
        self.check_cancelled()
        if volatile:
            self.flush(cursor)
            self.check_cancelled()
            return self._produce(key, producer, retry).step_result(key)
        identity = f"s|{key}"
        journaled, raw = self._expect(cursor, identity)
        cut: str | None = None
        if journaled and raw is not None:
            outcome = self._decode(raw)
            if outcome.is_live(self.epoch):
                self.flush(cursor)
                cursor.advance()
                return outcome.step_result(key)
            if not cursor.writes:
                raise StaleAttemptError(f"Run {self.run.run_id}: step {key!r} holds an older attempt's failure")
            cut = f"{cursor.index}:{cursor.position()}"
            self._cut(cursor)
        self._check_pause(cursor)
        existing = self.flush(cursor, step_key=key, cut=cut)
        self._check_pause(cursor)  # the flags that came back may ask for a pause
        self.check_cancelled()
        if existing is not None:
            outcome = self._decode(existing)
            self._commit(cursor, identity)
        else:
            outcome = self._produce(key, producer, retry)
            if self._defers_commits(cursor):
                cursor.pending = PendingCommit(
                    cursor.index, identity, f"v:{key}", outcome.encode(), key, self._step_row(outcome)
                )
                cursor.advance()
                return outcome.step_result(key)
            winner = self._commit(cursor, identity, value_field=f"v:{key}", outcome=outcome, step_key=key)
            if winner is not None:
                outcome = self._decode(winner)
        return outcome.step_result(key)

    def _decode(self, raw: str) -> Outcome:
        """A journaled outcome; one that does not parse breaks this execution
        (sticky, like every storage error), so user code that catches it
        cannot journal past it."""
        try:
            return outcomes.decode(raw)
        except StorageCorruptError as exc:
            self.broken = self.broken or exc
            raise

    @staticmethod
    def _cut(cursor: Cursor) -> None:
        """The op at the cursor re-runs an older attempt's failure: what that
        attempt did after it is no longer history, and records from here are new."""
        cursor.history = cursor.history[: cursor.index + 1]
        cursor.high_water = min(cursor.high_water, cursor.position() - 1)

    def _produce(self, key: str, producer: Callable[[], Any], retry: RetryPolicy | None) -> Outcome:
        attempt = 1
        while True:
            try:
                result = producer()
            except FATAL_ERRORS:
                raise
            except Exception as exc:
                delay = retry.delay_after(attempt, exc) if retry is not None else None
                if delay is None:
                    return outcomes.failure(self.epoch, exc)
                attempt += 1
                if self.cancel_event.wait(delay):
                    self.check_cancelled()
                continue
            problem = jsonvalue.json_problem(result)
            if problem is not None:
                not_json = StepFailed(key, "TypeError", f"Step result must be a JSON value: {key}")
                return outcomes.failure(self.epoch, not_json)
            encoded = jsonvalue.dumps(result)
            size = len(encoded.encode("utf-8"))
            if size > self.max_payload_bytes:
                message = f"Step result is {size} bytes, above max_payload_bytes ({self.max_payload_bytes}): {key}"
                return outcomes.failure(self.epoch, StepFailed(key, "PayloadTooLarge", message))
            # The decoded value, not the producer's object: a replay returns
            # the journaled JSON, and the first run must see the same thing
            # (a str-based Enum would otherwise format differently).
            return outcomes.value(jsonvalue.loads(encoded))

    def _commit(
        self,
        cursor: Cursor,
        identity: str,
        *,
        value_field: str = "",
        outcome: Outcome | None = None,
        step_key: str = "",
        raw_value: str = "",
    ) -> str | None:
        """Journal op ``identity`` at the cursor and advance; returns a winning earlier value."""
        encoded = outcome.encode() if outcome is not None else raw_value
        row = self._step_row(outcome) if outcome is not None else ""
        flags, winner, conflict = self.store.record_op(
            self.run.run_id,
            self.epoch,
            cursor.seq,
            cursor.index,
            identity,
            value_field=value_field,
            value=encoded,
            step_key=step_key,
            step_row=row,
        )
        if conflict is not None:
            raise self._nondeterminism(cursor, f"expected {describe(conflict)}, got {describe(identity)}")
        self.apply_flags(flags)
        cursor.advance()
        return winner

    def _step_row(self, outcome: Outcome) -> str:
        """The row a journaled step leaves: the run detail lists journaled
        steps as well as running ones (SPEC §3)."""
        if outcome.kind == "o":
            return f"completed|{self.epoch}|{now_ms()}|"
        return f"failed|{self.epoch}|{now_ms()}|{outcome.error_type}: {outcome.message}"

    # -- agents ------------------------------------------------------------------------

    def agent(self, prompt: str, *, label: str | None, schema: Any, model: str | None) -> Any:
        request = self._agent_request(prompt, label, schema, model)
        agent_id = hashlib.sha256(jsonvalue.dumps(request).encode("utf-8")).hexdigest()[:32]
        cursor = self.current()
        self.check_cancelled()
        identity = f"a|{agent_id}"
        journaled, raw = self._expect(cursor, identity)
        cut: str | None = None
        if journaled and raw is not None:
            outcome = self._decode(raw)
            if outcome.is_live(self.epoch):
                self.flush(cursor)
                cursor.advance()
                return outcome.value if outcome.kind == "o" else None
            if not cursor.writes:
                raise StaleAttemptError(f"Run {self.run.run_id}: agent turn {agent_id} failed in an older attempt")
            cut = f"{cursor.index}:{cursor.position()}"
            self._cut(cursor)
        elif journaled and not cursor.writes:
            raise StaleAttemptError(f"Run {self.run.run_id}: agent turn {agent_id} is not finished yet")
        self.flush(cursor)
        self._check_pause(cursor)
        row = {
            "agent_id": agent_id,
            "label": label,
            "model": model,
            "status": "queued",
            "attempt": self.run.attempt,
            "queued_at": now_ms(),
            "started_at": None,
            "completed_at": None,
            "active_ms": 0,
            "usage": {"prompt_tokens": 0, "completion_tokens": 0, "ai_credits": 0.0},
            "error": None,
        }
        verdict, flags, detail = self.store.agent_call(
            self.run.run_id,
            self.epoch,
            cursor.seq,
            cursor.index,
            agent_id,
            jsonvalue.dumps(request),
            cursor.owner,
            jsonvalue.dumps(row),
            cut,
        )
        if verdict == "conflict":
            raise self._nondeterminism(cursor, f"expected {describe(str(detail))}, got agent turn {agent_id}")
        self.apply_flags(flags)
        if verdict == "hit":
            outcome = self._decode(str(detail))
            cursor.advance()
            return outcome.value if outcome.kind == "o" else None
        if verdict == "limit":
            self.check_cancelled()
        if verdict == "dispatch":
            if self.send_agent is None:
                raise RuntimeError("this execution cannot send agent turns")
            self.send_agent(agent_id, cursor.owner)
        return self._wait_for_agent(cursor)

    def _wait_for_agent(self, cursor: Cursor) -> NoReturn:
        """Suspend the sequence until the turn's task wakes its owner."""
        if cursor.owner == "m":
            self.unwinding = Suspend()
            raise self.unwinding
        cursor.suspended = BranchSuspended()
        raise cursor.suspended

    def _agent_request(self, prompt: str, label: str | None, schema: Any, model: str | None) -> dict[str, Any]:
        if not isinstance(prompt, str) or not prompt.strip():
            raise ValueError("ctx.agent prompt must be a non-empty string")
        if not jsonvalue.is_json_value(prompt):
            raise ValueError("ctx.agent prompt holds a lone surrogate")
        size = len(prompt.encode("utf-8"))
        if size > self.max_payload_bytes:
            raise ValueError(f"ctx.agent prompt is {size} bytes, above max_payload_bytes ({self.max_payload_bytes})")
        for name, value in (("label", label), ("model", model)):
            if value is not None and (not isinstance(value, str) or not value or len(value) > 256):
                raise ValueError(f"ctx.agent {name} must be a non-empty string of at most 256 characters or None")
        if schema is not None:
            if not isinstance(schema, dict) or jsonvalue.json_problem(schema) is not None:
                raise ValueError("ctx.agent schema must be a JSON Schema given as a dict")
            try:
                jsonschema.Draft202012Validator.check_schema(schema)
            except jsonschema.exceptions.SchemaError as exc:
                raise ValueError(f"ctx.agent schema is not a valid JSON Schema: {exc.message}") from None
        return {"prompt": prompt, "label": label, "schema": schema, "model": model}

    # -- replay-safe values ----------------------------------------------------------

    def now(self) -> datetime:
        raw = self._value_op("t|", lambda: datetime.now(UTC).isoformat())
        return datetime.fromisoformat(raw)

    def uuid4(self) -> uuid.UUID:
        return uuid.UUID(self._value_op("u|", lambda: str(uuid.uuid4())))

    def _value_op(self, identity: str, make: Callable[[], str]) -> str:
        cursor = self.current()
        self.check_cancelled()
        journaled, raw = self._expect(cursor, identity)
        if journaled and raw is not None:
            cursor.advance()
            return raw
        if cursor.pending is not None:
            self.flush(cursor)  # a held-back step is journaled before this op
        fresh = make()
        winner = self._commit(cursor, identity, value_field=f"x:{cursor.seq}:{cursor.index}", raw_value=fresh)
        return winner if winner is not None else fresh

    # -- fan-out -----------------------------------------------------------------------

    def parallel(self, thunks: Iterable[Callable[[], Any]]) -> list[Any]:
        items = self._fanout_items(thunks, "parallel", "thunks")
        for index, thunk in enumerate(items):
            if not callable(thunk):
                raise ValueError(f"parallel thunk {index} is not callable: {type(thunk).__name__}")
        return self._fanout("p", list(items))

    def pipeline(self, items: Iterable[Any], stages: Sequence[Callable[[Any, Any, int], Any]]) -> list[Any]:
        values = self._fanout_items(items, "pipeline", "items")
        for index, stage in enumerate(stages):
            if not callable(stage):
                raise ValueError(f"pipeline stage {index} is not callable: {type(stage).__name__}")

        def through_stages(item: Any, index: int) -> Any:
            previous = item
            for stage in stages:
                previous = stage(previous, item, index)
            return previous

        return self._fanout("l", [functools.partial(through_stages, item, i) for i, item in enumerate(values)])

    def _fanout_items(self, items: Iterable[Any], name: str, noun: str) -> list[Any]:
        if isinstance(items, str | bytes | dict) or not isinstance(items, Iterable):
            raise ValueError(f"{name} takes a list of {noun}, got {type(items).__name__}")
        values = list(items)
        if len(values) > self.max_fanout:
            raise ValueError(
                f"{name} accepts at most {self.max_fanout} {noun} (settings.max_fanout), got {len(values)}"
            )
        return values

    def _fanout(self, kind: str, branches: list[Callable[[], Any]]) -> list[Any]:
        cursor = self.current()
        self.check_cancelled()
        identity = f"{kind}|{len(branches)}"
        journaled, _ = self._expect(cursor, identity)
        call = f"{cursor.seq}:{cursor.index}"
        if self.target is not None and self.target.call == call:
            self._run_target(cursor, call, identity, branches)
        if not cursor.writes:
            results = self._collect(call, len(branches))
            if results is None:
                raise StaleAttemptError(f"Run {self.run.run_id}: {describe(identity)} {call} is not finished yet")
            cursor.advance()
            return results
        self.flush(cursor)
        if journaled:
            results = self._collect(call, len(branches))
            if results is not None:
                cursor.advance()
                return results
        else:
            self._check_pause(cursor)
        verdict, cut, detail = self.store.dispatch(
            self.run.run_id, self.epoch, cursor.seq, cursor.index, identity, len(branches), self.token,
            cursor.position(),
        )
        if verdict == "conflict":
            raise self._nondeterminism(cursor, f"expected {describe(detail)}, got {describe(identity)}")
        if cut:
            self._cut(cursor)
        if cursor.seq == MAIN and self.send_branches is not None:
            if verdict == "pending" or detail:
                if detail:
                    self._send(call, detail)
                    self.store.mark_sent(self.run.run_id, self.epoch, call)
                self.unwinding = Suspend()
                raise self.unwinding
        else:
            self._run_locally(call, cursor, branches)
        results = self._collect(call, len(branches))
        if results is None:
            raise StaleAttemptError(f"Run {self.run.run_id}: branches of {call} did not all finish")
        cursor.advance()
        return results

    def _run_target(self, cursor: Cursor, call: str, identity: str, branches: list[Callable[[], Any]]) -> None:
        """In a branch task: run the target's branches that have no live outcome yet."""
        assert self.target is not None
        for index in self.target.indices:
            if index >= len(branches):
                raise self._nondeterminism(cursor, f"branch {index} of {describe(identity)} does not exist")
        raws = self.store.branch_outcomes(self.run.run_id, call, len(branches))
        for index in self.target.indices:
            raw = raws[index]
            if raw is not None and self._decode(raw).is_live(self.epoch):
                continue  # a redelivered task: this branch is journaled already
            try:
                outcome = self.run_branch(cursor, branches[index], index)
            except BranchSuspended:
                continue  # waits for an agent turn, whose task sends this branch again
            self.target.on_outcome(index, outcome)
        self.unwinding = BranchFinished()
        raise self.unwinding

    def _send(self, call: str, indices: Sequence[int]) -> None:
        assert self.send_branches is not None
        try:
            self.send_branches(call, indices)
        except Exception as exc:  # kombu/amqp connection errors have no common base
            error = StorageUnavailableError(f"Broker unavailable while sending branches of {call}: {exc}")
            self.broken = self.broken or error
            raise error from None

    def _collect(self, call: str, count: int) -> list[Any] | None:
        """All branch results when every outcome is journaled and live, else None.

        A live fatal outcome is raised at once: fatal errors abort the whole call.
        """
        raws = self.store.branch_outcomes(self.run.run_id, call, count)
        decoded = [self._decode(raw) if raw is not None else None for raw in raws]
        for outcome in decoded:
            if outcome is not None and outcome.kind == "f" and outcome.is_live(self.epoch):
                error = outcome.fatal_error()
                if isinstance(error, WorkflowCancelled | NonDeterminismError):
                    self.fatal = self.fatal or error
                raise error
        if any(outcome is None or not outcome.is_live(self.epoch) for outcome in decoded):
            return None
        return [outcome.value if outcome.kind == "o" else None for outcome in decoded if outcome is not None]

    def _run_locally(self, call: str, cursor: Cursor, branches: list[Callable[[], Any]]) -> None:
        """Run a nested fan-out's unfinished branches on this worker, in threads."""
        raws = self.store.branch_outcomes(self.run.run_id, call, len(branches))
        todo = [
            j for j, raw in enumerate(raws) if raw is None or not self._decode(raw).is_live(self.epoch)
        ]

        def run_one(j: int) -> bool:
            try:
                outcome = self.run_branch(cursor, branches[j], j)
            except BranchSuspended:
                return False
            self.store.complete_branch(self.run.run_id, self.epoch, call, j, outcome.encode())
            return True

        if not todo:
            return
        with ThreadPoolExecutor(max_workers=min(len(todo), NESTED_FANOUT_THREADS)) as pool:
            finished = [future.result() for future in [pool.submit(run_one, j) for j in todo]]
        if not all(finished):
            # A nested branch waits for an agent: so does the branch around it.
            cursor.suspended = BranchSuspended()
            raise cursor.suspended

    def run_branch(self, parent: Cursor, fn: Callable[[], Any], index: int) -> Outcome:
        """Run one branch in its own sequence; its outcome, never an ordinary exception."""
        cursor = self.open_cursor(f"{parent.seq}.{parent.index}.{index}", writes=True, phase_id=parent.phase_id)
        cursor.owner = parent.owner if parent.seq != MAIN else f"{parent.seq}:{parent.index}/{index}"
        try:
            result = self.run_in(cursor, fn)
        except (StorageUnavailableError, StaleAttemptError, BranchSuspended):
            raise  # nothing to record: this execution cannot, or the branch is not done
        except FATAL_ERRORS as exc:
            return outcomes.failure(self.epoch, exc, fatal=True)
        except Exception as exc:
            self.flush(cursor)
            return outcomes.failure(self.epoch, exc)
        self.flush(cursor)
        problem = jsonvalue.json_problem(result)
        if problem is not None:
            return outcomes.failure(self.epoch, TypeError(f"Branch result must be a JSON value: {problem}"))
        size = len(jsonvalue.dumps(result).encode("utf-8"))
        if size > self.max_payload_bytes:
            too_large = ValueError(f"Branch result is {size} bytes, above max_payload_bytes ({self.max_payload_bytes})")
            return outcomes.failure(self.epoch, too_large)
        return outcomes.value(result)
