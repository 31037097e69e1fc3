"""The replies of the scripts that settle a run or ask something of it:
finish, resume, halt (the attempt's and the sweep's), and cancel, pause
and signal (the client's)."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from celery_durable.broker.replies.shape import script, throttled_flag, verdict


@dataclass(frozen=True, slots=True)
class Finished:
    """``finish.lua``'s answer: the run's idempotency key ('' for none; its
    keys now expire, unless it paused), and whether the run ever asked a
    throttle for a slot: only then are slots to be given back."""

    idempotency_key: str
    throttled: bool


@script("finish")
def finish(reply: Any, run_id: str) -> Finished | None:
    """finish.lua: {'ok', idempotency key or '', '1'/'0' throttled}, or {refusal},
    raised; None when it was given a pass's last writes and did not settle
    ({'cancel'}, {'conflict', identity}, {'winner', value}): the caller
    writes them as a pass that did not settle, and decides again."""
    if verdict(reply, run_id, "ok", "cancel", "conflict", "winner") != "ok":
        return None
    return Finished(str(reply[1]), throttled_flag(reply[2]))


@script("resume")
def resume(reply: Any, run_id: str) -> int | None:
    """resume.lua: {'ok', new epoch, attempt} (the new epoch comes back) or
    {'changed', epoch, status} (None: the run was not as the caller saw it,
    or, for a recovery, its attempt is not dead)."""
    if verdict(reply, None, "ok", "changed") == "changed":
        return None
    return int(reply[1])


@script("halt")
def halt(reply: Any, run_id: str) -> str | None:
    """halt.lua: {'ok', the run's idempotency key or ''} (its keys now expire)
    or {'changed'} (None: the run changed meanwhile)."""
    if verdict(reply, None, "ok", "changed") == "changed":
        return None
    return str(reply[1])


class RequestVerdict(StrEnum):
    """What became of a cancel or a pause asked for: ``REQUESTED`` (the live
    attempt is to stop at its next call: send it the coordinator message
    named), ``CANCELLED`` (cancel only: a settled but resumable run was
    cancelled here and now) or ``SETTLED`` (nothing to do: the run had
    settled; for a pause, anything but pending or running)."""

    REQUESTED = "requested"
    CANCELLED = "cancelled"
    SETTLED = "settled"


@dataclass(frozen=True, slots=True)
class Requested:
    """``cancel.lua``'s and ``pause.lua``'s answer: the attempt the
    coordinator message is for (``REQUESTED``), or the status the run had
    settled in (``SETTLED``; '' when the run is gone)."""

    verdict: RequestVerdict
    epoch: int = 0
    status: str = ""
    idempotency_key: str = ""
    """Of a run ``CANCELLED`` here and now, whose keys now expire."""


@script("cancel")
def cancel(reply: Any, run_id: str) -> Requested:
    """cancel.lua: {'requested', epoch}, {'cancelled', idempotency key or ''} or {'settled', status}."""
    return _requested(verdict(reply, None, *RequestVerdict), reply)


@script("pause")
def pause(reply: Any, run_id: str) -> Requested:
    """pause.lua: {'requested', epoch} or {'settled', status} ({'settled'} when the run is gone)."""
    return _requested(verdict(reply, None, RequestVerdict.REQUESTED, RequestVerdict.SETTLED), reply)


def _requested(said: str, reply: Any) -> Requested:
    if said == RequestVerdict.REQUESTED:
        return Requested(RequestVerdict.REQUESTED, epoch=int(reply[1]))
    if said == RequestVerdict.SETTLED:
        return Requested(RequestVerdict.SETTLED, status=str(reply[1]) if len(reply) > 1 else "")
    return Requested(RequestVerdict.CANCELLED, idempotency_key=str(reply[1]))


class SignalVerdict(StrEnum):
    """``signal.lua``'s verdicts: kept for the run (the owners that waited
    for it to be woken), refused (the run cannot continue: completed,
    cancelled, or an error it cannot resume from), or no such run."""

    OK = "ok"
    REFUSED = "refused"
    MISSING = "missing"


@dataclass(frozen=True, slots=True)
class Signalled:
    """``signal.lua``'s answer: with ``OK`` the run's epoch and the owners to
    wake, the n-th by message ``<prefix>-<n>``; with ``REFUSED`` the run's status."""

    verdict: SignalVerdict
    status: str = ""
    epoch: int = 0
    owners: list[str] = field(default_factory=list)


@script("signal")
def signal(reply: Any, run_id: str) -> Signalled:
    """signal.lua: {'ok', epoch, owner, owner, ...}, {'refused', status} or {'missing'}."""
    said = verdict(reply, None, *SignalVerdict)
    if said == SignalVerdict.OK:
        return Signalled(SignalVerdict.OK, epoch=int(reply[1]), owners=[str(owner) for owner in reply[2:]])
    if said == SignalVerdict.REFUSED:
        return Signalled(SignalVerdict.REFUSED, status=str(reply[1]))
    return Signalled(SignalVerdict.MISSING)


@script("note")
def note(reply: Any, run_id: str) -> bool:
    """note.lua: {'ok'} (written), {'said'} (it was already), {'closed'} (the
    run is completed or cancelled) or {'missing'}: whether it was written now."""
    return verdict(reply, None, "ok", "said", "closed", "missing") == "ok"


class ArchiveVerdict(StrEnum):
    """``archive_run.lua``'s verdicts."""

    OK = "ok"  # archived now
    ARCHIVED = "archived"  # it was already
    CHANGED = "changed"  # no longer completed or cancelled, or its keys are not what was read
    MISSING = "missing"  # no such run (its retention ran out)


@script("archive_run")
def archive_run(reply: Any, run_id: str) -> ArchiveVerdict:
    """archive_run.lua: {'ok'}, {'archived'}, {'changed', status} or {'missing'}."""
    return ArchiveVerdict(verdict(reply, None, "ok", "archived", "changed", "missing"))
