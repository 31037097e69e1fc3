"""Fan-out: ``ctx.parallel`` and ``ctx.pipeline``, dispatched across the fleet.

A fan-out is an op of its sequence. In a coordinator pass's main body it is
*dispatched*: the op is journaled (``Journal.dispatch``, which says which
branches this execution sends), its unfinished branches go to the steps
queue as Celery tasks, counted in flight before they are published, and the
pass *suspends*; the last branch to finish wakes the coordinator, whose next
pass replays up to the fan-out and *collects* every outcome from the
journal. A fan-out narrow enough to start as a single task runs in the pass
itself instead (``InlineBranches``). A branch task replays the main body up
to its fan-out and runs only its own branches; a fan-out nested inside a
branch runs on that branch's worker, in threads. How branches run here is
``branches``; how each one's completion is journaled, ``completion``.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable, Iterable, Sequence, Sized
from typing import TYPE_CHECKING, Any

from celery_durable.broker import schema
from celery_durable.broker.journal import Conflict, Dispatch
from celery_durable.broker.schema import Identity, describe
from celery_durable.errors import NonDeterminismError, StaleAttemptError, StorageUnavailableError, WorkflowCancelled
from celery_durable.workflows.branch_work import BranchSender
from celery_durable.workflows.branches import run_inline, run_nested, run_target
from celery_durable.workflows.cursor import Cursor
from celery_durable.workflows.ops import Ops
from celery_durable.workflows.stopping import Mode

if TYPE_CHECKING:
    pass

Thunk = Callable[[], Any]

ERRORS = ("none", "raise", "return")
"""What a failed slot gives (SPEC §4): None (the seed's rule), the first
failure raised from the call once every branch finished, or the exception
object in its slot."""


class FanoutOps(Ops):
    """``ctx.parallel`` and ``ctx.pipeline`` of one execution."""

    def parallel(self, thunks: Iterable[Thunk], errors: str = "none") -> list[Any]:
        _check_errors("parallel", errors)
        items = self._items(thunks, "parallel", "thunks")
        for index, thunk in enumerate(items):
            if not callable(thunk):
                raise ValueError(f"parallel thunk {index} is not callable: {type(thunk).__name__}")
        return self._fanout("p", list(items), errors)

    def pipeline(
        self, items: Iterable[Any], stages: Sequence[Callable[[Any, Any, int], Any]], errors: str = "none"
    ) -> list[Any]:
        _check_errors("pipeline", errors)
        values = self._items(items, "pipeline", "items")
        for index, stage in enumerate(stages):
            if not callable(stage):
                raise ValueError(f"pipeline stage {index} is not callable: {type(stage).__name__}")

        def through_stages(item: Any, index: int) -> Any:
            previous = item
            for stage in stages:
                previous = stage(previous, item, index)
            return previous

        branches: list[Thunk] = [functools.partial(through_stages, item, i) for i, item in enumerate(values)]
        return self._fanout("l", branches, errors)

    def _items(self, items: Iterable[Any], name: str, noun: str) -> list[Any]:
        if isinstance(items, str | bytes | dict) or not isinstance(items, Iterable):
            raise ValueError(f"{name} takes a list of {noun}, got {type(items).__name__}")
        limit = self._replay.max_fanout
        # One past the cap, not all of it: an endless generator of thunks hung
        # the pass, its memory growing, instead of being refused.
        values = list(itertools.islice(items, limit + 1))
        if len(values) > limit:
            got = len(items) if isinstance(items, Sized) else f"more than {limit}"
            raise ValueError(f"{name} accepts at most {limit} {noun} (settings.max_fanout), got {got}")
        return values

    def _fanout(self, kind: str, branches: list[Thunk], errors: str) -> list[Any]:
        cursor = self._replay.current()
        call = schema.call_id(cursor.seq, cursor.index)
        return slots(self._outcomes(kind, branches), errors, call)

    def _outcomes(self, kind: str, branches: list[Thunk]) -> list[schema.Outcome]:
        replay = self._replay
        cursor = replay.current()
        replay.check_cancelled()
        identity = Identity.fanout(kind, len(branches))
        journaled, _ = replay.expect(cursor, identity)
        call = schema.call_id(cursor.seq, cursor.index)
        target = replay.target
        if target is not None and target.call == call:
            run_target(replay, cursor, identity, branches)  # a branch task's own fan-out: it ends there
        if not cursor.writes:
            # The main body of a branch task, on its way to a later fan-out.
            results = self._collect(call, len(branches), stands=cursor.compensated_after)
            if results is None:
                raise StaleAttemptError(f"Run {replay.run.run_id}: {describe(identity)} {call} is not finished yet")
            cursor.advance()
            return results
        replay.flush(cursor)
        if not journaled:
            replay.check_pause(cursor)
            if replay.cancelled() and not cursor.compensating:
                raise replay.meet_fatal(WorkflowCancelled(f"Run {replay.run.run_id} was cancelled"))
        index = cursor.index
        try:
            return self._journaled(cursor, call, identity, branches, journaled)
        except WorkflowCancelled:
            # Met at a journaled fan-out: stepped over, as Cursor.stops_cancelled
            # does, so that what a saga journals next goes after it.
            if cursor.index == index:
                cursor.advance()
            raise

    def _journaled(
        self, cursor: Cursor, call: str, identity: str, branches: list[Thunk], journaled: bool
    ) -> list[schema.Outcome]:
        """A fan-out of a writing sequence: its results, collected, or its
        branches dispatched (and run here, or sent) until they are."""
        replay = self._replay
        if journaled:
            # An older attempt's failed branches run again (SPEC §4), unless
            # that attempt began compensating after the fan-out: then they
            # stand as they are (``Cursor.compensated_after``), nothing is sent.
            results = self._collect(call, len(branches), stands=cursor.compensated_after)
            if results is not None:
                cursor.advance()
                return results
        ending = replay.cancelled() and not cursor.compensating
        if ending and not replay.run.compensates:
            # A cancelled run replays through journaled fan-outs whose branches
            # are all in (check_cancelled); here it would send or run new work.
            raise replay.meet_fatal(WorkflowCancelled(f"Run {replay.run.run_id} was cancelled"))
        result = replay.journal.dispatch(
            cursor.seq, cursor.index, identity, len(branches), replay.token, cursor.position()
        )
        if isinstance(result, Conflict):
            replay.conflict(cursor, result, identity)
        if result.cut:
            cursor.cut_here()
        results = None
        if ending and result.pending:
            self._wake_to_compensate(call)
        if replay.mode is Mode.PASS and cursor.is_main:
            results = self._dispatched(cursor, call, identity, branches, result)
        else:
            run_nested(replay, cursor, call, branches)
        if results is None:
            results = self._collect(call, len(branches))
        if results is None:
            raise StaleAttemptError(f"Run {replay.run.run_id}: branches of {call} did not all finish")
        cursor.advance()
        return results

    def _dispatched(
        self, cursor: Cursor, call: str, identity: str, branches: list[Thunk], result: Dispatch
    ) -> list[schema.Outcome] | None:
        """In a coordinator pass: run or send the branches the dispatch left;
        the results when this pass has them all, else it suspends until the
        outcomes still to come wake the next (None: nothing was left)."""
        replay = self._replay
        if result.pending and result.in_flight <= 1:
            # No branch runs or waits in a queue: those left wait for the
            # outside world (a timer, a signal, a task). A pause asked for
            # settles the run now instead of waiting with them.
            replay.check_pause(cursor)
        inline = replay.port.inline
        if result.indices and inline is not None and len(result.indices) <= inline.widest:
            results = self._run_inline(cursor, call, identity, branches, result.indices)
            if results is not None:
                return results
        elif result.indices:
            self._send(call, result.indices)
            replay.journal.mark_sent(call)
        if result.pending or result.indices:
            raise replay.suspend()
        return None

    def _run_inline(
        self, cursor: Cursor, call: str, identity: str, branches: list[Thunk], indices: Sequence[int]
    ) -> list[schema.Outcome] | None:
        """Run in this pass the branches a dispatch left to send; their
        results, or None when some wait or were handed on: those are in
        flight as sent branches would be, and their outcomes wake the next pass."""
        replay = self._replay
        inline = replay.port.inline
        assert inline is not None

        def hand_off(given: list[int], _tasks: int) -> bool:
            self._send(call, given, inline.send)
            return True

        run_inline(replay, cursor, call, identity, branches, indices, hand_off)
        results = self._collect(call, len(branches))
        if results is None:
            # Not to be sent again by a later execution of this attempt.
            replay.journal.mark_sent(call)
        else:
            inline.forget(call)
        return results

    def _wake_to_compensate(self, call: str) -> None:
        """The run is cancelled and its sagas compensate: the fan-out's branches
        that wait are sent again, to meet the cancellation where they wait and
        undo what they did; their outcomes, all of them, wake the next pass
        (``_collect`` waits for every one before it raises the cancellation)."""
        waiting = self._replay.journal.wake_branches(call)
        if waiting:
            self._send(call, waiting)

    def _send(self, call: str, indices: Sequence[int], sender: BranchSender | None = None) -> Sequence[str]:
        replay = self._replay
        send = sender or replay.port.send_branches
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
            # The messages were forgotten as they failed (Engine._publish), and
            # the pass, run again in place, is a new execution: it sends them.
            error = StorageUnavailableError(f"Broker unavailable while sending branches of {call}: {exc}")
            raise replay.break_with(error) from None

    def _collect(
        self, call: str, count: int, *, stands: Callable[[], bool] | None = None
    ) -> list[schema.Outcome] | None:
        """All branch outcomes when every one is journaled and live, else None;
        where ``stands()`` (asked only then), an older attempt's failed branch
        counts as it is: a saga began compensating after the fan-out
        (``Cursor.compensated_after``).

        A live fatal outcome is raised at once: fatal errors abort the whole call.
        """
        replay = self._replay
        raws = replay.journal.branch_outcomes(call, count)
        decoded = [replay.decode(raw) if raw is not None else None for raw in raws]
        missing = any(outcome is None or not outcome.is_live(replay.epoch) for outcome in decoded)
        if missing and stands is not None and stands():
            missing = any(
                outcome is None or (outcome.kind == "f" and not outcome.is_live(replay.epoch)) for outcome in decoded
            )
        if missing and replay.cancelled() and replay.run.compensates:
            return None  # cancelled: every branch compensates and ends before the cancellation goes on
        for outcome in decoded:
            if outcome is not None and outcome.kind == "f" and outcome.is_live(replay.epoch):
                error = outcome.fatal_error()
                if isinstance(error, WorkflowCancelled | NonDeterminismError):
                    replay.meet_fatal(error)
                raise error
        if missing:
            return None
        return [outcome for outcome in decoded if outcome is not None]


def _check_errors(name: str, errors: object) -> None:
    if not isinstance(errors, str) or errors not in ERRORS:
        raise ValueError(f"{name} errors must be one of 'none', 'raise', 'return', got {errors!r:.80}")


def slots(outcomes: list[schema.Outcome], errors: str, call: str) -> list[Any]:
    """What the call returns for its branches' outcomes, as ``errors`` says (``ERRORS``)."""
    if errors == "none":
        return [outcome.result for outcome in outcomes]
    values = [
        outcome.result if outcome.kind == "o" else schema.slot_error(outcome, f"{call}/{j}")
        for j, outcome in enumerate(outcomes)
    ]
    if errors == "raise":
        for value, outcome in zip(values, outcomes, strict=True):
            if outcome.kind != "o":
                raise value
    return values
