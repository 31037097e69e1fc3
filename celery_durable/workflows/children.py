"""``ctx.child`` and ``ctx.start_child``: another registered workflow run as a
child of this one (SPEC §5b).

The key is the call's identity, as a step's, and the child's run id is
derived from this run's id and the key: every attempt, replay and
redelivered message finds the same child, and its run is created only if it
does not exist (``create_run.lua``). The call is journaled and the child
entered in the run's children hash (``child.lua``) *before* the child's run
is created, so a parent that dies in between finds it again, and one
cancelled in between cancels it (it is created cancelled).

``ctx.child`` then waits as a task call does: no worker slot is held, the
sequence suspends, and the child's settling journals its end here
(``child_done.lua``) and wakes the sequence. A replay that reaches the call
before that asks the child's run for its status itself, which is how a
recovered parent, or one whose wake was lost, learns of an end it missed. A
child that completed returns its result; one that ended ``error`` or
``cancelled`` raises ``ChildWorkflowFailed``, retried on resume as a failed
step is; ``timeout`` cancels the child and raises
``StepFailed(error_type="ChildTimeout")``: ``child.lua`` marks the entry
timed out when it first answers ``due``, after which the child's settling
journals nothing (``child_done.lua``), so an attempt that takes over from
one that died after the cancel ends the call by the time-out too, never as
``ChildWorkflowFailed`` for the child it cancelled. ``ctx.start_child`` returns the
child's run id once it exists, and nothing waits for it.

Replay knows nothing of Celery: the engine's side (the registry, creating
and cancelling runs, sending their messages) is a ``ChildPort``
(``tasks/children.py``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any, Protocol

from celery_durable.broker import schema
from celery_durable.broker.child_types import ChildCall, ChildVerdict
from celery_durable.broker.journal import Conflict, PendingCommit
from celery_durable.broker.schema import Identity, Outcome
from celery_durable.errors import EXECUTION_LOST, StaleAttemptError, StepFailed
from celery_durable.workflows import jsonvalue
from celery_durable.workflows.calls import checked_first, reach, start_waited
from celery_durable.workflows.cursor import check_key
from celery_durable.workflows.limits import ceiling_fields, merge_limits, validate_limits
from celery_durable.workflows.ops import Ops
from celery_durable.workflows.throttles import Throttled

if TYPE_CHECKING:
    from celery_durable.workflows.cursor import Cursor
    from celery_durable.workflows.definition import Workflow
    from celery_durable.workflows.replay import Replay

@dataclass(frozen=True, slots=True)
class ChildRequest:
    """A child run to create if it does not exist: checked, JSON, ready to write."""

    key: str
    run_id: str
    workflow: Workflow
    args: Any
    args_json: str
    limits_json: str
    ceilings: Mapping[str, str]


@dataclass(frozen=True, slots=True)
class ChildState:
    """The child's run as its start found it (``created``: just now, pending)."""

    created: bool
    status: str
    reason: str | None = None
    error: str | None = None
    result: Any = None


class ChildPort(Protocol):
    """What replay needs of the engine for child runs (``tasks/children.py``)."""

    def resolve(self, workflow: Any) -> Workflow:
        """The registered workflow a name or handle names; ``ValueError`` if none."""
        ...

    def start(self, request: ChildRequest) -> ChildState:
        """Create the child's run and send its first message, unless it exists:
        then its state as it is."""
        ...

    def cancel(self, request: ChildRequest) -> ChildState | None:
        """Cancel the child (created cancelled, if it does not exist yet);
        its state when it had ended already, else None."""
        ...


