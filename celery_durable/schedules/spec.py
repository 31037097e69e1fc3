"""A schedule's specification, checked, and what clients see of one (SPEC §5d).

Pure: no Redis, no engine. The client (and its asyncio twin) checks what it
is given here, encodes it as the schedule hash's fields
(``broker/schema/schedules.py``), and decodes what the store read into a
``ScheduleInfo``. Checking happens before anything is written, so bad input
stores nothing.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any

from celery_durable.errors import StorageCorruptError
from celery_durable.names import WORKFLOW_NAME_MAX, WORKFLOW_NAME_PATTERN, name_rule
from celery_durable.schedules.calendar import Calendar, check_cron, every_ms, from_ms, zone
from celery_durable.workflows import jsonvalue
from celery_durable.workflows.definition import Workflow, registered_workflow
from celery_durable.workflows.jsonvalue import short_repr
from celery_durable.workflows.limits import validate_limits
from celery_durable.workflows.waits import seconds_of

OVERLAPS = ("skip", "buffer_one", "allow_all", "cancel_other")
ACTIONS = ("started", "skipped", "missed", "buffered")
RECENT_MAX = 20
NEXT_TIMES = 5
ON_TIME_MS = 2_000
"""A tick late by up to this much is on time whatever the catch-up window (SPEC §5d)."""
MAX_NOTE = 1_000
MAX_BACKFILL = 10_000
"""Ticks one backfill starts at most; a longer range is a ValueError asking to split it."""

FIELDS = ("workflow", "cron", "every", "timezone", "args", "limits", "overlap", "catchup_window", "paused", "note")
"""``create_schedule``'s fields, which ``update_schedule`` may change."""


@dataclass(frozen=True, slots=True)
class ScheduleSpec:
    """What a schedule was asked to be, checked."""

    workflow: str
    cron: str | None
    every_ms: int | None
    timezone: str
    args_json: str
    limits_json: str
    overlap: str
    catchup_ms: int
    paused: bool
    note: str | None

    def calendar(self, anchor_ms: int) -> Calendar:
        return Calendar(self.cron, self.every_ms, self.timezone, anchor_ms)

    def fields(self) -> dict[str, str]:
        """The schedule hash's specification fields (``schema.SCHEDULE_FIELDS``)."""
        return {
            "workflow": self.workflow,
            "cron": self.cron or "",
            "every_ms": "" if self.every_ms is None else str(self.every_ms),
            "timezone": self.timezone,
            "args": self.args_json,
            "limits": self.limits_json,
            "overlap": self.overlap,
            "catchup_ms": str(self.catchup_ms),
            "note": self.note or "",
        }


def check_note(note: Any) -> None:
    """A schedule's note (create, update, pause, unpause): None, or a string
    Redis can store (UTF-8: no lone surrogate) of at most ``MAX_NOTE`` characters."""
    if note is not None and (not isinstance(note, str) or len(note) > MAX_NOTE):
        raise ValueError(f"note must be a string of at most {MAX_NOTE} characters: {short_repr(note)}")
    if note is not None and not jsonvalue.is_utf8(note):
        raise ValueError(f"note holds a lone surrogate: {short_repr(note)}")


def check_schedule_id(schedule_id: object) -> str:
    if not isinstance(schedule_id, str) or not WORKFLOW_NAME_PATTERN.match(schedule_id):
        raise ValueError(f"schedule_id must be {name_rule(WORKFLOW_NAME_MAX)}: {short_repr(schedule_id)}")
    return schedule_id


