"""Steps and replay-safe values: the ops that run inline in their sequence.

``ctx.step`` checks its key against the journal: a hit returns the journaled
value; a miss shows the step running, calls the producer, checks that the
result is JSON and journals it. In the coordinator's main body the journal
write is held back to travel with the next call's begin (one script per
straight-line step); elsewhere, where several executions may journal one
key, it is written at once and the first write wins.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from celery_durable import telemetry
from celery_durable.broker import schema
from celery_durable.broker.journal import PendingCommit
from celery_durable.broker.schema import Identity, Outcome
from celery_durable.errors import FATAL_ERRORS, StepFailed
from celery_durable.workflows import jsonvalue
from celery_durable.workflows.cursor import check_key
from celery_durable.workflows.ops import Ops
from celery_durable.workflows.retry import RetryPolicy
from celery_durable.workflows.throttles import Throttled

if TYPE_CHECKING:
    from celery_durable.workflows.replay import Replay


class StepOps(Ops):
    """``ctx.step``, ``ctx.now`` and ``ctx.uuid4`` of one execution."""

    def __init__(self, replay: Replay) -> None:
        super().__init__(replay)
        self.ran: list[str] = []
        """Keys of the steps this execution ran (journal hits not counted) in
        branch sequences: what a branch task shows Flower it did (``tasks/flower_names.py``)."""

    def step(
        self,
        key: str,
        producer: Callable[[], Any],
        *,
        volatile: bool,
        retry: RetryPolicy | None,
        throttled: Throttled = None,
    ) -> Any:
        replay = self._replay
        check_key("Step", key)
        if not callable(producer):
            raise ValueError(f"Step {key!r} producer must be callable, got {type(producer).__name__}")
        if retry is not None and not isinstance(retry, RetryPolicy):
            # Else only a failing producer found out, with an AttributeError in place of its StepFailed.
            raise ValueError(f"Step {key!r} retry must be a RetryPolicy or None, got {type(retry).__name__}")
        cursor = replay.current()
        replay.check_cancelled()
        if volatile:
            replay.flush(cursor)
            replay.check_cancelled()
            self._ran(cursor.seq, key)
            return self.produce(key, producer, retry).step_result(key)
        identity = Identity.step(key)
        found = replay.recall(cursor, identity, f"step {key!r}")
        if found.outcome is not None:
            if (watching := telemetry.observer) is not None:
                watching.hit(replay, "step", cursor.seq, key)
            return found.outcome.step_result(key)
        replay.check_pause(cursor)
        slot = None if throttled is None else replay.throttles.gate(cursor, f"s/{key}", throttled, f"step {key!r}")
        started = replay.journal.now_ms()
        running = schema.StepRow.running(replay.run.attempt, started, schema.call_id(cursor.seq, cursor.index)).encode()
        existing = replay.flush(cursor, step_key=key, step_row=running, cut=found.cut)
        replay.check_pause(cursor)  # the flags that came back may ask for a pause
        replay.check_cancelled()
        field = schema.step_field(key)
        if existing is not None:
            outcome = replay.decode(existing)
            replay.commit(cursor, PendingCommit(cursor.index, identity))
            if slot is not None:
                replay.throttles.release(slot)
            return outcome.step_result(key)
        self._ran(cursor.seq, key)
        if (watching := telemetry.observer) is None:
            outcome = self.produce(key, producer, retry)
        else:
            outcome = watching.step(replay, cursor.seq, key, lambda: self.produce(key, producer, retry))
        commit = PendingCommit(
            cursor.index, identity, field, outcome.encode(), key, replay.step_row(cursor, started, outcome)
        )
        if slot is None and replay.holds_steps(cursor):
            replay.hold(cursor, commit)
            cursor.advance()
            return outcome.step_result(key)
        winner = replay.commit(cursor, commit)
        # A throttled step's outcome is journaled at once (never held back), then its slot goes back.
        if slot is not None:
            replay.throttles.release(slot)
        if winner is not None:
            outcome = replay.decode(winner)
        return outcome.step_result(key)

    def _ran(self, seq: str, key: str) -> None:
        if seq != schema.MAIN:
            self.ran.append(key)  # list.append is atomic: nested branches run on threads

    def produce(self, key: str, producer: Callable[[], Any], retry: RetryPolicy | None) -> Outcome:
        """Call the producer (with its retries): its outcome, never an ordinary exception."""
        replay = self._replay
        attempt = 1
        while True:
            try:
                result = producer()
            except FATAL_ERRORS:
                raise
            except Exception as exc:
                delay = retry.delay_after(attempt, exc) if retry is not None else None
                if delay is None:
                    return schema.failure_outcome(replay.epoch, exc)
                attempt += 1
                if replay.cancel_event.wait(delay):
                    replay.check_cancelled()
                continue
            return result_outcome(key, result, replay.epoch, replay.max_payload_bytes)

    # -- replay-safe values ----------------------------------------------------------

    def now(self) -> datetime:
        clock = self._replay.journal
        raw = self._value_op(Identity.NOW, lambda: datetime.fromtimestamp(clock.now_ms() / 1000, tz=UTC).isoformat())
        return datetime.fromisoformat(raw)

    def uuid4(self) -> uuid.UUID:
        return uuid.UUID(self._value_op(Identity.UUID, lambda: str(uuid.uuid4())))

    def _value_op(self, identity: str, make: Callable[[], str]) -> str:
        replay = self._replay
        cursor = replay.current()
        replay.check_cancelled()
        journaled, raw = replay.expect(cursor, identity)
        if journaled and raw is not None:
            cursor.advance()
            return raw
        if cursor.held is not None:
            replay.flush(cursor)  # a held-back step is journaled before this op
        fresh = make()
        commit = PendingCommit(cursor.index, identity, schema.value_field(cursor.seq, cursor.index), fresh)
        winner = replay.commit(cursor, commit)
        return winner if winner is not None else fresh


def result_outcome(key: str, result: Any, epoch: int, max_bytes: int) -> Outcome:
    """A step's (or a called task's) result as its outcome: a JSON value, or why not."""
    try:
        encoded = jsonvalue.encode_payload(
            result,
            max_bytes,
            noun="Step result",
            key=key,
            not_json="{noun} must be a JSON value: {key}",
            too_large=jsonvalue.TOO_LARGE + ": {key}",
        )
    except jsonvalue.PayloadError as exc:
        kind = "TypeError" if exc.reason == "not_json" else "PayloadTooLarge"
        return schema.failure_outcome(epoch, StepFailed(key, kind, str(exc), found_by_engine=True))
    # The decoded value, not the producer's object: a replay returns the
    # journaled JSON, and the first run must see the same thing (a str-based
    # Enum would otherwise format differently).
    return schema.value_outcome(jsonvalue.loads(encoded))
