"""``Journal`` on Redis: each write one fenced Lua script (``lua/``).

The fencing check and the write it guards run in the same script, so an
attempt whose epoch is no longer the run's cannot write a thing; a refusal
is raised as ``StaleAttemptError``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import astuple
from typing import Any, cast

from celery_durable.broker import schema
from celery_durable.broker.journal import (
    READ_ENTRIES_BUDGET,
    AgentCall,
    Began,
    BeginCall,
    Conflict,
    Dispatch,
    Flags,
    HeldBranch,
    PendingCommit,
    Recorded,
    TaskCall,
    WaitResult,
    Winner,
)
from celery_durable.broker.keys import RunKeys
from celery_durable.broker.schema import SequenceHistory
from celery_durable.broker.scripts import Clock, refuse
from celery_durable.errors import StorageCorruptError

ScriptRunner = Callable[[str, Sequence[str], Sequence[Any]], Any]


def flags_of(reply: Sequence[Any], offset: int = 1) -> Flags:
    """The (cancel, pause, limit) triple every fenced script returns after its verdict."""
    try:
        return Flags(cancel=reply[offset] == "1", pause=reply[offset + 1] == "1", limit=str(reply[offset + 2] or ""))
    except IndexError:
        raise StorageCorruptError(f"A journal script replied without its flags: {reply!r:.80}") from None


def _begin_args(call: BeginCall) -> list[Any]:
    """The ARGV tail that begins a call (``begin_call`` in ``_prelude.lua``):
    cut, step key, step row, then the buffered progress records, flat."""
    records = call.records
    return [call.cut or "", call.step_key, call.step_row, len(records), *(f for record in records for f in record)]


class RedisJournal:
    """One attempt's journal of one run, on Redis."""

    def __init__(
        self,
        run: ScriptRunner,
        read: Callable[[str, list[str]], list[str | None]],
        keys: RunKeys,
        *,
        run_id: str,
        epoch: int,
        channel: str,
        look_at: Callable[[int], None],
        clock: Clock,
    ) -> None:
        self._run = run
        self._clock = clock
        self._hmget = read
        self._look_at = look_at
        self._keys = keys
        self._run_id = run_id
        self._epoch = epoch
        self._channel = channel

    @property
    def run_id(self) -> str:
        return self._run_id

    @property
    def epoch(self) -> int:
        return self._epoch

    def now_ms(self) -> int:
        return self._clock()

    def _fenced(self, name: str, keys: Sequence[str], args: Sequence[Any]) -> Any:
        reply = self._run(name, keys, args)
        refuse(self._run_id, reply)
        return reply

    def read_sequence(self, seq: str, start: int = 0) -> SequenceHistory:
        reply = self._run("read_sequence", [self._keys.journal], [seq, start])
        return schema.parse_sequence(self._run_id, seq, reply, start)

    def read_sequences(self, seqs: Sequence[str]) -> list[SequenceHistory]:
        if not seqs:
            return []
        replies = self._run("read_sequences", [self._keys.journal], [READ_ENTRIES_BUDGET, *seqs])
        return [schema.parse_sequence(self._run_id, seq, reply) for seq, reply in zip(seqs, replies, strict=False)]

    def begin(self, seq: str, call: BeginCall) -> Began:
        k = self._keys
        args = [self._epoch, self._clock(), self._channel, seq, *_begin_args(call)]
        reply = self._fenced("begin_op", [k.run, k.progress, k.journal, k.running, k.progress_phases], args)
        return Began(flags_of(reply), reply[4] or None)

    def commit_begin(self, seq: str, commit: PendingCommit, call: BeginCall) -> Began | Conflict | Winner:
        k = self._keys
        args = [self._epoch, self._clock(), self._channel, seq, *astuple(commit), *_begin_args(call)]
        reply = self._run("commit_begin", [k.run, k.progress, k.journal, k.running, k.progress_phases, k.steps], args)
        if reply and reply[0] == "conflict":
            return Conflict(str(reply[1]))
        if reply and reply[0] == "winner":
            return Winner(str(reply[1]))
        refuse(self._run_id, reply)
        return Began(flags_of(reply), reply[4] or None)

    def record(self, seq: str, commit: PendingCommit) -> Recorded | Conflict:
        k = self._keys
        reply = self._run(
            "record_op", [k.run, k.journal, k.steps, k.running], [self._epoch, self._clock(), seq, *astuple(commit)]
        )
        if reply and reply[0] == "conflict":
            return Conflict(str(reply[1]))
        refuse(self._run_id, reply)
        return Recorded(flags_of(reply), reply[4] or None)

    def dispatch(
        self, seq: str, index: int, identity: str, width: int, token: str, position: int
    ) -> Dispatch | Conflict:
        k = self._keys
        args = [self._epoch, seq, index, identity, width, token, position]
        reply = self._run("dispatch", [k.run, k.journal, k.live], args)
        if reply and reply[0] == "conflict":
            return Conflict(str(reply[1]))
        refuse(self._run_id, reply)
        if reply[0] == "pending":
            return Dispatch(pending=True, in_flight=int(reply[1]))
        return Dispatch(cut=reply[1] == 1, indices=[int(j) for j in reply[2:]])

    def sending(self, call: str, messages: Sequence[str]) -> None:
        k = self._keys
        self._fenced("sending", [k.run, k.journal, k.live], [self._epoch, call, "", "", self._clock(), *messages])

    def mark_sent(self, call: str) -> None:
        k = self._keys
        self._fenced("mark_sent", [k.run, k.journal], [self._epoch, call])

    def branch_outcomes(self, call: str, count: int, only: Sequence[int] | None = None) -> list[str | None]:
        indices = range(count) if only is None else only
        if not indices:
            return []
        return self._hmget(self._keys.journal, [schema.branch_field(call, j) for j in indices])

    def hand_off(self, call: str, giver: str, branches: Sequence[int], messages: Sequence[str]) -> None:
        k = self._keys
        args = [self._epoch, call, giver, schema.handoff_value(self._epoch, branches), self._clock(), *messages]
        self._fenced("sending", [k.run, k.journal, k.live], args)

    def handed_off(self, call: str, giver: str) -> list[int]:
        [raw] = self._hmget(self._keys.journal, [schema.handoff_field(call, giver)])
        return schema.parse_handoff(raw, self._epoch)

    def complete_branch(self, call: str, branch: int, outcome: str, wake: str, ending: str = "") -> bool:
        reply = self._complete(call, branch, outcome, wake, ending, [])
        return bool(reply[1] == 1)

    def complete_held(
        self, call: str, branch: int, outcome: str, wake: str, ending: str, seq: str, held: PendingCommit
    ) -> bool | Winner | Conflict:
        reply = self._complete(call, branch, outcome, wake, ending, [seq, *astuple(held)])
        if reply[0] == "winner":
            return Winner(str(reply[1]))
        if reply[0] == "conflict":
            return Conflict(str(reply[1]))
        return bool(reply[1] == 1)

    def complete_begin(self, seq: str, held: HeldBranch, call: BeginCall) -> Began | Winner | Conflict:
        k = self._keys
        keys = [k.run, k.progress, k.journal, k.running, k.progress_phases, k.steps, k.live]
        finished = [held.call, held.branch, held.outcome, held.wake, held.seq, *astuple(held.step)]
        reply = self._fenced(
            "complete_begin", keys, [self._epoch, self._clock(), self._channel, seq, *finished, *_begin_args(call)]
        )
        if reply[0] == "winner":
            return Winner(str(reply[1]))
        if reply[0] == "conflict":
            return Conflict(str(reply[1]))
        return Began(flags_of(reply), reply[4] or None, woke=reply[5] == 1)

    def _complete(self, call: str, branch: int, outcome: str, wake: str, ending: str, held: list[Any]) -> Any:
        k = self._keys
        keys = [k.run, k.journal, k.live, k.steps, k.running]
        args = [self._epoch, call, branch, outcome, wake, self._clock(), ending, *held]
        return self._fenced("complete_branch", keys, args)

    def agent_call(
        self,
        seq: str,
        index: int,
        agent_id: str,
        request_json: str,
        owner: str,
        row_json: str,
        cut: str | None,
        message: str,
    ) -> AgentCall | Conflict:
        k = self._keys
        identity = schema.Identity.agent(agent_id)
        reply = self._run(
            "agent_call",
            [k.run, k.journal, k.agents, k.live],
            [
                *(self._epoch, self._clock(), seq, index, identity, agent_id),
                *(request_json, owner, row_json, cut or "", message),
            ],
        )
        if reply and reply[0] == "conflict":
            return Conflict(str(reply[1]))
        refuse(self._run_id, reply)
        return AgentCall(str(reply[0]), flags_of(reply), cast(str | None, reply[4]) if len(reply) > 4 else None)

    def wait(
        self, seq: str, index: int, identity: str, kind: str, name: str, due_ms: int | None, owner: str
    ) -> WaitResult | Conflict:
        k = self._keys
        args = [self._epoch, self._clock(), seq, index, identity, kind, name, "" if due_ms is None else due_ms, owner]
        reply = self._run("wait", [k.run, k.journal, k.waits, k.signals], [*args, self._channel])
        if reply and reply[0] == "conflict":
            return Conflict(str(reply[1]))
        refuse(self._run_id, reply)
        if reply[0] == "done":
            return WaitResult(True, flags_of(reply), outcome=str(reply[4]))
        due = str(reply[4] or "")
        due_ms = int(float(due)) if due else None
        if due_ms is not None:
            self._look_at(due_ms)  # the sweep fires the timer then
        return WaitResult(False, flags_of(reply), due=due_ms)

    def call(self, seq: str, index: int, key: str, owner: str, due_ms: int | None, cut: str | None,
             running_row: str, timeout_outcome: str) -> TaskCall | Conflict:
        k = self._keys
        identity = schema.Identity.call(key)
        due = "" if due_ms is None else due_ms
        args = [self._epoch, self._clock(), seq, index, identity, key, owner, due, cut or ""]
        error = schema.decode_outcome(timeout_outcome).message
        args += [running_row, timeout_outcome, f"TaskTimeout: {error}", self._channel]
        reply = self._run("call", [k.run, k.journal, k.waits, k.running, k.steps], args)
        if reply and reply[0] == "conflict":
            return Conflict(str(reply[1]))
        refuse(self._run_id, reply)
        if reply[0] != "hit" and due_ms is not None:
            self._look_at(due_ms)  # the sweep fires the time-out then
        return TaskCall(str(reply[0]), flags_of(reply), str(reply[4]) if reply[0] == "hit" else None)
