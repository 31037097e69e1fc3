"""``ctx.saga()``: what undoes a block's work when it fails for good (SPEC §5c).

``saga.compensate(key, producer)`` registers an undo; nothing runs then.
When an exception leaves the block — a failed step, a failed child, any
ordinary exception, or the run's cancellation — the undos run in reverse
order of registration, each a journaled step under its own key, so a crash
while compensating resumes with the ones not yet journaled; then the same
exception goes on, or ``CompensationFailed`` (with it as ``__cause__``) when
an undo raised. A normal exit runs nothing; so do the engine's own ways out
(a pass that suspends, a pause) and the fatal errors that end an attempt
without settling the run (its authority lost, the store unavailable, a
ceiling reached, nondeterminism): the attempt that takes over replays to
the same point and compensates there.

Compensating is replay, like everything else: the registrations are made
again by each replay as it passes them, and a compensation journaled by an
earlier attempt returns its journaled value. The failure that started the
compensations, and any failure before it in its sequence, stands in the
attempts after it, though failures are otherwise run again
(``Cursor.compensated_after``; the journal names the last compensation of
each sequence): run again and passing, it would end the block well with
its work already undone, or cut the journaled undos away. A compensation
that failed is a step like any other: a resumed attempt runs it again, in
place, its later ones staying history (the cut goes past the last of them:
``Cursor.cut_here``); with none failing now, the first exception goes on.
Not once a compensation is journaled past its saga (an enclosing or a later
saga undid work for the exception it raised then): it stands there.
A cancelled run's next op raises ``WorkflowCancelled``; its compensations must still run, so while a
saga compensates, cancellation is not raised at its ops (``Cursor.compensating``;
the count is the execution's stop state, ``StopState.compensation``),
and a run whose saga registered anything is marked (``compensable.lua``):
a pass that finds it cancelled replays it to where it waits, instead of
settling at once (``passes.main_pass``), and compensates there.

Scope is lexical: a saga undoes only what was registered with it, in the
sequence it runs in. Nested sagas each undo their own, innermost first, as
the exception passes through them; a saga in a ``parallel`` branch undoes
that branch only. An undo registered from a branch with a saga opened
outside it is refused (a ``ValueError`` in that branch): the block's
replays after the fan-out take its results from the journal without
running its thunks (and a branch may have run in another process), so such
an undo was kept or lost by where and when the branches ran.
"""

from __future__ import annotations

from collections.abc import Callable
from types import TracebackType
from typing import TYPE_CHECKING, Any

from celery_durable.broker.schema import Identity
from celery_durable.errors import (
    EXECUTION_LOST,
    CompensationFailed,
    NonDeterminismError,
    StepFailed,
    WorkflowCancelled,
    WorkflowLimitReached,
)
from celery_durable.workflows.cursor import MAX_KEY_LENGTH

if TYPE_CHECKING:
    from celery_durable.workflows.cursor import Cursor
    from celery_durable.workflows.replay import Replay

NOT_COMPENSATED: tuple[type[Exception], ...] = (*EXECUTION_LOST, WorkflowLimitReached, NonDeterminismError)
"""Fatal errors that end the attempt without settling its run: nothing is undone in it."""


class Saga:
    """The compensations of one ``with ctx.saga() as saga:`` block."""

    def __init__(self, replay: Callable[[], Replay]) -> None:
        self._replay = replay
        self._undo: list[tuple[str, Callable[[], Any]]] = []
        self._marks: list[tuple[Cursor, str]] = []
        """Each undo's identity, on the block's sequence (``Cursor.undo``)."""
        self._seq: str | None = None
        """The sequence the block runs in: the only one that may register an undo."""

    def compensate(self, key: str, producer: Callable[[], Any]) -> None:
        """Register ``producer`` to undo what the block did so far, as a step
        under ``key`` should the block fail; nothing runs now."""
        if not isinstance(key, str) or not key or len(key) > MAX_KEY_LENGTH:
            raise ValueError(
                f"Compensation key must be a non-empty string of at most {MAX_KEY_LENGTH} characters: {key!r}"
            )
        if not callable(producer):
            raise ValueError(f"Compensation {key!r} producer must be callable, got {type(producer).__name__}")
        replay = self._replay()
        cursor = replay.current()
        if self._seq is not None and cursor.seq != self._seq:
            raise ValueError(
                f"Compensation {key!r} is registered in a branch with a saga opened outside it: a saga undoes "
                "only what its own sequence registers; open a saga inside the branch, or register the undo "
                "after the fan-out returns"
            )
        self._undo.append((key, producer))
        cursor.undo.append(Identity.step(key))
        self._marks.append((cursor, Identity.step(key)))
        replay.mark_compensable(cursor)

    def __enter__(self) -> Saga:
        self._seq = self._replay().current().seq
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        undo, self._undo = self._undo, []
        marks, self._marks = self._marks, []
        for cursor, identity in marks:
            cursor.undo.remove(identity)
        if exc is None or not undo or not isinstance(exc, Exception):
            return  # a normal exit, nothing registered, or the engine's own way out
        replay = self._replay()
        if not _compensates_after(replay, exc):
            return
        failures = _run(replay, undo, exc)
        if failures:
            raise CompensationFailed(failures) from exc


def _compensates_after(replay: Replay, exc: Exception) -> bool:
    if replay.broken is not None or replay.unwinding is not None:
        return False
    fatal = replay.fatal
    if fatal is not None and not isinstance(fatal, WorkflowCancelled):
        return False
    return not isinstance(exc, NOT_COMPENSATED)


def _run(replay: Replay, undo: list[tuple[str, Callable[[], Any]]], cause: Exception) -> list[dict[str, str]]:
    """Each undo in reverse, as a step; the failures, in the order they ran."""
    keys = [key for key, _ in reversed(undo)]
    replay.system(f"Compensating after {type(cause).__name__}: running {', '.join(keys)}")
    failures: list[dict[str, str]] = []
    with replay.compensation(replay.current(), len(undo)):
        for key, producer in reversed(undo):
            try:
                replay.steps.step(key, producer, volatile=False, retry=None)
            except StepFailed as failed:
                failures.append({"key": key, "error_type": failed.error_type, "message": failed.error_message})
    return failures
