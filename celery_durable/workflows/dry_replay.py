"""A replay check: a run replayed against the code registered now, executing
nothing and writing nothing (SPEC §8a, ``Client.check_replay``).

``DryReplay`` is a ``Replay`` in ``Mode.DRY``. Its journal is read-only by
construction (``ReadOnlyJournal``: every method of the protocol that is not
a read raises), and its ops never reach the point where they would run
something: ``expect`` answers a journaled op with its journaled value, and
ends the sequence's check where the journal has no usable value:

- past the journal's end (the first new call), or at an op the run waits
  for (a pending wait, a task call or agent turn not answered yet) or would
  run again (a failure of an older attempt, unless a saga compensated
  after it: ``Cursor.compensated_after``): the run is there, so that
  sequence's check is over (it ends as a wait does: ``wait_for_wake``);
- where the journal holds another op: a divergence, said as a run would
  say it (``Replay.nondeterminism``).

A sequence that has ended in the run (the main body of a run that completed
or failed, a branch whose outcome is journaled) must end where it did: a
call past its journal's end diverges. A fan-out replays each branch in its
own sequence, one after another, then returns the outcomes the journal
holds, as a real replay does. A volatile step's value is not journaled, so
the check cannot see past one: that sequence's check ends there.

The main body runs through ``passes.main_pass``, as in a coordinator pass,
so the check compares the settlement a pass would reach with how the run
settled (``verdict``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NoReturn

from celery_durable.broker import schema
from celery_durable.broker.journal import GuardedJournal, Journal
from celery_durable.broker.schema import Identity, describe
from celery_durable.broker.schema.run import RunRecord
from celery_durable.errors import FATAL_ERRORS, NonDeterminismError, StaleAttemptError, StorageCorruptError
from celery_durable.workflows.cursor import Cursor
from celery_durable.workflows.fanout import FanoutOps, Thunk
from celery_durable.workflows.passes import Settlement, main_pass
from celery_durable.workflows.port import Port
from celery_durable.workflows.replay import MAIN, Replay
from celery_durable.workflows.steps import StepOps
from celery_durable.workflows.stopping import Mode
from celery_durable.workflows.unwind import BranchSuspended, unwound

if TYPE_CHECKING:
    from celery_durable.workflows.definition import Workflow

READS = frozenset({"now_ms", "read_sequence", "read_sequences", "branch_outcomes", "handed_off"})
"""The ``Journal`` methods that only read: the rest write, and a check refuses them."""
VALUELESS = frozenset({"p", "l", "v"})
"""Op kinds that carry no journaled value: fan-outs (their branches' outcomes
are elsewhere) and patch markers. Any other op without one is unfinished."""
OUTCOMES = frozenset({"s", "c", "a", "k"})
"""Op kinds whose value is an ``Outcome``, which a later attempt runs again when it is a failure."""

OK, DIVERGES, FAILED = "ok", "diverges", "failed"


class DryReplayWrite(RuntimeError):
    """A replay check reached a journal write: a bug in the check, refused before Redis sees it."""


class ReadOnlyJournal(GuardedJournal):
    """A ``Journal`` whose reads pass and whose every write raises ``DryReplayWrite``."""

    def __init__(self, inner: Journal) -> None:
        super().__init__(inner, _reads_only)


def _reads_only(method: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    if method.__name__ not in READS:
        raise DryReplayWrite(f"A replay check writes nothing, but it called Journal.{method.__name__}")
    return method(*args, **kwargs)


def ends_by_itself(record: RunRecord) -> bool:
    """Whether the run settled where its body ended (returned, or raised out
    of it), rather than where it was stopped (cancelled, paused, a ceiling)."""
    return record.status == "completed" or (
        record.status == "error" and record.reason in ("exception", "invalid_result")
    )


class DryReplay(Replay):
    """One replay check of one run: no producer, task, agent or child runs, nothing is written."""

    def __init__(
        self, *, journal: Journal, run: RunRecord, workflow: Workflow, max_fanout: int, max_payload_bytes: int
    ) -> None:
        super().__init__(
            journal=ReadOnlyJournal(journal),
            run=run,
            workflow=workflow,
            port=Port(max_fanout, max_payload_bytes),
            mode=Mode.DRY,
        )
        self.steps = _DrySteps(self)
        self.fanout = _DryFanout(self)
        self.ended: set[str] = {MAIN} if ends_by_itself(run) else set()
        """Sequences that ended in the run: a call past their journal's end diverges."""
        self.main: Cursor | None = None
        self.blind = ""
        """Where a volatile step stopped the check: past it nothing can be seen."""
        self.failures: list[str] = []
        """Branches whose journaled result the new code turns into an exception."""

    def open_cursor(self, seq: str, *, writes: bool, phase_id: str = "") -> Cursor:
        cursor = super().open_cursor(seq, writes=False, phase_id=phase_id)
        if seq == MAIN:
            self.main = cursor
        return cursor

    def expect(self, cursor: Cursor, identity: str) -> tuple[bool, str | None]:
        journaled = cursor.journaled()
        if journaled is None:
            if cursor.seq in self.ended:
                end = "the run's end" if cursor.is_main else "the branch's end"
                raise self.nondeterminism(cursor, f"expected {end}, got {describe(identity)}")
            self.stop_here(cursor)
        found, value = journaled
        if found != identity:
            raise self.nondeterminism(cursor, f"expected {describe(found)}, got {describe(identity)}")
        kind = identity.partition("|")[0]
        # An older attempt's failure runs again, unless a saga compensated after it: then it stands.
        unfinished = value is None or (
            kind in OUTCOMES and not self.decode(value).is_live(self.epoch) and not cursor.compensated_after()
        )
        if unfinished and kind not in VALUELESS:
            self.stop_here(cursor)  # the run waits here, or would run the op again
        return True, value

    def stop_here(self, cursor: Cursor) -> NoReturn:
        """The check of this sequence is over: it ends as a wait ends it."""
        self.wait_for_wake(cursor)


