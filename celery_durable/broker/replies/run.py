"""The replies of one run's lifecycle scripts: its record, its passes'
activation, its tasks' starts, beats and ends, and a called task's answer.

(Settling and the requests of the client and the sweep are in
``control.py``; the journal's own scripts in ``journal.py``.)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, overload

from celery_durable.broker import schema
from celery_durable.broker.journal import Flags
from celery_durable.broker.progress import ProgressRecord, ProgressSlice
from celery_durable.broker.replies.shape import (
    FENCED,
    Refusal,
    count,
    flags,
    script,
    throttled_flag,
    verdict,
    wake_flag,
)
from celery_durable.broker.schema import SequenceHistory
from celery_durable.broker.schema.archive import ARCHIVED, Archived
from celery_durable.broker.schema.run import RunRecord


@dataclass(frozen=True, slots=True)
class PassHere:
    """The main body's pass that a call's answer would run where it came:
    ``call_done`` takes its lock in the same script, as ``activate_reading``
    would (``token`` is the wake's task id, ``<prefix>-1``)."""

    token: str
    namespace: str
    resend: str
    seq: str
    start: int
    soft: bool = False
    """A pass of the run holds the lock in the caller's process: a busy lock
    is left alone (the caller waits for that pass, then activates)."""


Activation = tuple[Flags, SequenceHistory] | int
"""``activate_reading``'s answer: the flags and the sequence's tail once the
lock is taken, or the ms until message ``resend`` is due (the lock was busy)."""


@dataclass(frozen=True, slots=True)
class CallDone:
    """``call_done.lua``'s answer: the owners woken, and, when the caller asked
    to run the main body's pass and the call woke it alone, that pass's
    activation (its lock taken, or busy); None when it did not activate."""

    owners: list[str]
    activation: Activation | None = None
    throttled: bool = True
    """Whether an op of the run ever asked a throttle for a slot: only then
    can the call hold one its answer gives back."""


@dataclass(frozen=True, slots=True)
class BranchStart:
    """A branch task's start (``branch_start``): the run as the task must see
    it, and what its first reads would have read, taken in one round trip."""

    record: RunRecord
    flags: Flags
    outcomes: list[str | None]
    """The journaled outcome of each branch the task holds, in its order."""
    handed_off: list[int]
    """The branches an earlier delivery of this task handed on, in this attempt."""
    sequences: dict[str, SequenceHistory]
    """The sequences it opens first, read ahead (perhaps fewer than asked)."""

@script("create_run")
def create_run(reply: Any, run_id: str) -> bool:
    """create_run.lua: 1 when the run was created, 0 when its record exists already."""
    return count(reply) == 1


@script("index_run")
def index_run(reply: Any) -> str:
    """index_run.lua: the id of the run that owns the start (this one, or an
    earlier one with the same idempotency key)."""
    if not isinstance(reply, str) or not reply:
        raise TypeError(f"run id {reply!r}")
    return reply


@script("discard_run")
def discard_run(reply: Any, run_id: str) -> int:
    """discard_run.lua: how many keys it deleted (0: not the run created with that epoch)."""
    return count(reply)


@script("release_idempotency")
def release_idempotency(reply: Any) -> bool:
    """release_idempotency.lua: 1 when the key was freed, else 0."""
    return count(reply) == 1


@script("read_progress")
def read_progress(reply: Any, run_id: str) -> ProgressSlice | Archived:
    """read_progress.lua: {revision, oldest seq or '', newest seq or '', entry,
    entry, ...}, each entry as XRANGE gives it ({"<seq>-0", {field, value, ...}});
    {revision, 'archived'} for a run whose records are in its archive."""
    if len(reply) == 2 and reply[1] == ARCHIVED:
        return Archived(str(int(reply[0])))
    return ProgressSlice(
        records=[_progress_record(str(entry_id), fields) for entry_id, fields in reply[3:]],
        oldest=int(reply[1]) if reply[1] not in ("", None) else None,
        newest=int(reply[2]) if reply[2] not in ("", None) else None,
        revision=int(reply[0]),
    )


def _progress_record(entry_id: str, flat: Sequence[str]) -> ProgressRecord:
    fields = dict(zip(flat[::2], flat[1::2], strict=True))
    return ProgressRecord(
        seq=int(entry_id.split("-", 1)[0]),
        kind=fields["kind"],
        phase_id=fields.get("phase_id") or None,
        message=fields["message"],
        attempt=int(fields["attempt"]),
        at=int(fields["at"]),
    )


@overload
def activate(reply: Any, /, run_id: str) -> Flags | int: ...


@overload
def activate(reply: Any, /, run_id: str, tail: tuple[str, int]) -> Activation: ...


@script("activate")
def activate(reply: Any, run_id: str, tail: tuple[str, int] | None = None) -> Flags | Activation:
    """activate.lua: {'ok', cancel, pause, limit} followed, when the caller
    asked for the ``tail`` of a sequence (its name and the index it starts
    at), by that tail as ``sequence_reply`` gives it; {'busy', ms until the
    resend is due} (the ms come back); or {refusal} ('settled' for a paused
    run too), raised."""
    if verdict(reply, run_id, "ok", "busy") == "busy":
        return int(reply[1])
    if tail is None:
        return flags(reply)
    seq, start = tail
    return flags(reply), schema.parse_sequence(run_id, seq, reply[4:], start)


class NotRun(StrEnum):
    """Why ``activate_unread`` took no lock: the message is not the run's
    attempt's ('missing', 'stale', 'forged'), the run does not take passes
    now ('settled', a paused run too), or the caller is to read the run and
    activate as a pass that did ('read': the attempt's throttle slot is to
    be taken first, or the message named another namespace)."""

    MISSING = "missing"
    STALE = "stale"
    FORGED = "forged"
    SETTLED = "settled"
    READ = "read"


Unread = tuple[Flags, dict[str, str], SequenceHistory] | int | NotRun
"""``activate_unread``'s answer: the flags, the run's hash as read in the
script just before it took the lock, and the main body's sequence; the ms
until the resend is due (busy); or why it took no lock."""


@script("activate")
def activate_unread(reply: Any, run_id: str, seq: str) -> Unread:
    """activate.lua with the message's workflow and namespace: {'ok', cancel,
    pause, limit, run hash, tail...}, {'busy', ms}, or a ``NotRun`` verdict
    (the fence's refusals are returned, not raised: the caller refuses the
    message as the read it saved would have)."""
    said = reply[0]
    if said in NotRun.__members__.values():
        return NotRun(said)
    if verdict(reply, None, "ok", "busy") == "busy":
        return int(reply[1])
    pairs = reply[4]
    record = {str(pairs[i]): str(pairs[i + 1]) for i in range(0, len(pairs), 2)}
    return flags(reply), record, schema.parse_sequence(run_id, seq, reply[5:], 0)


@script("release")
def release(reply: Any, run_id: str) -> bool:
    """release.lua: 1 when the caller runs one more pass (another activation
    arrived meanwhile), 0 when the lock was released."""
    return count(reply) == 1


@dataclass(frozen=True, slots=True)
class Requeued:
    """``requeue.lua``'s answer: whether the caller sends the new message, and
    whether its note was recorded (the first message since a pass last ran to
    find no worker that knows the workflow)."""

    sent: bool
    first: bool
    delay_ms: int = 0
    """How long the new message waits before it is due: its countdown."""


@script("requeue")
def requeue(reply: Any, run_id: str) -> Requeued:
    """requeue.lua: {sent 0/1, first 0/1, delay ms}."""
    sent, first, delay = reply
    return Requeued(sent=wake_flag(sent), first=wake_flag(first), delay_ms=count(delay))


@dataclass(frozen=True, slots=True)
class Renewal:
    """``heartbeat.lua``'s answer: the run's flags, and whether a ceiling was
    newly reached and the caller must send the coordinator message it named."""

    flags: Flags
    wake: bool = False


@script("heartbeat")
def heartbeat(reply: Any, run_id: str) -> Renewal:
    """heartbeat.lua: {'ok', cancel, pause, limit, wake 0/1} or {refusal}, raised."""
    verdict(reply, run_id, "ok")
    return Renewal(flags(reply), wake_flag(reply[4]))


@script("branch_start")
def branch_start(reply: Any, run_id: str, epoch: int, seqs: Sequence[str]) -> BranchStart | Refusal:
    """branch_start.lua: {'ok', cancel, pause, limit, the run hash (flat), the
    hand-off or false, {outcome or false, ...}, {sequence_reply, ...}
    (perhaps fewer than ``seqs``)}; or {refusal}, returned, not raised:
    'missing', 'stale' (another attempt's message), 'forged' (another
    workflow's) or 'settled'."""
    said = verdict(reply, None, "ok", *Refusal)
    if said != "ok":
        return Refusal(said)
    flat, handed, outcomes, sequences = reply[4:]
    if len(sequences) > len(seqs):
        raise ValueError(f"{len(sequences)} sequences for {len(seqs)} asked")
    return BranchStart(
        record=schema.parse_run(run_id, dict(zip(flat[::2], flat[1::2], strict=True))),
        flags=flags(reply),
        outcomes=[str(outcome) if outcome else None for outcome in outcomes],
        handed_off=schema.parse_handoff(handed or None, epoch),
        sequences={
            seq: schema.parse_sequence(run_id, seq, history) for seq, history in zip(seqs, sequences, strict=False)
        },
    )


@script("task_end")
def task_end(reply: Any, run_id: str) -> bool:
    """task_end.lua: {'ok', wake 0/1}; True when a pause waits for this task
    and the caller must send the coordinator message it named."""
    verdict(reply, None, "ok")
    return wake_flag(reply[1])


class TurnVerdict(StrEnum):
    """``agent_start.lua``'s verdicts. Its 'stale' (the turn was asked for by
    another attempt) is raised as the fence's refusals are."""

    GO = "go"  # the turn has its slot and runs now
    WAIT = "wait"  # at the concurrency ceiling: the turn comes back as the resend message
    DONE = "done"  # the turn's outcome is journaled already
    RUNNING = "running"  # this very message runs the turn already (a redelivery)


@dataclass(frozen=True, slots=True)
class TurnStart:
    """``agent_start.lua``'s answer: ``request_json`` with ``TurnVerdict.GO`` only."""

    verdict: TurnVerdict
    request_json: str = ""


@script("agent_start")
def agent_start(reply: Any, run_id: str) -> TurnStart:
    """agent_start.lua: {'go', request json}, {'wait'}, {'done'}, {'running'}, or {refusal}, raised."""
    said = TurnVerdict(verdict(reply, run_id, *TurnVerdict))
    return TurnStart(said, str(reply[1])) if said is TurnVerdict.GO else TurnStart(said)


@script("agent_finish")
def agent_finish(reply: Any, run_id: str) -> CallDone:
    """agent_finish.lua: {'ok', the owners to wake, space separated,
    throttled} or {refusal}, raised: a turn's answer, as a call's is."""
    verdict(reply, run_id, "ok")
    return CallDone(str(reply[1]).split(), throttled=throttled_flag(reply[2]))


@script("call_done")
def call_done(reply: Any, run_id: str, tail: tuple[str, int] | None) -> CallDone | Refusal | None:
    """call_done.lua: {'ok', throttled, owner, owner, ...}; when the caller
    asked to run the main body's pass (reading ``tail``) and the call woke it
    alone, {'here', throttled, ...what activate.lua returns: 'ok' with the
    flags and tail, or 'busy' and the ms}; {'late'} (None: the call had an
    outcome already); or {refusal}, returned, not raised: the caller first
    stops watching a run that settled or is gone."""
    said = verdict(reply, None, "ok", "here", "late", *FENCED)
    if said == "late":
        return None
    if said in FENCED:
        return Refusal(said)
    throttled = throttled_flag(reply[1])
    if said == "ok":
        return CallDone([str(owner) for owner in reply[2:]], throttled=throttled)
    if tail is None:
        raise ValueError("'here' for a caller that runs no pass")
    return CallDone([schema.MAIN], activate(reply[2:], run_id, tail), throttled)
