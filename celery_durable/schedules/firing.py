"""Firing a schedule's ticks: the sweep's part, a trigger's and a backfill's (SPEC §5d).

No beat process and no singleton: every worker's recovery sweep claims the
schedules whose tick is due (``schedule_claim.lua``, as it claims due runs),
so a fleet fires each tick once, and whichever worker is alive fires it.

A tick's run has an id derived from the namespace, the schedule and the
tick (``schema.schedule_run_id``), and is created by ``create_run.lua``,
which makes a run once. The order of a fire is: claim the tick (the
schedules' slot), create its run and send its first message (the run's
slot), then record the tick (``schedule_record.lua``, the schedules' slot:
the next tick, the action, the last run). A sweeper that dies anywhere in
between leaves its claim to run out (a lease); the next claim fires the same
tick again, finds its run made, and records it: nothing is doubled, nothing
is lost. A run created whose first message was never sent is the sweep's
like any other (its look was scheduled before it was created: LOOK_FIRST).
A tick re-fired after a claim ran out is judged late from when the first
claim saw it due, not from now: a death is not an outage.

The decisions (which ticks are due, missed or caught up; what overlap makes
of each) are plain Python on what the store holds; only ``start_tick``
(``start_ticks`` for a sweep's batch) and the status reads touch Redis,
through the store. The sweep claims a small batch at a time (``BATCH``), so
the fleet's sweepers share the ticks due in a second, and starts a batch's
ticks together: one ``look.lua`` for all the runs, then their
``create_run``s in one pipeline, their listing in one MULTI/EXEC, their first
messages in one publish, then the batch's records in one pipeline.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from celery_durable import telemetry
from celery_durable.broker import schema
from celery_durable.broker.schedule_store import ANY, TickRecord
from celery_durable.broker.schema import MAIN
from celery_durable.errors import DurableError, StorageCorruptError, StorageError
from celery_durable.schedules.calendar import Calendar
from celery_durable.schedules.spec import ON_TIME_MS, RECENT_MAX, StoredSchedule, action, parse_stored
from celery_durable.tasks.app import new_task_id
from celery_durable.tasks.wakes import Wake
from celery_durable.workflows import jsonvalue
from celery_durable.workflows.definition import Workflow
from celery_durable.workflows.limits import ceiling_fields, merge_limits

if TYPE_CHECKING:
    from celery_durable.engine import Engine

logger = logging.getLogger(__name__)

BATCH = 32
"""Schedules one sweep claims at most: a small batch, so that the fleet's
sweepers share the ticks due in a second (each comes back at once for more
while more are due), and each batch is started in a few round trips."""
MAX_TICKS = 100
"""Ticks one fire starts or judges at most; the rest are the next sweep's (at once)."""
MAX_MISSED_SCAN = 1_000
"""Missed ticks walked one by one at most; past that the walk jumps to the first on time."""
BUFFER_POLL_MS = 500
"""While a tick is buffered, the sweep looks at its schedule this often for its last run's end."""
LIVE = frozenset({"pending", "running"})


@dataclass(frozen=True, slots=True)
class DueTicks:
    """What ``due_ticks`` found: ticks missed (only the latest ``RECENT_MAX``
    kept, for the recent actions), ticks to fire in order, and the next tick after them."""

    missed: list[int]
    fire: list[int]
    next_ms: int | None


def due_ticks(calendar: Calendar, first_ms: int, seen_ms: int, now_ms: int, catchup_ms: int) -> DueTicks:
    """The ticks from ``first_ms`` on that are due by ``now_ms``. One later than
    ``max(catchup, 2 s)`` when a sweeper first saw it due (``seen_ms``) is missed."""
    cutoff = seen_ms - max(catchup_ms, ON_TIME_MS)
    missed: deque[int] = deque(maxlen=RECENT_MAX)
    tick: int | None = first_ms
    walked = 0
    while tick is not None and tick < cutoff and walked < MAX_MISSED_SCAN:
        missed.append(tick)
        tick = calendar.next_after(tick)
        walked += 1
    if tick is not None and tick < cutoff:
        tick = calendar.next_after(cutoff - 1)
    fire: list[int] = []
    while tick is not None and tick <= now_ms and len(fire) < MAX_TICKS:
        fire.append(tick)
        tick = calendar.next_after(tick)
    return DueTicks(list(missed), fire, tick)