class _DrySteps(StepOps):
    """Steps as a check replays them: a volatile one ends the sequence's check."""

    def __init__(self, replay: DryReplay) -> None:
        super().__init__(replay)
        self._dry = replay

    def step(self, key: str, producer: Callable[[], Any], **options: Any) -> Any:
        if not options["volatile"]:  # the other options are the step's, passed on as they are
            return super().step(key, producer, **options)
        replay = self._dry
        cursor = replay.current()
        replay.check_cancelled()
        where = "the main body" if cursor.is_main else f"branch {cursor.seq}"
        replay.blind = replay.blind or f"volatile step {key!r} in {where}"
        replay.stop_here(cursor)


class _DryFanout(FanoutOps):
    """A fan-out as a check replays it: every branch in its own sequence, here, one after another."""

    def __init__(self, replay: DryReplay) -> None:
        super().__init__(replay)
        self._dry = replay

    def _outcomes(self, kind: str, branches: list[Thunk]) -> list[schema.Outcome]:
        replay = self._dry
        cursor = replay.current()
        replay.check_cancelled()
        replay.expect(cursor, Identity.fanout(kind, len(branches)))
        call = schema.call_id(cursor.seq, cursor.index)
        raws = replay.journal.branch_outcomes(call, len(branches))
        seqs = [schema.branch_seq(cursor.seq, cursor.index, j) for j in range(len(branches))]
        for j, thunk in enumerate(branches):
            if j % 64 == 0:
                replay.read_ahead(seqs[j : j + 64])
            self._branch(cursor, call, j, thunk, raws[j])
        results = self._collect(call, len(branches), stands=cursor.compensated_after)
        if results is None:
            replay.stop_here(cursor)  # the run waits for branches still running
        cursor.advance()
        return results

    def _branch(self, parent: Cursor, call: str, index: int, thunk: Thunk, raw: str | None) -> None:
        replay = self._dry
        seq = schema.branch_seq(parent.seq, parent.index, index)
        cursor = replay.open_cursor(seq, writes=False, phase_id=parent.phase_id)
        cursor.owner = parent.owner if not parent.is_main else schema.branch_owner(call, index)
        outcome = replay.decode(raw) if raw is not None else None
        if outcome is not None and outcome.is_live(replay.epoch):
            replay.ended.add(seq)
        try:
            with replay.running(cursor):
                thunk()
        except BranchSuspended as stopped:
            unwound(stopped)
            return
        except FATAL_ERRORS:
            raise
        except Exception as exc:
            if outcome is not None and outcome.kind == "o":
                replay.failures.append(f"{type(exc).__name__}: {exc} (branch {seq}, whose result is journaled)")
            return
        if cursor.index < len(cursor.history):
            journaled = describe(cursor.history[cursor.index][0])
            raise replay.nondeterminism(cursor, f"expected {journaled}, got the branch's return")


