"""The coordinator task: a ``Pass`` of deterministic replay over a run.

A pass holds the run's activation lock; an activation that arrives while a
pass runs sets the lock's wake flag instead of running beside it, and the
holder runs one more pass before it lets go (see ``release.lua``). ``Pass``
owns that life, activate → replay → park or settle → release, whether its
message came from the broker or the script that journaled a call's answer
took the lock for it (``TakenPass``); how the main body itself runs and how
the run settles is ``workflows/passes.py``'s, which knows neither Celery nor
Redis.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from celery_durable import telemetry
from celery_durable.broker import Flags, RunRecord
from celery_durable.broker.replies.run import Activation, NotRun, PassHere
from celery_durable.broker.schema import MAIN, SequenceHistory
from celery_durable.errors import StaleAttemptError, StorageCorruptError, StorageError
from celery_durable.tasks import children, throttling
from celery_durable.tasks.app import new_task_id
from celery_durable.tasks.heartbeat import Heartbeat
from celery_durable.tasks.messages import BadMessage, RunMessage, knows, parse_run_message, pass_on
from celery_durable.tasks.port import execution
from celery_durable.tasks.retrying import retry_storage
from celery_durable.workflows import jsonvalue, passes
from celery_durable.workflows.parking import ParkedBody, PassEnd
from celery_durable.workflows.passes import Settlement, main_pass
from celery_durable.workflows.replay import Replay

if TYPE_CHECKING:
    from celery_durable.engine import Engine

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class TakenPass:
    """A pass whose lock the script that woke it already took (``call_done``
    with ``PassHere``), for the body this process keeps parked: the pass
    starts from ``activation`` instead of activating again."""

    body: ParkedBody
    request: PassHere
    activation: Activation


def run_coordinator_task(
    engine: Engine,
    *,
    task_id: str,
    run_id: Any,
    epoch: Any,
    workflow: Any,
    extra: dict[str, Any],
    taken: TakenPass | None = None,
) -> None:
    try:
        message = parse_run_message(run_id, epoch, workflow, extra, extra.pop("namespace", None))
    except BadMessage as exc:
        logger.error("rejected coordinator message: %s", exc)
        return
    # The lock token is the task id, so a message redelivered after its worker
    # died re-enters its own lock instead of waiting for it to expire.
    token = task_id or new_task_id()

    def attempt() -> None:
        # A pass taken by the waking script is the first try's: a try again
        # after a storage error activates as any pass does (its token re-enters).
        nonlocal taken
        first, taken = taken, None
        Pass(engine, message, token, first).run()

    retry_storage(f"run {message.run_id}: a coordinator pass", attempt)


class Pass:
    """One coordinator message's hold on its run: activate, replay, park or
    settle, release — and replay again while the lock says to.

    Every step of a pass is a method here, in the order it runs, over the
    state the steps share (the run, the lock token, the execution): the
    kept body, the lock taken by a waking script, a heartbeat that settles
    an overdue run and a first-write race that runs the pass again are each
    a branch of one of these steps, not a path of their own.
    """

    def __init__(self, engine: Engine, message: RunMessage, token: str, taken: TakenPass | None = None) -> None:
        self.engine = engine
        self.message = message
        self.token = token
        """The lock's token: the message's task id."""
        self.taken = taken
        self.execution = new_task_id()
        """One dispatch token per execution: a fan-out dispatched by an
        execution that died halfway through sending is sent again by the next one."""
        self.replay: Replay | None = None
        """The execution under the lock now (the heartbeat's ``overdue`` settles it)."""
        self.kept: tuple[ParkedBody, str | None] | None = None
        """The body this process kept parked, to resume, with its call's answer."""

    def run(self) -> None:
        engine, message = self.engine, self.message
        if not knows(engine, message):

            def send_again(new: str, countdown: float) -> None:
                engine.send_coordinator(message.run_id, message.epoch, message.workflow, countdown, task_id=new)

            pass_on(engine, message, self.token, "c", send_again)
            return
        replay = self.replay = self.activate()
        if replay is None:
            return
        heartbeat = Heartbeat(
            engine.store,
            replay,
            token=self.token,
            interval=engine.heartbeat_interval,
            coordinator=True,
            overdue=self.settle_overdue,
            grace=engine.settings.lease_seconds,
        )
        # A call's answer that comes meanwhile waits for these passes to let go
        # of the lock (``ParkedRuns.wait_let_go``), however they end.
        with heartbeat, engine.parked.holding(replay.run.run_id):
            while True:
                try:
                    with telemetry.task(replay, "pass", self.token):
                        settled = self.park_or_settle(replay)
                except StaleAttemptError:
                    logger.info("run %s: attempt %s lost authority", replay.run.run_id, replay.epoch)
                    return
                except StorageCorruptError as exc:
                    self.settle_corrupt(replay.run, exc)
                    return
                if settled:
                    return  # finish.lua let go of the lock and of every message: nothing to release
                next_replay = self.release(replay)
                if next_replay is None:
                    return
                replay = self.replay = heartbeat.attempt = next_replay

    # -- activate ----------------------------------------------------------------------

    def activate(self) -> Replay | None:
        """Take the run's lock and choose what runs under it: the body kept
        parked at its call if the journal still ends there, else a replay from
        the top. None: the pass must not run (refused, waiting for its slot,
        busy: sent again for later)."""
        engine, message, taken = self.engine, self.message, self.taken
        peeked = engine.parked.peek(message.run_id, message.epoch, message.workflow)
        if peeked is None and taken is None and message.namespace is not None:
            unread = self._activate_unread(message.namespace)
            if not isinstance(unread, NotRun):
                return unread
        record = peeked.replay.run if peeked is not None else self._load()
        if record is None or not _has_its_slot(engine, record, self.token):
            return None
        resend = taken.request.resend if taken is not None else new_task_id()
        locked = self._take_lock(record, resend, peeked)
        if locked is None:
            return None
        activation, tail = locked
        if isinstance(activation, int):
            self._busy(activation, resend, record.namespace)
            return None
        replay = self._replay_to_run(record, peeked, tail)
        if replay is not None:
            replay.apply_flags(activation)
        return replay

    def _activate_unread(self, namespace: str) -> Replay | NotRun | None:
        """``activate``, for a message that names its run's namespace and has
        no kept body: the script that takes the lock checks the message as
        ``_load`` would and answers with the run, one round trip for two.
        ``NotRun.READ`` when the pass is to read the run first after all (a
        slot to take, another namespace named, a record or a main sequence
        that cannot be parsed)."""
        engine, message, token = self.engine, self.message, self.token
        resend = new_task_id()
        try:
            found = engine.store.activate_unread(
                message.run_id, message.epoch, message.workflow, namespace, token, resend
            )
        except StorageCorruptError:
            # Judged as a pass that reads first: a record that cannot be parsed is
            # refused there (the lock was let go), a main sequence where the lock
            # is taken again by this token and the run settles as corrupt.
            return NotRun.READ
        if isinstance(found, NotRun):
            if found in (NotRun.MISSING, NotRun.STALE, NotRun.FORGED):
                engine.count_refused()
                logger.warning("refused stale or forged coordinator message for run %s", message.run_id)
                return None
            return found if found is NotRun.READ else None
        if isinstance(found, int):
            self._busy(found, resend, namespace)
            return None
        flags, record, tail = found
        replay = self._replay_to_run(record, None, (MAIN, tail))
        if replay is not None:
            replay.apply_flags(flags)
        return replay

    def _busy(self, wait_ms: int, resend: str, namespace: str) -> None:
        """Another pass holds the lock and was told to run once more. Should
        that pass be dead, its lock expires: this message comes back then."""
        message = self.message
        self.engine.send_coordinator(
            message.run_id, message.epoch, message.workflow, wait_ms / 1000, task_id=resend, namespace=namespace
        )

    def _take_lock(
        self, record: RunRecord, resend: str, peeked: ParkedBody | None
    ) -> tuple[Flags | int, tuple[str, SequenceHistory] | None] | None:
        """``_lock``; None when the pass must not run."""
        engine = self.engine
        try:
            return self._lock(record, resend, peeked)
        except StaleAttemptError:
            if peeked is not None:
                # The body's attempt is over: the message is refused (and counted)
                # as one that found no kept body would be, or left alone when its
                # run settled or paused meanwhile.
                engine.parked.discard(record.run_id, peeked)
                self._load()
            return None
        except StorageCorruptError:
            if peeked is None:
                raise
            # The run record is gone or damaged: judged as without a kept body.
            engine.parked.discard(record.run_id, peeked)
            if self._load() is not None:
                raise
            return None

    def _lock(
        self, record: RunRecord, resend: str, peeked: ParkedBody | None
    ) -> tuple[Flags | int, tuple[str, SequenceHistory] | None]:
        """Take the run's lock (``RunStore.activate``). With a kept body, its run
        and call are known without a read, and the same script reads the journal
        from the body's call on, which ``ParkedRuns.take`` checks. A pass taken
        already is not activated again: its lock is held (the token re-enters it
        should the body have changed meanwhile), or it was busy, and its resend
        is on its way."""
        store, taken, token = self.engine.store, self.taken, self.token
        if taken is not None and isinstance(taken.activation, int):
            return taken.activation, None
        cursor = peeked.cursor if peeked is not None else None
        # Without a kept body the pass replays from the top: the main body's
        # sequence is read by the same script, not by a round trip of its own.
        seq, start = (cursor.seq, cursor.index) if cursor is not None else (MAIN, 0)
        if (
            taken is not None
            and cursor is not None
            and taken.body is peeked
            and (taken.request.seq, taken.request.start) == (seq, start)
        ):
            reading = taken.activation
        elif cursor is None:
            try:
                reading = store.activate_reading(
                    record.run_id, record.epoch, token, record.namespace, resend, seq, start
                )
            except StorageCorruptError:
                # The main body's sequence holds what cannot be read: the lock is
                # taken (again, by its token), and the pass meets the damage where
                # it settles the run as corrupt.
                return store.activate(record.run_id, record.epoch, token, record.namespace, resend), None
        else:
            reading = store.activate_reading(record.run_id, record.epoch, token, record.namespace, resend, seq, start)
        return (reading, None) if isinstance(reading, int) else (reading[0], (seq, reading[1]))

    def _load(self) -> RunRecord | None:
        """The run the message names, or None when it must not run (logged)."""
        message = self.message
        record, corrupt = _read_record(self.engine, message.run_id)
        if corrupt:
            return None
        if record is None or record.epoch != message.epoch or record.workflow != message.workflow:
            self.engine.count_refused()
            logger.warning("refused stale or forged coordinator message for run %s", message.run_id)
            return None
        return record

    def _reload(self, record: RunRecord) -> RunRecord | None:
        """The run read again under the lock this pass holds; None (the lock let
        go) when it changed attempt, is gone, or cannot be read."""
        fresh, corrupt = _read_record(self.engine, record.run_id)
        if corrupt or fresh is None or fresh.epoch != record.epoch:
            self.engine.store.release(record.run_id, self.token, record.epoch)
            return None
        return fresh

    def _replay_to_run(
        self, record: RunRecord, peeked: ParkedBody | None, tail: tuple[str, SequenceHistory] | None
    ) -> Replay | None:
        """The pass's replay, once its lock is taken: the kept body, or one
        from the top given the main body's sequence when the activation read it
        (under the lock: as current as a read now). None when the run changed
        under a stale body."""
        engine = self.engine
        self.kept = engine.parked.take(record.run_id, record.epoch, tail)
        if self.kept is not None:
            return self.kept[0].replay
        if peeked is not None:
            # The body was stale: replay from a record read now, not the body's copy.
            fresh = self._reload(record)
            if fresh is None:
                return None
            record = fresh
        replay = execution(engine, record, self.execution)
        if tail is not None and tail[0] == MAIN and tail[1].start == 0:
            replay.prime({MAIN: tail[1]})
        return replay

    # -- replay, then park or settle -----------------------------------------------------

    def park_or_settle(self, replay: Replay) -> bool:
        """Run the main body once, to where it waits or to its end: from the
        top (a replay), or from the call where a body this process kept
        parked. True when it settled the run."""
        engine = self.engine
        kept, self.kept = self.kept, None
        if kept is not None:
            body, answer = kept
            end = body.resume(answer)
        elif engine.parked.enabled:
            body = ParkedBody(replay, lambda: main_pass(replay))
            end = body.start()
        else:
            end = PassEnd(parked=False, settlement=main_pass(replay))
        if end.parked:
            engine.parked.keep(replay.run.run_id, replay.epoch, body)
            return False
        settlement = end.result()
        if settlement is None:
            return False
        return passes.settled(settlement, functools.partial(self.settle, replay.run)) is not None

    def settle(self, record: RunRecord, settlement: Settlement) -> bool:
        """Settle the run; one that ends ``error`` is said at WARNING, naming why
        (a run that stopped on nondeterminism is a task that succeeded to Celery).
        A cancelled run cancels the children it waits for first; a child tells
        its parent once it settled. False (nothing settled) when the
        settlement's last writes met what sends them back (``Settlement.flushed``)."""
        engine = self.engine
        if settlement.status == "cancelled":
            children.cancel_waited_children(engine, record)
        watch = record.parent_run_id is not None
        if not engine.store.finish(
            record.run_id, record.epoch, record.namespace, settlement.status, watch=watch, **settlement.written()
        ):
            return False
        if record.parent_run_id is not None:
            result = jsonvalue.loads(settlement.result_json) if settlement.result_json is not None else None
            children.tell_parent(engine, record, settlement.status, settlement.reason, settlement.error, result)
        telemetry.settled(record, settlement.status)
        if settlement.status == "error":
            logger.warning(
                "run %s of workflow %r ended error (%s): %s",
                record.run_id,
                record.workflow,
                settlement.reason,
                settlement.error,
            )
        return True

    def settle_overdue(self, flags: Flags) -> bool:
        """The pass ignored a cancellation or a ceiling for a whole lease: its
        code does not call the context. Settle the run without it; its thread
        goes on until that code returns, fenced out of every write. False
        (nothing done) while a saga of the pass runs its compensations: it
        acts on the cancel."""
        replay = self.replay
        if replay is None or replay.compensating:
            return False
        record = replay.run
        limited = flags.limit and not flags.cancel
        settlement = passes.limit_reached(replay, flags.limit) if limited else passes.CANCELLED
        logger.error(
            "run %s: its workflow code ignored %s for %.0fs without calling the context; the run is settled as %s. "
            "The worker slot running that code stays taken until it returns (a loop that never checks "
            "ctx.cancelled()?)",
            record.run_id,
            "a cancellation" if flags.cancel else f"the limit {flags.limit}",
            self.engine.settings.lease_seconds,
            settlement.status,
        )
        replay.lose_authority()
        self.settle(record, settlement)
        return True

    def settle_corrupt(self, record: RunRecord, exc: StorageCorruptError) -> None:
        """Stop a run whose journal holds what celery-durable did not write.

        Resumable: once the entry is repaired (or deleted, so that its op runs
        again), ``resume_workflow`` replays the run from its journal.
        """
        logger.error("run %s: storage corrupt, the run stops: %s", record.run_id, exc)
        try:
            self.settle(record, passes.corrupt(exc))
        except (StaleAttemptError, StorageError) as again:
            # The run record itself cannot take the write: nothing more to do here;
            # the recovery sweep looks at the run again when its lease runs out.
            logger.error("run %s: could not record the corruption: %s", record.run_id, again)

    # -- release -------------------------------------------------------------------------

    def release(self, replay: Replay) -> Replay | None:
        """Let go of the lock after a pass that did not settle; the next pass's
        replay when the lock says to run once more (an activation came
        meanwhile), or at once when the pass lost a first-write race: it holds
        the lock, and its message is still the run's."""
        engine, record = self.engine, replay.run
        if not replay.rerun and not engine.store.release(record.run_id, self.token, record.epoch):
            return None
        fresh = engine.store.load_run(record.run_id)
        if fresh is None or fresh.epoch != record.epoch:
            return None
        self.kept = engine.parked.take(record.run_id, record.epoch)
        following = self.kept[0].replay if self.kept else execution(engine, fresh, self.execution)
        following.apply_flags(Flags(cancel=fresh.cancel_requested, pause=fresh.pause_requested))
        return following


def _has_its_slot(engine: Engine, record: RunRecord, token: str) -> bool:
    """A run started with ``throttle=`` runs a pass only once its attempt has
    its slot: taken now, or else the run waits for it (its message ends
    here). A run asked to cancel or pause goes on to settle: neither waits for a
    slot (the settle gives back its place in the queue)."""
    if record.throttle is None or record.slot == record.epoch or record.cancel_requested or record.pause_requested:
        return True
    return throttling.take_run_slot(engine, record, token)


def _read_record(engine: Engine, run_id: str) -> tuple[RunRecord | None, bool]:
    """The run's record (None: gone), and whether it is corrupt (logged: not executed)."""
    try:
        return engine.store.load_run(run_id), False
    except StorageCorruptError as exc:
        logger.error("run %s: not executed, its record is corrupt: %s", run_id, exc)
        return None, True
