"""Where one sequence of calls stands in an execution: its history and position.

A sequence is the main body (``m``) or one branch of a fan-out. Replay keeps
a ``Cursor`` per sequence it runs: the journaled history it must follow, the
index of the next call, the progress records buffered since the last write,
and the step whose journal write is held back to travel with the next call.
A branch's cursor also names the ``Completions`` of the thread that runs it,
which own the branch's completion once it ends.

The ops read the longest key here rather than from ``replay``, which
builds them: no import circle.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from celery_durable.broker import schema
from celery_durable.broker.journal import PendingCommit, ProgressRecordArgs
from celery_durable.errors import StorageCorruptError
from celery_durable.workflows.jsonvalue import is_utf8

if TYPE_CHECKING:
    from celery_durable.workflows.completion import Completions


MAX_KEY_LENGTH = 1024


def check_key(noun: str, key: object) -> None:
    """A step's, call's or child's key, before anything is journaled under it."""
    if not isinstance(key, str) or not key or len(key) > MAX_KEY_LENGTH:
        raise ValueError(f"{noun} key must be a non-empty string of at most {MAX_KEY_LENGTH} characters: {key!r}")
    if not is_utf8(key):
        raise ValueError(f"{noun} key holds a lone surrogate: {key!r}")  # Redis takes UTF-8 only


def is_key(key: object) -> bool:
    """``key`` would pass ``check_key``: what a call's answer may name (``tasks/calls.py``)."""
    return isinstance(key, str) and 0 < len(key) <= MAX_KEY_LENGTH and is_utf8(key)


@dataclass(slots=True)
class Cursor:
    """Where one sequence stands in this execution."""

    seq: str
    history: list[tuple[str, str | None]]
    high_water: int
    writes: bool
    phase_id: str = ""
    owner: str = schema.MAIN
    """Whom a wait of this sequence wakes: "m" (the coordinator) or
    "<call>/<branch>" (the branch task of a top-level branch)."""
    suspended: BaseException | None = None
    index: int = 0
    logs_since_op: int = 0
    buffer: list[ProgressRecordArgs] = field(default_factory=list)
    held: PendingCommit | None = None
    """The last step's journal write, not sent yet (``Replay.holds_steps``):
    it goes with this sequence's next journal write (``Replay.flush``), before
    more work runs, or with a branch's outcome once the branch ends."""
    completions: Completions | None = None
    """A branch run one after another with others in one thread: the owner of
    their completions, the one before this branch's included, which may
    travel with this branch's first write."""
    compensating: int = 0
    """Sagas of this sequence running their compensations now: their steps
    run though the run is cancelled (``workflows/saga.py``)."""
    compensation_end: int = -1
    """While a saga compensates: the index of its last compensation, where
    the cut goes when one of them re-runs an older attempt's failure
    (``cut_here``)."""
    undo: list[str] = field(default_factory=list)
    """The step identities of the compensations this sequence's open sagas
    registered so far (``compensated_after``)."""
    compensated: int = -1
    """The index of the last compensation journaled in this sequence's live
    history, -1 for none or in a journal that does not name it
    (``SequenceHistory.last_compensation``; ``compensated_after``)."""
    patches: dict[str, bool] | None = None
    """The answers ``ctx.patched`` gave in this sequence, by patch id: the
    first answer for an id holds for the rest of it (``versions.py``)."""

    def take_held(self) -> PendingCommit | None:
        """The held-back step, which the caller now journals."""
        held, self.held = self.held, None
        return held

    def position(self) -> int:
        return schema.position(self.index, self.logs_since_op)

    def advance(self) -> None:
        self.index += 1
        self.logs_since_op = 0

    def journaled(self) -> tuple[str, str | None] | None:
        """The journaled op at the cursor, or None past the end of the history."""
        return self.history[self.index] if self.index < len(self.history) else None

    def stops_cancelled(self, epoch: int) -> bool:
        """Whether a cancelled execution stops at the op here. It goes on while
        a saga compensates, and at ops the journal answers already, so that a
        cancelled run replays (its sagas registering their undos) to where it
        stands and meets its cancellation there. Where it stops at an op
        journaled without an end (a wait, a call, a child), that op is
        stepped over: its end will never come, and what a saga journals next
        goes after it, on every replay alike."""
        if self._goes_on_cancelled(epoch):
            return False
        if self.journaled() is not None:
            self.advance()
        return True

    def _goes_on_cancelled(self, epoch: int) -> bool:
        """While a saga compensates, or where the journal answers the op here."""
        if self.compensating:
            return True
        entry = self.journaled()
        if entry is None:
            return False
        identity, raw = entry
        kind = identity[:1]
        if kind in ("p", "l", "v"):
            return True  # a fan-out looks at its branches itself; a patch marker is an answer
        if raw is None:
            return False
        if kind in ("s", "c", "k", "a"):
            try:
                return schema.decode_outcome(raw).is_live(epoch)
            except StorageCorruptError:
                return False
        return True

    def compensated_after(self) -> bool:
        """Whether the journal holds a saga's compensation after the op here:
        an older attempt failed later in this sequence and began undoing, so
        a failure here stands in every attempt after it (SPEC §5c: a crash
        while compensating resumes the remaining compensations), where
        another failure is run again (SPEC §4). Run again, it would cut the
        sequence across that compensation, and the failure it undoes with it.

        While a saga compensates, the op here is one of its compensations, a
        step like any other (SPEC §4: a resumed run runs it again, so that the
        user who fixed what made it fail gets it undone), re-run in place, the
        cut past the saga's last one (``cut_here``). Unless a compensation is
        journaled past that last one: an enclosing or a later saga already
        undid work for the exception this saga raised then, and run again and
        passing, the undo would change that exception, and the run could end
        well with that work undone. It stands then, as the failures it
        undid do.

        The journal names the last compensation of each sequence
        (``compensated``). A journal older than that name holds no mark: there
        it is a compensation of an open saga of this sequence, registered by
        the op here, found after it."""
        if self.compensating:
            return self.compensation_end < self.compensated < len(self.history)
        if self.index < self.compensated < len(self.history):
            return True
        return bool(self.undo) and any(identity in self.undo for identity, _ in self.history[self.index + 1 :])

    def cut_here(self) -> str:
        """The op at the cursor re-runs an older attempt's failure: what that
        attempt journaled after it is no longer history, and progress records
        from here are new. Returns the cut the journal must record.

        A saga's compensation re-runs in place: the compensations it runs
        after this one are history still (a journaled one is not run again),
        so the cut goes after the last of them (``compensation_end``). What
        the older attempt did past them followed the exception the saga
        raised then, which may not be the one it raises now. Only those in
        the live history: past its end the journal may hold entries an older
        cut abandoned, which a cut further on would make history again."""
        end, at = self.index, self.position()
        last = min(self.compensation_end, len(self.history) - 1) if self.compensating else -1
        if last > self.index:
            end = last
            at = schema.position(end + 1, 0)
        self.history = self.history[: end + 1]
        self.high_water = min(self.high_water, at - 1)
        return schema.cut_argument(end, at)

    @property
    def is_main(self) -> bool:
        return self.seq == schema.MAIN