def check_run(
    journal: Journal, record: RunRecord, workflow: Workflow, *, max_fanout: int, max_payload_bytes: int
) -> tuple[str, str]:
    """Replay ``record`` on ``journal`` (read-only here) with ``workflow``: (verdict, message)."""
    replay = DryReplay(
        journal=journal, run=record, workflow=workflow, max_fanout=max_fanout, max_payload_bytes=max_payload_bytes
    )
    try:
        settlement = main_pass(replay)
    except (StaleAttemptError, StorageCorruptError) as exc:
        return FAILED, f"{type(exc).__name__}: {exc}"
    return verdict(replay, record, settlement)


def verdict(replay: DryReplay, record: RunRecord, settlement: Settlement | None) -> tuple[str, str]:
    """How the check ends: the replay's settlement (None: it stopped where the run is) against the run's."""
    if isinstance(replay.fatal, NonDeterminismError):
        return DIVERGES, str(replay.fatal)
    if settlement is not None and settlement.reason == "nondeterminism":
        return DIVERGES, settlement.error
    main = replay.main
    assert main is not None
    if settlement is not None and settlement.status == "completed" and main.index < len(main.history):
        journaled = describe(main.history[main.index][0])
        return DIVERGES, str(replay.nondeterminism(main, f"expected {journaled}, got the workflow's return"))
    if replay.blind:
        return OK, f"checked up to {replay.blind}, whose value is not journaled"
    if ends_by_itself(record):
        if settlement is None:
            return DIVERGES, f"The run {_ended(record)}; the replay stopped at call {main.index} of the main body"
        if _same_end(record, settlement):
            pass
        elif settlement.status != "completed":
            # The new code raised where the old one did not (or raised another
            # error): a failure of the code under check, as on a live run.
            return FAILED, settlement.error
        else:
            return DIVERGES, f"The run {_ended(record)}; the replay {_ended_as(settlement, record)}"
    elif settlement is not None and settlement.status != "completed":
        return FAILED, settlement.error
    if replay.failures:
        return FAILED, replay.failures[0]
    return OK, ""


def _same_end(record: RunRecord, settlement: Settlement) -> bool:
    """A body that returns where the run returned ends as it did, whatever it
    returns now (SPEC §8a: a new version may shape its result differently);
    one that raised, with the same failure."""
    if record.status == "completed":
        return settlement.status == "completed"
    return (settlement.status, settlement.reason, settlement.error) == (record.status, record.reason, record.error)


def _ended(record: RunRecord) -> str:
    if record.status == "completed":
        return "completed with a result" if record.has_result else "completed without a result"
    return f"ended {record.status}: {record.error}"


def _ended_as(settlement: Settlement, record: RunRecord) -> str:
    if settlement.status != "completed":
        return f"ended {settlement.status}: {settlement.error}"
    return "completed"
