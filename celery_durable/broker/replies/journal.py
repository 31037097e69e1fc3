"""The replies of the journal's scripts (``RedisJournal``), as the typed
results of the ``Journal`` protocol (``broker/journal.py``).

Each is fenced: a refusal is raised (``Refusal.raise_for``), never returned.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal, overload

from celery_durable.broker import schema
from celery_durable.broker.journal import (
    AgentCall,
    AgentVerdict,
    Began,
    CallVerdict,
    Conflict,
    Dispatch,
    Recorded,
    TaskCall,
    WaitResult,
    Winner,
)
from celery_durable.broker.replies.shape import count, flags, ok_only, script, verdict, wake_flag
from celery_durable.broker.schema import SequenceHistory


@script("read_sequence")
def read_sequence(reply: Any, run_id: str, seq: str, start: int) -> SequenceHistory:
    """read_sequence.lua: ``sequence_reply`` (``_prelude.lua``), whose shape
    ``schema.parse_sequence`` owns."""
    return schema.parse_sequence(run_id, seq, reply, start)


@script("read_sequences")
def read_sequences(reply: Any, run_id: str, seqs: Sequence[str]) -> list[SequenceHistory]:
    """read_sequences.lua: {sequence_reply of seqs[0], of seqs[1], ...}, perhaps fewer."""
    if len(reply) > len(seqs):
        raise ValueError(f"{len(reply)} sequences for {len(seqs)} asked")
    return [schema.parse_sequence(run_id, seq, history) for seq, history in zip(seqs, reply, strict=False)]


@script("begin_op")
def begin_op(reply: Any, run_id: str) -> Began:
    """begin_op.lua: {'ok', cancel, pause, limit, outcome or ''}."""
    verdict(reply, run_id, "ok")
    return Began(flags(reply), reply[4] or None)


@script("commit_begin")
def commit_begin(reply: Any, run_id: str) -> Began | Conflict | Winner:
    """commit_begin.lua: {'ok', ...} as begin_op.lua, {'conflict', identity} or {'winner', value}."""
    said = verdict(reply, run_id, "ok", "conflict", "winner")
    if said == "ok":
        return Began(flags(reply), reply[4] or None)
    return _lost(said, reply)


@script("record_op")
def record_op(reply: Any, run_id: str) -> Recorded | Conflict:
    """record_op.lua: {'ok', cancel, pause, limit, value or ''} (the value
    already journaled first, when there is one) or {'conflict', identity}."""
    if verdict(reply, run_id, "ok", "conflict") == "conflict":
        return Conflict(str(reply[1]))
    return Recorded(flags(reply), reply[4] or None)


@script("dispatch")
def dispatch(reply: Any, run_id: str) -> Dispatch | Conflict:
    """dispatch.lua: {'dispatch', cut 0/1, index, index, ...}, {'pending',
    messages in flight} or {'conflict', identity}."""
    said = verdict(reply, run_id, "dispatch", "pending", "conflict")
    if said == "conflict":
        return Conflict(str(reply[1]))
    if said == "pending":
        return Dispatch(pending=True, in_flight=int(reply[1]))
    return Dispatch(cut=reply[1] == 1, indices=[int(j) for j in reply[2:]])


@script("unsent")
def unsent(reply: Any, run_id: str) -> int:
    """unsent.lua: {'ok', how many messages were forgotten}."""
    verdict(reply, run_id, "ok")
    return count(reply[1])


sending = ok_only("sending")
mark_sent = ok_only("mark_sent")
note_code = ok_only("note_code")


@overload
def complete_branch(reply: Any, /, run_id: str, held: Literal[False]) -> bool: ...


@overload
def complete_branch(reply: Any, /, run_id: str, held: bool) -> bool | Winner | Conflict: ...


@script("complete_branch")
def complete_branch(reply: Any, run_id: str, held: bool) -> bool | Winner | Conflict:
    """complete_branch.lua: {'ok', wake 0/1} (True: wake the coordinator);
    with a ``held`` step, {'winner', value} or {'conflict', identity} too."""
    said = verdict(reply, run_id, "ok", *(("winner", "conflict") if held else ()))
    if said == "ok":
        return bool(wake_flag(reply[1]))
    return _lost(said, reply)


@script("complete_begin")
def complete_begin(reply: Any, run_id: str) -> Began | Winner | Conflict:
    """complete_begin.lua: {'ok', cancel, pause, limit, outcome or '', wake
    0/1}, {'winner', value} or {'conflict', identity}."""
    said = verdict(reply, run_id, "ok", "winner", "conflict")
    if said == "ok":
        return Began(flags(reply), reply[4] or None, woke=wake_flag(reply[5]))
    return _lost(said, reply)


@script("agent_call")
def agent_call(reply: Any, run_id: str) -> AgentCall | Conflict:
    """agent_call.lua: {'hit', cancel, pause, limit, outcome}, {'pending',
    ...flags}, {'dispatch', ...flags}, {'limit', ...flags} or {'conflict', identity}."""
    said = verdict(reply, run_id, *AgentVerdict, "conflict")
    if said == "conflict":
        return Conflict(str(reply[1]))
    hit = said == AgentVerdict.HIT
    return AgentCall(AgentVerdict(said), flags(reply), str(reply[4]) if hit else None)


@script("wait")
def wait(reply: Any, run_id: str) -> WaitResult | Conflict:
    """wait.lua: {'done', cancel, pause, limit, outcome json}, {'wait', ...flags,
    due ms or ''} or {'conflict', identity}."""
    said = verdict(reply, run_id, "done", "wait", "conflict")
    if said == "conflict":
        return Conflict(str(reply[1]))
    if said == "done":
        return WaitResult(True, flags(reply), outcome=str(reply[4]))
    due = str(reply[4] or "")
    return WaitResult(False, flags(reply), due=int(float(due)) if due else None)


@script("call")
def call(reply: Any, run_id: str) -> TaskCall | Conflict:
    """call.lua: {'hit', cancel, pause, limit, outcome}, {'publish', ...flags},
    {'pending', ...flags} or {'conflict', identity}."""
    said = verdict(reply, run_id, *CallVerdict, "conflict")
    if said == "conflict":
        return Conflict(str(reply[1]))
    hit = said == CallVerdict.HIT
    return TaskCall(CallVerdict(said), flags(reply), str(reply[4]) if hit else None)


def _lost(said: str, reply: Any) -> Winner | Conflict:
    """A held-back step that could not be journaled as run: ``commit_call`` in ``_prelude.lua``."""
    return Winner(str(reply[1])) if said == "winner" else Conflict(str(reply[1]))
