"""The replies of the throttle scripts (``throttle_store.py``): a throttle's
admissions, and a run's slot intents, waits and grants."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from celery_durable.broker.replies.shape import count, script, verdict


class Admission(StrEnum):
    """What a throttle script did for the caller's holder."""

    GRANTED = "granted"  # acquire: the slot is the holder's now
    HELD = "held"  # acquire: the holder held it already (the same attempt asked again)
    QUEUED = "queued"  # acquire: the holder waits in the queue, or kept its place there
    UNKNOWN = "unknown"  # acquire or release: there is no such throttle
    RELEASED = "released"  # release: the slots given back, and whoever may go now admitted
    CREATED = "created"  # set: a new throttle
    UPDATED = "updated"  # set: new settings, applied at once to what waits
    DELETED = "deleted"  # delete, as the client tells it: the waiters go on unthrottled


@dataclass(frozen=True, slots=True)
class Admitted:
    """A throttle script's answer: its verdict, the other holders it admitted
    (``(holder, epoch)``: their runs are to be told), and when an admission
    may next be possible by time alone (a rate), else None."""

    verdict: Admission
    granted: list[tuple[str, int]] = field(default_factory=list)
    next_due: int | None = None


class GrantVerdict(StrEnum):
    """``throttle_granted.lua``'s verdicts."""

    WOKEN = "woken"  # the owner that waited for the slot is woken
    MARKED = "marked"  # nothing waited yet: the op goes on when it asks
    GONE = "gone"  # the run, the attempt or the intent is no more: the slot goes back


@dataclass(frozen=True, slots=True)
class Granted:
    """``throttle_granted.lua``'s answer: the owner woken and the run's workflow (``WOKEN``)."""

    verdict: GrantVerdict
    owner: str = ""
    workflow: str = ""


def _pairs(items: Any) -> list[tuple[str, int]]:
    return [(str(items[i]), int(items[i + 1])) for i in range(0, len(items), 2)]


def _admitted(reply: Any, *verdicts: str) -> Admitted:
    said = Admission(verdict(reply, None, *verdicts))
    if said is Admission.UNKNOWN:
        return Admitted(said)
    due = int(float(reply[1])) if reply[1] not in ("", None) else None
    return Admitted(said, _pairs(reply[2:]), due)


@script("throttle_acquire")
def throttle_acquire(reply: Any) -> Admitted:
    """throttle_acquire.lua: {'unknown'} or {'granted'|'held'|'queued', next
    due ms or '', holder, epoch, ...}."""
    return _admitted(reply, "granted", "held", "queued", "unknown")


@script("throttle_release")
def throttle_release(reply: Any) -> Admitted:
    """throttle_release.lua: {'released'|'unknown', next due ms or '', holder, epoch, ...}."""
    return _admitted(reply, "released", "unknown")


@script("throttle_set")
def throttle_set(reply: Any) -> Admitted:
    """throttle_set.lua: {'created'|'updated', next due ms or '', holder, epoch, ...}."""
    return _admitted(reply, "created", "updated")


@script("throttle_delete")
def throttle_delete(reply: Any) -> list[tuple[str, int]] | None:
    """throttle_delete.lua: {'unknown'} (None) or {'deleted', holder, epoch,
    ...}: the waiters."""
    if verdict(reply, None, "deleted", "unknown") == "unknown":
        return None
    return _pairs(reply[1:])


@script("throttle_enter")
def throttle_enter(reply: Any, run_id: str) -> bool:
    """throttle_enter.lua: {'granted'} (True: the slot is this attempt's
    already), {'entered'}, or a refusal, raised."""
    return verdict(reply, run_id, "granted", "entered") == "granted"


@script("throttle_wait")
def throttle_wait(reply: Any, run_id: str) -> bool:
    """throttle_wait.lua: {'granted'} (True) or {'waiting'}; a refusal, raised."""
    return verdict(reply, run_id, "granted", "waiting") == "granted"


@script("throttle_granted")
def throttle_granted(reply: Any, run_id: str) -> Granted:
    """throttle_granted.lua: {'woken', owner, workflow}, {'marked'} or {'gone'}."""
    said = GrantVerdict(verdict(reply, None, "woken", "marked", "gone"))
    if said is GrantVerdict.WOKEN:
        return Granted(said, str(reply[1]), str(reply[2]))
    return Granted(said)


@script("throttle_forget")
def throttle_forget(reply: Any, run_id: str) -> int:
    """throttle_forget.lua: the number of intents forgotten."""
    return count(reply)