def _run_fields(
    engine: Engine,
    stored: StoredSchedule,
    definition: Workflow,
    tick_ms: int,
    run_id: str,
    created_ms: int,
    trace_parent: str,
) -> dict[str, str]:
    """A tick's run record, as ``create_run.lua`` makes it."""
    store = engine.store
    effective = merge_limits(dict(definition.limits), stored.limits or None)
    return {
        **schema.new_run_fields(
            run_id=run_id,
            workflow=definition.name,
            namespace=stored.namespace,
            args_json=stored.args_json,
            limits_json=jsonvalue.dumps(effective),
            code_hash=definition.code_hash,
            created_ms=created_ms,
            lease_ms=store.lease_ms,
            idempotency_key=None,
            progress_max=engine.settings.progress_max_records,
            ceilings=ceiling_fields(effective),
            trace_parent=trace_parent,
        ),
        **schema.schedule_fields(stored.schedule_id, tick_ms),
    }


def start_tick(engine: Engine, stored: StoredSchedule, definition: Workflow, tick_ms: int) -> tuple[str, bool]:
    """Start the run of one tick, or find it started; its run id, and whether it was made here.

    As a child's start (``tasks/children.py``): a run found made but still
    pending, its first start perhaps dead before it listed or sent it, is
    listed and given a look, so the sweep sends it."""
    store = engine.store
    run_id = schema.schedule_run_id(stored.namespace, stored.schedule_id, tick_ms)
    start = telemetry.starting(definition.name, run_id)
    for _ in range(2):
        created_ms = store.now_ms()
        message = new_task_id()
        fields = _run_fields(engine, stored, definition, tick_ms, run_id, created_ms, start.traceparent)
        if store.create_run(run_id, fields, message):
            start.created()  # a tick fired again finds its run made: no second start
            store.index_run(stored.namespace, run_id, None)
            _deliver(engine, [Wake(run_id, 1, definition.name, MAIN, message, namespace=stored.namespace)])
            return run_id, True
        record = store.load_run(run_id)
        if record is None:
            continue  # its retention ran out as it was looked at
        if not store.listed(stored.namespace, run_id):
            store.index_run(stored.namespace, run_id, None)
        if record.status == "pending" and record.epoch == 1:
            store.schedule_check(run_id, created_ms + store.lease_ms, sooner_only=True)
        return run_id, False
    raise StorageError(f"Scheduled run {run_id} kept disappearing while it was started")


def _deliver(engine: Engine, wakes: list[Wake]) -> None:
    try:
        engine.deliver(wakes)
    except Exception as exc:  # kombu/amqp connection errors have no common base
        # Forgotten as it failed (Engine._publish); the sweep looks at the runs and sends them.
        logger.warning(
            "%d scheduled runs: their first messages were refused (%s); the sweep sends them", len(wakes), exc
        )