def check_spec(
    workflows: Mapping[str, Workflow],
    *,
    workflow: Any,
    cron: Any = None,
    every: Any = None,
    timezone: Any = "UTC",
    args: Any = None,
    limits: Any = None,
    overlap: Any = "skip",
    catchup_window: Any = 60,
    paused: Any = False,
    note: Any = None,
    max_payload_bytes: int,
) -> ScheduleSpec:
    """Every field checked as ``create_schedule`` takes it; a ``ValueError`` naming the first problem."""
    if (cron is None) == (every is None):
        raise ValueError("Give exactly one of cron and every")
    definition = registered_workflow(workflows, workflow)
    cron_text = check_cron(cron) if cron is not None else None
    interval = every_ms(every) if every is not None else None
    zone(timezone)
    args = {} if args is None else args
    args_json = jsonvalue.encode_payload(
        args,
        max_payload_bytes,
        noun="Schedule args",
        too_large="{noun} are {size} bytes, above max_payload_bytes ({limit})",
    )
    definition.validate_args(args)
    if limits is not None:
        validate_limits(limits, allow_none=True)
    if overlap not in OVERLAPS:
        raise ValueError(f"overlap must be one of {', '.join(OVERLAPS)}: {short_repr(overlap)}")
    catchup = seconds_of(catchup_window)
    if catchup is None or not 0 <= catchup <= 10 * 366 * 86400:  # NaN fails it too
        raise ValueError(f"catchup_window must be a number of seconds >= 0: {short_repr(catchup_window)}")
    if not isinstance(paused, bool):
        raise ValueError(f"paused must be True or False: {short_repr(paused)}")
    check_note(note)
    return ScheduleSpec(
        workflow=definition.name,
        cron=cron_text,
        every_ms=interval,
        timezone=timezone,
        args_json=args_json,
        limits_json=jsonvalue.dumps(limits or {}),
        overlap=overlap,
        catchup_ms=round(catchup * 1000),
        paused=paused,
        note=note,
    )


def spec_arguments(stored: StoredSchedule) -> dict[str, Any]:
    """A stored schedule's fields as ``check_spec`` takes them: what an update starts from."""
    return {
        "workflow": stored.workflow,
        "cron": stored.cron,
        "every": None if stored.every_ms is None else stored.every_ms / 1000,
        "timezone": stored.timezone,
        "args": stored.args,
        "limits": stored.limits or None,
        "overlap": stored.overlap,
        "catchup_window": stored.catchup_ms / 1000,
        "paused": stored.paused,
        "note": stored.note,
    }


def merged_update(stored: StoredSchedule, changes: Mapping[str, Any]) -> dict[str, Any]:
    """``update_schedule``'s fields over the stored ones: setting ``cron``
    alone drops ``every`` and the other way round; an unknown field is
    Python's own ``TypeError``."""
    unknown = sorted(set(changes) - set(FIELDS))
    if unknown:
        raise TypeError(f"update_schedule() got an unexpected keyword argument {unknown[0]!r}")
    merged = spec_arguments(stored)
    if "cron" in changes and "every" not in changes:
        merged["every"] = None
    if "every" in changes and "cron" not in changes:
        merged["cron"] = None
    merged.update(changes)
    return merged


# -- what the store holds, decoded -----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class StoredSchedule:
    """A schedule hash, parsed (``schema.SCHEDULE_FIELDS``)."""

    namespace: str
    schedule_id: str
    workflow: str
    cron: str | None
    every_ms: int | None
    timezone: str
    args: Any
    args_json: str
    limits: dict[str, Any]
    overlap: str
    catchup_ms: int
    paused: bool
    note: str | None
    created_ms: int
    updated_ms: int
    rev: int
    next_ms: int | None
    last_run: str | None
    last_tick: int | None
    buffered: int | None

    @property
    def calendar(self) -> Calendar:
        return Calendar(self.cron, self.every_ms, self.timezone, self.created_ms)