class ChildOps(Ops):
    """``ctx.child`` and ``ctx.start_child`` of one execution."""

    def __init__(self, replay: Replay, port: ChildPort | None) -> None:
        super().__init__(replay)
        self._port = port

    def child(
        self,
        key: str,
        workflow: Any,
        args: Any,
        limits: Mapping[str, Any] | None,
        timeout: float | None,
        throttled: Throttled = None,
    ) -> Any:
        replay = self._replay
        cursor, due_from = start_waited(replay, "child", key, timeout)
        identity = Identity.child(key)
        # (A replay check has no port: it starts nothing, and checks no child first.)
        making = partial(self._request, key, workflow, args, limits)
        reached = reach(replay, cursor, identity, f"child {key!r}", making, check_first=self._port is not None)
        if isinstance(reached, Outcome):
            return _returned(key, reached)
        request, found = reached
        # Its slot goes back when the child's end is journaled (here, or tasks/children.py).
        slot = replay.throttles.gate(cursor, f"k/{key}", throttled, f"child {key!r}")
        now = replay.journal.now_ms()
        result = self._enter(cursor, request, due_from(now), found.cut, wait=True)
        if result.verdict is ChildVerdict.HIT and result.outcome is not None:
            cursor.advance()
            replay.throttles.release(slot)
            return _returned(key, replay.decode(result.outcome))
        request = self._journaled(request, result)
        if result.verdict is ChildVerdict.DUE:
            return self._timed_out(cursor, request, timeout)
        state = self._start(request)
        if state.status in schema.SETTLED_FOR_PARENT:
            ended = schema.child_outcome(
                key, request.run_id, request.workflow.name, state.status, state.reason, state.error, state.result
            )
            try:
                return self._journal_end(cursor, request, ended)
            finally:
                replay.throttles.release(slot)
        # Waiting holds nothing: a pause asked for meanwhile settles the run now.
        replay.check_pause(cursor)
        replay.wait_for_wake(cursor)

    def start_child(self, key: str, workflow: Any, args: Any, limits: Mapping[str, Any] | None) -> str:
        replay = self._replay
        check_key("Child", key)
        cursor = replay.current()
        replay.check_cancelled()
        identity = Identity.start_child(key)
        # (A replay check has no port: it starts nothing, and checks no child first.)
        making = partial(self._request, key, workflow, args, limits)
        made = checked_first(cursor, identity, making) if self._port is not None else None
        journaled, raw = replay.expect(cursor, identity)
        if raw is not None:
            cursor.advance()
            return raw
        if not cursor.writes:
            raise StaleAttemptError(f"Run {replay.run.run_id}: start_child {key!r} is not journaled yet")
        request = made if made is not None else making()
        replay.flush(cursor)
        if not journaled:
            replay.check_pause(cursor)
        result = self._enter(cursor, request, None, None, wait=False)
        request = self._journaled(request, result)
        self._start(request)
        # Journaled once the child exists: a replay that finds the id has nothing to start.
        replay.commit(cursor, PendingCommit(cursor.index, identity, schema.value_field(cursor.seq, cursor.index),
                                            request.run_id))
        return request.run_id

    # -- the steps of a call -------------------------------------------------------------

    def _enter(
        self, cursor: Cursor, request: ChildRequest, due: int | None, cut: str | None, *, wait: bool
    ) -> ChildCall:
        """Journal the call and enter the child in the children hash (``child.lua``)."""
        replay = self._replay
        identity = Identity.child(request.key) if wait else Identity.start_child(request.key)
        result = replay.journal.child(
            cursor.seq, cursor.index, request.key, cursor.owner, due, cut, request.run_id, request.workflow.name,
            wait=wait,
        )
        if isinstance(result, Conflict):
            replay.conflict(cursor, result, identity)
        replay.apply_flags(result.flags)
        return result

    def _journaled(self, request: ChildRequest, result: ChildCall) -> ChildRequest:
        """The child the journal names under the key: the one asked for, or the
        workflow started under the key before (it wins, as a step key's value does)."""
        if result.workflow == request.workflow.name:
            return request
        try:
            return self._request(request.key, result.workflow, request.args, None)
        except ValueError:
            return request  # its run exists already (it was created under the key before): found, not made

    def _start(self, request: ChildRequest) -> ChildState:
        if self._port is None:
            raise RuntimeError("this execution cannot start child runs")
        try:
            return self._port.start(request)
        except EXECUTION_LOST as exc:
            # Sticky, as the journal's own failures are: workflow code that
            # catches it must not go on past a call whose child may not exist.
            raise self._replay.break_with(exc) from None

    def _timed_out(self, cursor: Cursor, request: ChildRequest, timeout: float | None) -> Any:
        """The time-out passed: the child is cancelled first (a crash before the
        time-out is journaled cancels it again), then the failure journaled."""
        assert self._port is not None
        try:
            ended = self._port.cancel(request)
        except EXECUTION_LOST as exc:
            raise self._replay.break_with(exc) from None
        if ended is not None and ended.status == "completed":
            # It completed before it could be cancelled: its end was not told yet.
            outcome = schema.child_outcome(
                request.key, request.run_id, request.workflow.name, ended.status, None, None, ended.result
            )
            return self._journal_end(cursor, request, outcome)
        within = f"within {timeout:g} s" if timeout is not None else "in time"
        message = (
            f"Child run {request.run_id} of workflow {request.workflow.name!r} (key {request.key!r}) "
            f"did not finish {within}; it was cancelled"
        )
        failed = StepFailed(request.key, schema.CHILD_TIMEOUT, message, found_by_engine=True)
        return self._journal_end(cursor, request, schema.failure_outcome(self._replay.epoch, failed))

    def _journal_end(self, cursor: Cursor, request: ChildRequest, ended: Outcome) -> Any:
        """Journal an end this execution found itself, and return it (or the
        end journaled first by the child's own settling)."""
        replay = self._replay
        done = replay.journal.child_done(request.key, request.run_id, ended)
        cursor.advance()
        return _returned(request.key, replay.decode(done.outcome) if done.outcome else ended)

    def _request(self, key: str, workflow: Any, args: Any, limits: Mapping[str, Any] | None) -> ChildRequest:
        """The child checked before anything is written: an unknown workflow,
        args its ``args_schema`` refuses or bad limits are a ``ValueError``."""
        if self._port is None:
            raise RuntimeError("this execution cannot start child runs")
        definition = self._port.resolve(workflow)
        args = {} if args is None else args
        args_json = jsonvalue.encode_payload(
            args, self._replay.max_payload_bytes, noun=f"ctx.child {key!r} args",
            not_json="{noun} must be JSON values: {problem}",
            too_large="{noun} are {size} bytes, above max_payload_bytes ({limit})",
        )
        plain = jsonvalue.loads(args_json)
        definition.validate_args(plain)
        if limits is not None:
            validate_limits(limits, allow_none=True)
        effective = merge_limits(dict(definition.limits), dict(limits) if limits is not None else None)
        return ChildRequest(
            key=key,
            run_id=schema.child_run_id(self._replay.run.run_id, key),
            workflow=definition,
            args=plain,
            args_json=args_json,
            limits_json=jsonvalue.dumps(effective),
            ceilings=ceiling_fields(effective),
        )


def _returned(key: str, outcome: Outcome) -> Any:
    """What the call returns for the child's journaled end, or raises."""
    if outcome.kind == "o":
        return outcome.value
    if outcome.kind == "f":
        raise outcome.fatal_error()
    raise schema.child_error(key, outcome)