def start_ticks(engine: Engine, firings: Sequence[Firing]) -> list[bool]:
    """Start the ticks the sweep's firings put off (``Firing.to_start``), all
    together: the runs' looks in one ``look.lua`` and their ``create_run``s
    in one pipeline (``RunStore.create_runs``), the new ones listed in one
    MULTI/EXEC, then their first messages in one ``Engine.deliver``. The
    order per run is ``start_tick``'s (its look, created, listed, sent), so
    a sweeper that dies anywhere here leaves what a death in ``start_tick``
    does: its claims run out, and the ticks fire again, finding their runs
    made. A run found made already (a tick fired again) goes through
    ``start_tick`` alone. Whether each firing's ticks all started: one that
    did not is not recorded, and fires again once its claim runs out."""
    store = engine.store
    started = [True] * len(firings)
    items = [(i, firing, tick_ms) for i, firing in enumerate(firings) for tick_ms in firing.to_start]
    if not items:
        return started
    created_ms = store.now_ms()
    starts: list[tuple[str, dict[str, str], str]] = []
    begun: list[telemetry.Starting] = []
    for _, firing, tick_ms in items:
        run_id = schema.schedule_run_id(firing.stored.namespace, firing.stored.schedule_id, tick_ms)
        begun.append(start := telemetry.starting(firing.definition.name, run_id))
        fields = _run_fields(engine, firing.stored, firing.definition, tick_ms, run_id, created_ms, start.traceparent)
        starts.append((run_id, fields, new_task_id()))
    made = store.create_runs(starts)
    new: list[tuple[str, Wake]] = []
    again: list[tuple[int, Firing, int]] = []
    for (i, firing, tick_ms), (run_id, _, message), start, created in zip(items, starts, begun, made, strict=True):
        if isinstance(created, StorageCorruptError):
            logger.error(
                "schedule %s/%s: tick %s not started: %s",
                firing.stored.namespace,
                firing.stored.schedule_id,
                tick_ms,
                created,
            )
            started[i] = False
        elif created:
            start.created()
            wake = Wake(run_id, 1, firing.definition.name, MAIN, message, namespace=firing.stored.namespace)
            new.append((firing.stored.namespace, wake))
        else:
            again.append((i, firing, tick_ms))
    store.index_runs([(namespace, wake.run_id) for namespace, wake in new])
    if new:
        _deliver(engine, [wake for _, wake in new])
    for i, firing, tick_ms in again:
        try:
            start_tick(engine, firing.stored, firing.definition, tick_ms)
        except StorageError as exc:
            logger.warning(
                "schedule %s/%s: tick %s not started: %s",
                firing.stored.namespace,
                firing.stored.schedule_id,
                tick_ms,
                exc,
            )
            started[i] = False
    for i, firing in enumerate(firings):
        if started[i]:
            started[i] = _cancel_others(engine, firing)
    return started


def _cancel_others(engine: Engine, firing: Firing) -> bool:
    """Cancel the runs a later tick of the same fire cancels (``cancel_other``
    after an outage, say); whether all were. Before the record: a sweeper
    that dies here leaves the ticks to fire again, and cancels them then."""
    client = engine.client(firing.stored.namespace)
    for run_id in firing.to_cancel:
        try:
            client._ask_cancel(run_id)
        except DurableError as exc:
            where = f"{firing.stored.namespace}/{firing.stored.schedule_id}"
            logger.warning("schedule %s: run %s not cancelled (again once its claim runs out): %s", where, run_id, exc)
            return False
    return True


