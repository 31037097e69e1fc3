"""The client's schedule methods (SPEC §5d), a base class of ``Client``.

Each method checks and encodes with the pure functions of ``spec`` and
``calendar``, does its Redis I/O through the store, and decodes with
``spec.schedule_info``: an asyncio twin reuses the pure parts and swaps the
I/O. Changes are compare-and-set on the schedule's rev (read, check, write
under the rev read), retried when somebody changed it meanwhile.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime
from typing import TYPE_CHECKING, Any

from celery_durable.broker import schema
from celery_durable.broker.replies.schedules import PutVerdict, RecordVerdict
from celery_durable.broker.schedule_store import ANY
from celery_durable.errors import ScheduleExistsError, ScheduleNotFoundError, StorageError
from celery_durable.schedules.calendar import to_ms
from celery_durable.schedules.firing import Firing
from celery_durable.schedules.spec import (
    MAX_BACKFILL,
    RECENT_MAX,
    ScheduleInfo,
    ScheduleSpec,
    StoredSchedule,
    action,
    check_note,
    check_schedule_id,
    check_spec,
    merged_update,
    parse_stored,
    schedule_info,
)
from celery_durable.workflows.definition import registered_workflow
from celery_durable.workflows.jsonvalue import short_repr

if TYPE_CHECKING:
    from celery_durable.engine import Engine

TRIES = 20
"""Compare-and-set rounds before a change gives up (somebody changes the schedule all the time)."""


def next_for_change(stored: StoredSchedule | None, spec: ScheduleSpec, now_ms: int) -> int | None:
    """Where a new or changed schedule's ticks go on: the first tick after now;
    a change that keeps its calendar keeps the tick it waits for (one due and
    not yet fired is not dropped); an unpause starts from now (the ticks passed
    while paused are not caught up)."""
    anchor = now_ms if stored is None else stored.created_ms
    if (
        stored is not None
        and not stored.paused
        and stored.next_ms is not None
        and (stored.cron, stored.every_ms, stored.timezone) == (spec.cron, spec.every_ms, spec.timezone)
    ):
        return stored.next_ms
    return spec.calendar(anchor).next_after(now_ms)


def check_range(start: Any, end: Any) -> tuple[int, int]:
    """A backfill's ``[start, end)`` in ms; naive datetimes are UTC."""
    for name, value in (("start", start), ("end", end)):
        if not isinstance(value, datetime):
            raise ValueError(f"backfill {name} must be a datetime: {short_repr(value)}")
    return to_ms(start), to_ms(end)


