"""The schedule hash (``P:{sched}:s:N:S``) and the run fields a schedule's runs carry (SPEC §5d)."""

from __future__ import annotations

import uuid

SCHEDULE_FIELDS: dict[str, str] = {
    "workflow": "the workflow its ticks start",
    "cron": "its cron expression, or '' when it ticks every every_ms",
    "every_ms": "its interval in ms, or '' for a cron schedule",
    "timezone": "the IANA time zone its cron is read in",
    "args": "JSON args of the runs it starts",
    "limits": "JSON limits of the runs it starts (over the workflow's own)",
    "overlap": "skip, buffer_one, allow_all or cancel_other",
    "catchup_ms": "how late a tick may start after an outage (ms)",
    "note": "the operator's note, or ''",
    "paused": "'1' while paused",
    "created_at": "ms it was created; the anchor of an every schedule's ticks",
    "updated_at": "ms its specification or paused state last changed",
    "rev": "bumped by every change of its specification or paused state: a sweeper records only under the "
    "rev it read (schedule_record.lua)",
    "next_ms": "its next tick not yet fired (ms), or '' for none",
    "buffered": "a tick held back by overlap buffer_one until its last run settles (ms), or ''",
    "last_run": "the run its latest tick started (overlap is judged against it), or ''",
    "last_tick": "that run's tick (ms)",
}
"""Every field of a schedule hash and what it holds."""

SCHEDULE_RUN = uuid.UUID("6f1d54a4-8c1e-4d36-9d0a-2b6f8f0f5c01")


def schedule_run_id(namespace: str, schedule_id: str, tick_ms: int) -> str:
    """The run a tick starts: derived from the namespace, the schedule and the
    tick, so every sweeper (and a backfill) that fires the tick names the
    same run, and ``create_run.lua`` makes it once. A valid run id (32 hex)."""
    return uuid.uuid5(SCHEDULE_RUN, f"{namespace}/{schedule_id}/{tick_ms}").hex


def schedule_fields(schedule_id: str, tick_ms: int) -> dict[str, str]:
    """The run hash fields that tie a run to its schedule and tick (``new_run_fields`` adds them)."""
    return {"schedule_id": schedule_id, "scheduled_at": str(tick_ms)}