def parse_stored(namespace: str, schedule_id: str, raw: Mapping[str, str]) -> StoredSchedule:
    """The schedule hash as a ``StoredSchedule``; anything that does not fit is corruption, said so."""
    try:
        limits = json.loads(raw.get("limits") or "{}")
        if not isinstance(limits, dict):
            raise ValueError("limits is not a JSON object")
        return StoredSchedule(
            namespace=namespace,
            schedule_id=schedule_id,
            workflow=raw["workflow"],
            cron=raw.get("cron") or None,
            every_ms=_int_or_none(raw.get("every_ms")),
            timezone=raw.get("timezone") or "UTC",
            args=json.loads(raw["args"]),
            args_json=raw["args"],
            limits=limits,
            overlap=raw["overlap"],
            catchup_ms=int(raw["catchup_ms"]),
            paused=raw.get("paused") == "1",
            note=raw.get("note") or None,
            created_ms=int(raw["created_at"]),
            updated_ms=int(raw["updated_at"]),
            rev=int(raw["rev"]),
            next_ms=_int_or_none(raw.get("next_ms")),
            last_run=raw.get("last_run") or None,
            last_tick=_int_or_none(raw.get("last_tick")),
            buffered=_int_or_none(raw.get("buffered")),
        )
    except (KeyError, ValueError, TypeError) as exc:
        raise StorageCorruptError(f"Schedule {namespace}/{schedule_id} is corrupt: {exc!r}") from None


def _int_or_none(value: str | None) -> int | None:
    return int(value) if value else None


def action(tick_ms: int, kind: str, run_id: str | None, at_ms: int) -> str:
    """One recent action as the store keeps it (JSON, times in ms)."""
    return json.dumps({"tick": tick_ms, "action": kind, "run_id": run_id, "at": at_ms}, separators=(",", ":"))


def parse_action(raw: str) -> dict[str, Any]:
    """A recent action for clients: ``{"tick", "action", "run_id", "at"}``, times aware UTC."""
    try:
        data = json.loads(raw)
        return {
            "tick": from_ms(int(data["tick"])),
            "action": str(data["action"]),
            "run_id": data.get("run_id") or None,
            "at": from_ms(int(data["at"])),
        }
    except (KeyError, ValueError, TypeError) as exc:
        raise StorageCorruptError(f"Schedule action is corrupt: {raw[:80]!r} ({exc!r})") from None


@dataclass(frozen=True, slots=True)
class ScheduleInfo:
    """One schedule as clients see it (SPEC §5d). Times are aware UTC datetimes;
    ``every`` and ``catchup_window`` are seconds; ``next_times`` the next five
    ticks (empty while paused); ``recent`` the last 20 actions, newest first."""

    schedule_id: str
    workflow: str
    cron: str | None
    every: float | None
    timezone: str
    args: Any
    limits: dict[str, Any]
    overlap: str
    catchup_window: float
    paused: bool
    note: str | None
    created_at: datetime
    updated_at: datetime
    next_times: list[datetime] = field(default_factory=list)
    recent: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """The JSON form: every field, times as ISO 8601 text."""
        return asdict(self) | {
            "created_at": self.created_at.isoformat(),
            "updated_at": self.updated_at.isoformat(),
            "next_times": [when.isoformat() for when in self.next_times],
            "recent": [
                {**item, "tick": item["tick"].isoformat(), "at": item["at"].isoformat()} for item in self.recent
            ],
        }


def schedule_info(stored: StoredSchedule, recent: list[str]) -> ScheduleInfo:
    """What clients see of a stored schedule and its recent actions (newest first)."""
    upcoming: list[int] = []
    if not stored.paused and stored.next_ms is not None:
        upcoming = stored.calendar.upcoming(stored.next_ms, NEXT_TIMES)
    return ScheduleInfo(
        schedule_id=stored.schedule_id,
        workflow=stored.workflow,
        cron=stored.cron,
        every=None if stored.every_ms is None else stored.every_ms / 1000,
        timezone=stored.timezone,
        args=stored.args,
        limits=stored.limits,
        overlap=stored.overlap,
        catchup_window=stored.catchup_ms / 1000,
        paused=stored.paused,
        note=stored.note,
        created_at=from_ms(stored.created_ms),
        updated_at=from_ms(stored.updated_ms),
        next_times=[from_ms(ms) for ms in upcoming],
        recent=[parse_action(raw) for raw in recent],
    )