class ScheduleMethods:
    """``create_schedule`` … ``delete_schedule`` of one namespace's client."""

    engine: Engine
    namespace: str

    def create_schedule(
        self,
        schedule_id: str,
        workflow: Any,
        *,
        cron: str | None = None,
        every: Any = None,
        timezone: str = "UTC",
        args: Any = None,
        limits: dict[str, Any] | None = None,
        overlap: str = "skip",
        catchup_window: float = 60,
        paused: bool = False,
        note: str | None = None,
        replace: bool = False,
    ) -> ScheduleInfo:
        """Start ``workflow`` on a calendar: ``cron`` (5 fields, or 6 with seconds
        first) in ``timezone``, or ``every`` seconds from now. An existing id is
        ``ScheduleExistsError`` unless ``replace=True``, which replaces its
        specification and keeps its paused state and recent actions."""
        check_schedule_id(schedule_id)
        spec = check_spec(
            self.engine.workflows,
            workflow=workflow,
            cron=cron,
            every=every,
            timezone=timezone,
            args=args,
            limits=limits,
            overlap=overlap,
            catchup_window=catchup_window,
            paused=paused,
            note=note,
            max_payload_bytes=self.engine.settings.max_payload_bytes,
        )
        store = self.engine.store
        for _ in range(TRIES):
            stored = self._stored(schedule_id) if replace else None
            now = store.now_ms()
            next_ms = next_for_change(stored, spec, now)
            rev = None if stored is None else stored.rev
            state = spec.paused if stored is None else None
            put = store.put_schedule(
                self.namespace, schedule_id, spec.fields(), next_ms=next_ms, rev=rev, paused=state, now_ms=now
            )
            if put is PutVerdict.OK:
                return self.get_schedule(schedule_id)
            if put is PutVerdict.EXISTS and not replace:
                raise ScheduleExistsError(f"Schedule already exists: {schedule_id} (pass replace=True to replace it)")
        raise StorageError(f"Schedule {schedule_id} kept changing while it was written; try again")

    def get_schedule(self, schedule_id: str) -> ScheduleInfo:
        """The schedule: its specification, its next five ticks and its last 20 actions."""
        raw = self.engine.store.read_schedule(self.namespace, self._known_id(schedule_id), recent=RECENT_MAX)
        if raw is None:
            raise ScheduleNotFoundError(f"Schedule not found: {schedule_id}")
        return schedule_info(parse_stored(self.namespace, schedule_id, raw.fields), raw.recent)

    def list_schedules(self) -> list[ScheduleInfo]:
        """This namespace's schedules, by id."""
        store = self.engine.store
        ids = store.schedule_ids(self.namespace)
        raws = store.read_schedules([(self.namespace, i) for i in ids], recent=RECENT_MAX)
        return [
            schedule_info(parse_stored(self.namespace, raw.schedule_id, raw.fields), raw.recent)
            for raw in raws
            if raw is not None
        ]

    def update_schedule(self, /, schedule_id: str, **fields: Any) -> ScheduleInfo:
        """Change any of ``create_schedule``'s fields, checked as it checks them."""
        store = self.engine.store
        for _ in range(TRIES):
            stored = self._existing(schedule_id)
            spec = check_spec(
                self.engine.workflows,
                **merged_update(stored, fields),
                max_payload_bytes=self.engine.settings.max_payload_bytes,
            )
            now = store.now_ms()
            unpaused = stored.paused and not spec.paused
            next_ms = next_for_change(None if unpaused else stored, spec, now)
            if unpaused:
                next_ms = spec.calendar(stored.created_ms).next_after(now)
            state = spec.paused if "paused" in fields else None
            put = store.put_schedule(
                self.namespace, schedule_id, spec.fields(), next_ms=next_ms, rev=stored.rev, paused=state, now_ms=now
            )
            if put is PutVerdict.OK:
                return self.get_schedule(schedule_id)
            if put is PutVerdict.MISSING:
                raise ScheduleNotFoundError(f"Schedule not found: {schedule_id}")
        raise StorageError(f"Schedule {schedule_id} kept changing while it was updated; try again")

    def pause_schedule(self, schedule_id: str, note: str | None = None) -> ScheduleInfo:
        """Fire nothing until unpaused; the ticks passed meanwhile are not caught up."""
        check_note(note)  # create/update's rule: a note stored here must pass a later update
        if self.engine.store.pause_schedule(self.namespace, self._known_id(schedule_id), True, None, note) is None:
            raise ScheduleNotFoundError(f"Schedule not found: {schedule_id}")
        return self.get_schedule(schedule_id)

    def unpause_schedule(self, schedule_id: str, note: str | None = None) -> ScheduleInfo:
        """Fire again, from the first tick after now."""
        check_note(note)
        stored = self._existing(schedule_id)
        store = self.engine.store
        next_ms = stored.calendar.next_after(store.now_ms())
        if store.pause_schedule(self.namespace, schedule_id, False, next_ms, note) is None:
            raise ScheduleNotFoundError(f"Schedule not found: {schedule_id}")
        return self.get_schedule(schedule_id)

    def trigger_schedule(self, schedule_id: str) -> str | None:
        """Start a run now, as a tick at the current time, overlap applied (a
        paused schedule too): its run id, or None when the tick was skipped.
        A tick buffered (``buffer_one``) gives the id its run will have: it
        starts when the schedule's last run settles."""
        stored = self._existing(schedule_id)
        store = self.engine.store
        firing = self._firing(stored)
        run_id = firing.tick(firing.now_ms, stored.overlap)
        record = firing.record_as_is()
        if store.record_ticks(self.namespace, schedule_id, record) is RecordVerdict.STALE:
            # Another tick was buffered meanwhile: this one is skipped instead.
            skipped = [action(firing.now_ms, "skipped", None, firing.now_ms)]
            store.record_ticks(self.namespace, schedule_id, replace(record, buffered_read=ANY, actions=skipped))
            return None
        if run_id is None and firing.stored.buffered is None and firing.buffered == firing.now_ms:
            return schema.schedule_run_id(self.namespace, schedule_id, firing.now_ms)
        return run_id

    def backfill_schedule(self, schedule_id: str, start: datetime, end: datetime) -> list[str]:
        """Start one run for every tick in ``[start, end)``, in tick order, overlap
        ``allow_all`` (a paused schedule too); their run ids. A range backfilled
        (or fired) before gives the same ids and starts nothing more."""
        start_ms, end_ms = check_range(start, end)
        stored = self._existing(schedule_id)
        ticks = stored.calendar.between(start_ms, end_ms, MAX_BACKFILL)
        if len(ticks) > MAX_BACKFILL:
            raise ValueError(f"backfill covers more than {MAX_BACKFILL} ticks: split the range")
        store = self.engine.store
        firing = self._firing(stored)
        run_ids = [firing.start(tick, note_found=False) for tick in ticks]
        if run_ids:
            store.record_ticks(self.namespace, schedule_id, firing.record_as_is())
        return run_ids

    def delete_schedule(self, schedule_id: str) -> None:
        """Stop its ticks; the runs it started are untouched."""
        if not self.engine.store.delete_schedule(self.namespace, self._known_id(schedule_id)):
            raise ScheduleNotFoundError(f"Schedule not found: {schedule_id}")

    # -- helpers ------------------------------------------------------------------

    def _known_id(self, schedule_id: Any) -> str:
        """A well-formed id (else it cannot exist: not found, as an unknown run id is)."""
        try:
            return check_schedule_id(schedule_id)
        except ValueError:
            raise ScheduleNotFoundError(f"Schedule not found: {short_repr(schedule_id)}") from None

    def _firing(self, stored: StoredSchedule) -> Firing:
        definition = registered_workflow(self.engine.workflows, stored.workflow)
        return Firing(self.engine, stored, definition, self.engine.store.now_ms())

    def _existing(self, schedule_id: str) -> StoredSchedule:
        stored = self._stored(schedule_id)
        if stored is None:
            raise ScheduleNotFoundError(f"Schedule not found: {schedule_id}")
        return stored

    def _stored(self, schedule_id: str) -> StoredSchedule | None:
        raw = self.engine.store.read_schedule(self.namespace, self._known_id(schedule_id))
        return None if raw is None else parse_stored(self.namespace, schedule_id, raw.fields)