@dataclass(slots=True)
class Firing:
    """One schedule's ticks fired in order, overlap applied against the last
    run it started; what it did is collected for one ``schedule_record.lua``."""

    engine: Engine
    stored: StoredSchedule
    definition: Workflow
    now_ms: int
    last_run: str | None = field(init=False)
    """This and the next two: the stored schedule's, as the firing changes them."""
    last_tick: int | None = field(init=False)
    buffered: int | None = field(init=False)
    actions: list[str] = field(default_factory=list)
    runs: list[tuple[str, int]] = field(default_factory=list)
    deferred: bool = False
    """The sweep's: ``start`` only notes the tick in ``to_start``, and the
    sweep starts every firing's ticks together (``start_ticks``)."""
    to_start: list[int] = field(default_factory=list)
    to_cancel: list[str] = field(default_factory=list)
    """The sweep's: runs of ``to_start`` a later tick of the same fire
    cancels (``cancel_other``), once ``start_ticks`` made them."""
    _live: bool | None = None

    def __post_init__(self) -> None:
        self.last_run, self.last_tick, self.buffered = self.stored.last_run, self.stored.last_tick, self.stored.buffered

    def live(self) -> bool:
        """Whether the last run started is not yet terminal (read once, then known)."""
        if self._live is None:
            status = self.engine.store.statuses([self.last_run])[0] if self.last_run else None
            self._live = status in LIVE
        return self._live

    def knew_live(self, status: str | None) -> None:
        """The last run's status, read for many schedules at once (``fire_due``)."""
        self._live = status in LIVE

    def note(self, tick_ms: int, kind: str, run_id: str | None = None) -> None:
        self.actions.append(action(tick_ms, kind, run_id, self.now_ms))

    def start(self, tick_ms: int, *, note_found: bool = True) -> str:
        """Start the tick's run. ``note_found=False`` (a backfill): a run found
        made already is not noted again, so a range backfilled twice, or over
        ticks fired before, adds no action to ``recent``."""
        made = True
        if self.deferred:
            run_id = schema.schedule_run_id(self.stored.namespace, self.stored.schedule_id, tick_ms)
            self.to_start.append(tick_ms)
        else:
            run_id, made = start_tick(self.engine, self.stored, self.definition, tick_ms)
        if made or note_found:
            self.note(tick_ms, "started", run_id)
        self.runs.append((run_id, tick_ms))
        if self.last_tick is None or tick_ms >= self.last_tick:
            self.last_run, self.last_tick, self._live = run_id, tick_ms, True
        return run_id

    def started_already(self, tick_ms: int) -> bool:
        """A tick fired before by a sweeper that died before recording it."""
        run_id = schema.schedule_run_id(self.stored.namespace, self.stored.schedule_id, tick_ms)
        return self.engine.store.statuses([run_id])[0] is not None

    def tick(self, tick_ms: int, overlap: str) -> str | None:
        """Fire one tick under ``overlap``; the run it started, or None."""
        if overlap == "allow_all" or not self.live():
            return self.start(tick_ms)
        if overlap == "cancel_other":
            assert self.last_run is not None
            if self.deferred and self.last_tick in self.to_start:
                self.to_cancel.append(self.last_run)  # not made yet: cancelled once it is
            else:
                self.engine.client(self.stored.namespace)._ask_cancel(self.last_run)
            return self.start(tick_ms)
        if self.started_already(tick_ms):
            return self.start(tick_ms)
        if overlap == "buffer_one" and self.buffered is None:
            self.buffered = tick_ms
            self.note(tick_ms, "buffered")
        else:
            self.note(tick_ms, "skipped")
        return None

    def release_buffered(self) -> None:
        """The buffered tick starts once the run it waited for is terminal."""
        if self.buffered is not None and not self.live():
            tick_ms, self.buffered = self.buffered, None
            self.start(tick_ms)

    def fire_due(self, seen_ms: int) -> TickRecord:
        """The sweep's fire: the buffered tick, missed ticks, then the due ones
        in order. A paused schedule is here only for a tick a trigger buffered
        (``record_as_is``): that one starts, its calendar fires nothing."""
        stored = self.stored
        self.release_buffered()
        next_ms = stored.next_ms
        if not stored.paused and next_ms is not None and next_ms <= self.now_ms:
            due = due_ticks(stored.calendar, next_ms, min(seen_ms, self.now_ms), self.now_ms, stored.catchup_ms)
            for tick_ms in due.missed:
                self.note(tick_ms, "missed")
            for tick_ms in due.fire:
                self.tick(tick_ms, stored.overlap)
            next_ms = due.next_ms
        due_at = next_ms
        if self.buffered is not None:
            poll = self.now_ms + BUFFER_POLL_MS
            due_at = poll if due_at is None else min(due_at, poll)
        return self.record(rev=stored.rev, next_read=stored.next_ms, next_ms=next_ms, due_at=due_at)

    def record(
        self, *, rev: int | None, next_read: int | str | None, next_ms: int | None, due_at: int | None
    ) -> TickRecord:
        return TickRecord(
            rev=rev,
            next_read=next_read,
            next_ms=next_ms,
            due_at=due_at,
            buffered_read=self.stored.buffered,
            buffered=self.buffered,
            last_run=self.last_run,
            last_tick=self.last_tick,
            actions=self.actions[-RECENT_MAX:],
            runs=self.runs,
        )

    def record_as_is(self) -> TickRecord:
        """A trigger's or a backfill's record: no compare on the next tick
        (the sweep's own), the buffered tick set only where none was, and
        then looked at by the sweep as it looks at one it buffered itself
        (``fire_due``), so it starts once the last run settled."""
        if self.buffered == self.stored.buffered:
            return replace(self.record(rev=None, next_read=ANY, next_ms=None, due_at=None), buffered_read=ANY)
        return self.record(rev=None, next_read=ANY, next_ms=None, due_at=self.now_ms + BUFFER_POLL_MS)


