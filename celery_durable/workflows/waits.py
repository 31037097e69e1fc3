"""Durable waits: ``ctx.sleep``, ``ctx.sleep_until`` and ``ctx.wait_for_signal``.

A wait is an op like any other: journaled in its sequence, its due time
fixed the first time it is reached (so a resumed or recovered run keeps the
original time, and never waits again for a wait that ended). When it cannot
end at once, the sequence suspends without holding a worker: the wait is
registered in Redis, and the recovery sweep (for a due timer) or
``signal_workflow_run`` (for a signal) journals how the wait ended as it
wakes its owner, whose replay finds it in the journal it read (or, for a
wait those could not end, journals it itself: ``wait.lua``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from celery_durable import telemetry
from celery_durable.broker import schema
from celery_durable.broker.journal import Conflict
from celery_durable.broker.schema import Identity
from celery_durable.errors import StaleAttemptError
from celery_durable.names import SIGNAL_NAME_MAX, SIGNAL_NAME_PATTERN, name_rule
from celery_durable.workflows.ops import Ops

if TYPE_CHECKING:
    pass

APPROVAL_SIGNAL = "approval"
"""The signal a person sends to approve or reject (``celery-durable runs approve``,
the web view): payload ``{"approved": bool, "note": str | None}``."""
MAX_WAIT_SECONDS = 10 * 365 * 86_400
"""Ten years: longer is not a wait but a typo (and still a finite due time)."""


@dataclass(frozen=True, slots=True)
class Signal:
    """How ``ctx.wait_for_signal`` ended: the signal's ``payload`` when
    ``received``, else ``received`` is false (its timeout passed first), so a
    ``None`` payload and a time-out are told apart."""

    name: str
    payload: Any
    received: bool


class WaitOps(Ops):
    """The durable waits of one execution."""

    def sleep(self, seconds: float | timedelta) -> None:
        delay = _seconds(seconds, "ctx.sleep")
        self._wait(Identity.SLEEP, "timer", "", lambda now: now + math.ceil(delay * 1000))

    def sleep_until(self, when: datetime) -> None:
        if not isinstance(when, datetime):
            raise ValueError(f"ctx.sleep_until takes a datetime, got {type(when).__name__}")
        if when.tzinfo is None or when.utcoffset() is None:
            raise ValueError("ctx.sleep_until takes an aware datetime (with a timezone), got a naive one")
        due = math.ceil(when.timestamp() * 1000)
        self._wait(Identity.SLEEP, "timer", "", lambda now: due)

    def wait_for_signal(self, name: str, timeout: float | timedelta | None = None) -> Signal:
        check_signal_name(name)
        delay = None if timeout is None else _seconds(timeout, "ctx.wait_for_signal timeout")
        outcome = self._wait(
            Identity.signal(name),
            "signal",
            name,
            lambda now: None if delay is None else now + math.ceil(delay * 1000),
        )
        return Signal(name=name, payload=outcome.get("payload"), received=bool(outcome.get("received")))

    def _wait(self, identity: str, kind: str, name: str, due_from: Any) -> dict[str, Any]:
        replay = self._replay
        cursor = replay.current()
        replay.check_cancelled()
        journaled, raw = replay.expect(cursor, identity)
        if journaled and raw is not None:
            replay.flush(cursor)
            if (watching := telemetry.observer) is not None:
                watching.wait(replay, cursor.seq, kind, name, hit=True, ended=True)
            cursor.advance()
            return schema.wait_outcome(raw)
        if not cursor.writes:
            raise StaleAttemptError(f"Run {replay.run.run_id}: {schema.describe(identity)} has not ended yet")
        replay.flush(cursor)
        if not journaled:
            replay.check_pause(cursor)
        due: int | None = due_from(replay.journal.now_ms())
        result = replay.journal.wait(cursor.seq, cursor.index, identity, kind, name, due, cursor.owner)
        if isinstance(result, Conflict):
            replay.conflict(cursor, result, identity)
        replay.apply_flags(result.flags)
        if (watching := telemetry.observer) is not None:
            watching.wait(replay, cursor.seq, kind, name, hit=journaled, ended=result.done)
        if result.done and result.outcome is not None:
            cursor.advance()
            return schema.wait_outcome(result.outcome)
        # Waiting holds nothing: a pause asked for meanwhile settles the run now.
        replay.check_pause(cursor)
        replay.wait_for_wake(cursor)


def check_signal_name(name: object) -> str:
    if not isinstance(name, str) or not SIGNAL_NAME_PATTERN.match(name):
        raise ValueError(f"A signal name must be {name_rule(SIGNAL_NAME_MAX)}, got {name!r:.80}")
    return name


def seconds_of(value: object) -> float | None:
    """A number of seconds or a ``timedelta`` (a wait's, a schedule's), as
    seconds; None for anything else, ``True`` included."""
    if isinstance(value, timedelta):
        return value.total_seconds()
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _seconds(value: object, what: str) -> float:
    seconds = seconds_of(value)
    if seconds is None:
        raise ValueError(f"{what} takes seconds (a number) or a timedelta, got {type(value).__name__}")
    if not math.isfinite(seconds) or seconds < 0:
        raise ValueError(f"{what} takes a finite number of seconds, not negative, got {value!r}")
    if seconds > MAX_WAIT_SECONDS:
        raise ValueError(f"{what} is longer than ten years ({seconds:g} s)")
    return seconds
