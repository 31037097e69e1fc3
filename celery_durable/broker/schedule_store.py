"""Schedules in Redis (SPEC §5d): their specifications, the sweep's claims on
their due ticks, and what became of each tick. Part of ``RunStore`` (a base
class of it).

Every schedule lives in the ``{sched}`` slot (keys.py): one due zset for all
of them, so a sweeper claims due ticks the way it claims due runs
(``schedule_claim.lua``), and the scripts that change a schedule touch its
hash, the zset and its lists together. Runs live in their own slots: a tick's
run is created by ``create_run.lua`` under an id derived from the tick, then
the tick is recorded here (``schedule_record.lua``), never both in one script.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

from celery_durable.broker.connection import storage_errors
from celery_durable.broker.keys import ScheduleKeys
from celery_durable.broker.replies import schedules as parse
from celery_durable.broker.replies.schedules import DueSchedules, PutVerdict, RecordVerdict
from celery_durable.broker.store_core import StoreCore

ANY = "*"
"""``TickRecord.buffered_read``: leave the buffered tick as it is."""


@dataclass(frozen=True, slots=True)
class StoredRaw:
    """A schedule hash and its recent actions (JSON, newest first), as read."""

    namespace: str
    schedule_id: str
    fields: dict[str, str]
    recent: list[str]


@dataclass(frozen=True, slots=True)
class TickRecord:
    """What ``schedule_record.lua`` writes: see its header. ``rev``/``next_read``
    None: not checked (a trigger, a backfill), and then the next tick and the
    due zset are left alone."""

    rev: int | None
    next_read: int | str | None
    next_ms: int | None
    due_at: int | None
    buffered_read: int | str | None
    buffered: int | None
    last_run: str | None
    last_tick: int | None
    actions: Sequence[str]
    runs: Sequence[tuple[str, int]]


def _text(value: int | None) -> str:
    return "" if value is None else str(value)


class ScheduleStore(StoreCore):
    """``RunStore``'s calls about schedules."""

    def schedule_keys(self, namespace: str, schedule_id: str) -> ScheduleKeys:
        return self.keys.schedule(namespace, schedule_id)

    def put_schedule(
        self,
        namespace: str,
        schedule_id: str,
        fields: dict[str, str],
        *,
        next_ms: int | None,
        rev: int | None,
        paused: bool | None,
        now_ms: int,
    ) -> PutVerdict:
        """Create the schedule (``rev`` None) or change it under the rev read;
        ``paused`` None keeps its paused state. ``now_ms`` is the time its
        next tick was reckoned from: a new one's creation time, which anchors
        an ``every`` schedule's ticks, so it must be the same reading."""
        k = self.schedule_keys(namespace, schedule_id)
        flat = [item for pair in fields.items() for item in pair]
        mode = "create" if rev is None else "update"
        state = "" if paused is None else ("1" if paused else "0")
        args = [mode, k.member, schedule_id, now_ms, _text(next_ms), _text(rev), state, *flat]
        return parse.schedule_put(self.call("schedule_put", k, args))

    def pause_schedule(
        self, namespace: str, schedule_id: str, paused: bool, next_ms: int | None, note: str | None
    ) -> int | None:
        """Pause it, or unpause it with its next tick; its new rev, None when it does not exist."""
        k = self.schedule_keys(namespace, schedule_id)
        told = "0" if note is None else "1"
        args = [k.member, "1" if paused else "0", self.clock(), _text(next_ms), told, note or ""]
        return parse.schedule_pause(self.call("schedule_pause", k, args))

    def delete_schedule(self, namespace: str, schedule_id: str) -> bool:
        k = self.schedule_keys(namespace, schedule_id)
        retention_ms = self.settings.run_retention_seconds * 1000
        return parse.schedule_delete(self.call("schedule_delete", k, [k.member, schedule_id, retention_ms]))

    def read_schedule(self, namespace: str, schedule_id: str, *, recent: int = 0) -> StoredRaw | None:
        """The schedule and its ``recent`` latest actions, in one round trip; None when it does not exist."""
        found = self.read_schedules([(namespace, schedule_id)], recent=recent)
        return found[0]

    def read_schedules(self, which: Sequence[tuple[str, str]], *, recent: int = 0) -> list[StoredRaw | None]:
        """Several schedules (namespace, id) at once, in one round trip."""
        if not which:
            return []
        with storage_errors():
            pipe = self.client.pipeline(transaction=False)
            for namespace, schedule_id in which:
                k = self.schedule_keys(namespace, schedule_id)
                pipe.hgetall(k.schedule)
                if recent:
                    pipe.lrange(k.recent, 0, recent - 1)
            replies = pipe.execute()
        step = 2 if recent else 1
        out: list[StoredRaw | None] = []
        for i, (namespace, schedule_id) in enumerate(which):
            fields = cast(dict[str, str], replies[i * step])
            actions = cast(list[str], replies[i * step + 1]) if recent else []
            out.append(StoredRaw(namespace, schedule_id, fields, actions) if fields else None)
        return out

    def schedule_ids(self, namespace: str) -> list[str]:
        """The namespace's schedule ids, in order."""
        with storage_errors():
            ids = cast(list[str], self.client.zrange(self.keys.schedule_ids(namespace), 0, -1))
        return [str(item) for item in ids]

    def claim_schedules(self, now_ms: int, most: int, claim_ms: int) -> DueSchedules:
        """The schedules due now, this sweeper's alone for ``claim_ms`` (``schedule_claim.lua``)."""
        reply = self.call("schedule_claim", None, [now_ms, most, claim_ms], self.keys.schedules_due)
        return parse.schedule_claim(reply)

    def record_ticks(self, namespace: str, schedule_id: str, record: TickRecord) -> RecordVerdict:
        return self.record_ticks_each([(namespace, schedule_id, record)])[0]

    def record_ticks_each(self, records: Sequence[tuple[str, str, TickRecord]]) -> list[RecordVerdict]:
        """Several schedules' records, pipelined (``schedule_record.lua`` each)."""
        calls = []
        retention_ms = self.settings.run_retention_seconds * 1000
        kept_since = self.clock() - retention_ms if retention_ms > 0 else 0
        for namespace, schedule_id, record in records:
            k = self.schedule_keys(namespace, schedule_id)
            buffered_read = record.buffered_read
            args: list[Any] = [
                k.member,
                _text(record.rev),
                record.next_read if isinstance(record.next_read, str) else _text(record.next_read),
                _text(record.next_ms),
                _text(record.due_at),
                buffered_read if isinstance(buffered_read, str) else _text(buffered_read),
                _text(record.buffered),
                record.last_run or "",
                _text(record.last_tick),
                20,
                kept_since,
                len(record.actions),
                *record.actions,
                *(item for run_id, tick in record.runs for item in (run_id, tick)),
            ]
            calls.append((k, args))
        replies = self.call_each("schedule_record", calls)
        out = []
        for reply in replies:
            if isinstance(reply, Exception):
                raise reply
            out.append(parse.schedule_record(reply))
        return out

    def schedule_runs(
        self, namespace: str, schedule_id: str, before_ms: int | None, limit: int
    ) -> list[tuple[str, int]]:
        """(run id, tick) of the runs the schedule started, newest tick first,
        before tick ``before_ms`` (None: from the newest)."""
        k = self.schedule_keys(namespace, schedule_id)
        top = "+inf" if before_ms is None else f"({before_ms}"
        with storage_errors():
            found = cast(
                list[tuple[str, float]],
                self.client.zrevrangebyscore(k.runs, top, "-inf", start=0, num=limit, withscores=True),
            )
        return [(str(run_id), int(score)) for run_id, score in found]
