"""The replies of the schedules' scripts (``broker/schedule_store.py``)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from celery_durable.broker.replies.shape import count, script


class PutVerdict(StrEnum):
    """``schedule_put.lua``'s verdicts."""

    OK = "ok"
    EXISTS = "exists"
    """A create found the schedule there already."""
    MISSING = "missing"
    """An update found no schedule."""
    CONFLICT = "conflict"
    """An update found a rev other than the one it read: somebody changed it meanwhile."""


@script("schedule_put")
def schedule_put(reply: Any) -> PutVerdict:
    """schedule_put.lua: {'ok', rev} | {'exists'} | {'missing'} | {'conflict'}.
    The new rev is checked, not kept: a caller reads the schedule again."""
    verdict = PutVerdict(str(reply[0]))
    if verdict is PutVerdict.OK:
        int(reply[1])
    elif len(reply) != 1:
        raise ValueError("a refusal carries nothing")
    return verdict


@script("schedule_pause")
def schedule_pause(reply: Any) -> int | None:
    """schedule_pause.lua: {'ok', rev} (the new rev) | {'missing'} (None)."""
    if str(reply[0]) == "missing":
        return None
    if str(reply[0]) != "ok":
        raise ValueError(f"verdict {reply[0]!r}")
    return int(reply[1])


@dataclass(frozen=True, slots=True)
class DueSchedules:
    """``schedule_claim.lua``'s answer: the schedules due now (their ``due``
    members), this sweeper's alone for a while, and when the next falls due."""

    members: list[tuple[str, float]]
    """Each with the score it had: its next tick, or a claim that ran out (a half millisecond)."""
    next_due: int | None
    claim: str = ""


@script("schedule_claim")
def schedule_claim(reply: Any) -> DueSchedules:
    """schedule_claim.lua: {next due score or '', the claim's score, member, score, member, score, ...}."""
    float(reply[1])
    return DueSchedules(
        members=[(str(member), float(score)) for member, score in zip(reply[2::2], reply[3::2], strict=True)],
        next_due=int(float(reply[0])) if reply[0] not in ("", None) else None,
        claim=str(reply[1]),
    )


class RecordVerdict(StrEnum):
    """``schedule_record.lua``'s verdicts."""

    OK = "ok"
    MISSING = "missing"
    """The schedule was deleted."""
    STALE = "stale"
    """It changed since it was read (a new specification, a pause, another sweeper's record)."""


@script("schedule_record")
def schedule_record(reply: Any) -> RecordVerdict:
    """schedule_record.lua: {'ok'} | {'missing'} | {'stale'}."""
    if len(reply) != 1:
        raise ValueError("a verdict alone")
    return RecordVerdict(str(reply[0]))


@script("schedule_delete")
def schedule_delete(reply: Any) -> bool:
    """schedule_delete.lua: 1 when it was deleted, 0 when there was none."""
    return count(reply) == 1