def fire_due(engine: Engine, claim_ms: int | None = None) -> int | None:
    """One sweep of the schedules: claim a batch of those due (``BATCH``, so
    that a fleet's sweepers share a second's ticks), decide each one's
    ticks, start them all together (``start_ticks``), then record them
    together. Returns when the next one falls due (None: none is scheduled;
    now: more are due)."""
    store = engine.store
    now = store.now_ms()
    claim_ms = store.lease_ms if claim_ms is None else claim_ms
    due = store.claim_schedules(now, BATCH, claim_ms)
    if not due.members:
        return due.next_due
    which = [(member.partition("/")[0], member.partition("/")[2]) for member, _ in due.members]
    raws = store.read_schedules(which)
    firings: list[tuple[Firing, int]] = []
    for (namespace, schedule_id), raw, (_, score) in zip(which, raws, due.members, strict=True):
        if raw is None:
            continue  # deleted as it was claimed
        try:
            stored = parse_stored(namespace, schedule_id, raw.fields)
        except StorageCorruptError as exc:
            logger.error("schedule %s/%s skipped: %s", namespace, schedule_id, exc)
            continue
        definition = engine.workflows.get(stored.workflow)
        if definition is None:
            # Another engine's workflow: its claim runs out and a worker that knows it fires it.
            logger.warning("schedule %s/%s: workflow %r not registered here", namespace, schedule_id, stored.workflow)
            continue
        # A score of half a millisecond is a claim that ran out: its sweeper saw the tick due then.
        seen = round(score - claim_ms - 0.5) if score % 1 else now
        firings.append((Firing(engine, stored, definition, now, deferred=True), seen))
    # Whether each one's last run is still live, where its overlap asks: read for all in one round trip.
    asks = [
        firing
        for firing, _ in firings
        if firing.last_run and (firing.stored.overlap != "allow_all" or firing.buffered is not None)
    ]
    for firing, status in zip(asks, store.statuses([firing.last_run or "" for firing in asks]), strict=True):
        firing.knew_live(status)
    decided: list[tuple[Firing, TickRecord]] = []
    for firing, seen in firings:
        try:
            decided.append((firing, firing.fire_due(seen)))
        except StorageError as exc:
            stored = firing.stored
            logger.warning(
                "schedule %s/%s not fired (again once its claim runs out): %s",
                stored.namespace,
                stored.schedule_id,
                exc,
            )
    try:
        started = start_ticks(engine, [firing for firing, _ in decided])
    except StorageError as exc:
        logger.warning("%d schedules not fired (again once their claims run out): %s", len(decided), exc)
        started = [False] * len(decided)
    records = [
        (firing.stored.namespace, firing.stored.schedule_id, record)
        for (firing, record), ok in zip(decided, started, strict=True)
        if ok
    ]
    if records:
        store.record_ticks_each(records)
    return now if len(due.members) == BATCH else due.next_due


def next_tick(stored_calendar: Calendar, now_ms: int) -> int | None:
    """The first tick after now: where a new, changed or unpaused schedule starts."""
    return stored_calendar.next_after(now_ms)
