"""``Journal`` on Redis: each write one fenced Lua script (``lua/``).

The fencing check and the write it guards run in the same script, so an
attempt whose epoch is no longer the run's cannot write a thing; a refusal
is raised as ``StaleAttemptError``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import astuple
from typing import Any

from celery_durable.broker import ops as request_of
from celery_durable.broker import schema
from celery_durable.broker.child_types import ChildCall, ChildDone, ChildVerdict, DoneVerdict
from celery_durable.broker.connection import Clock
from celery_durable.broker.journal import (
    READ_ENTRIES_BUDGET,
    AgentCall,
    Began,
    BeginCall,
    CallVerdict,
    Conflict,
    Dispatch,
    Flags,
    HeldBranch,
    JournalIdentity,
    PendingCommit,
    Recorded,
    TaskCall,
    WaitResult,
    Winner,
)
from celery_durable.broker.keys import RunKeys
from celery_durable.broker.ops import OPS
from celery_durable.broker.replies import children
from celery_durable.broker.replies import journal as parse
from celery_durable.broker.schema import Identity, Outcome, SequenceHistory
from celery_durable.errors import StaleAttemptError, StorageCorruptError

ScriptRunner = Callable[[str, Sequence[str], Sequence[Any]], Any]


class RedisJournal(JournalIdentity):
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
        super().__init__(run_id, epoch, clock)
        self._run = run
        self._hmget = read
        self._look_at = look_at
        self._keys = keys
        self._channel = channel

    def _call(self, name: str, args: Sequence[Any] | request_of.Request) -> Any:
        """Script ``name`` on this run's keys its row names (``ops.OPS``), with
        its row's typed request where it has one (as ``StoreCore.call``)."""
        return self._run(name, OPS[name].keys_of(self._keys), OPS[name].argv(name, args))

    def _at(self, seq: str, index: int, identity: str) -> request_of.OpAt:
        return request_of.OpAt(self._epoch, self._clock(), seq, index, identity)

    def note_code(self, code_hash: str) -> None:
        parse.note_code(self._call("note_code", [self._epoch, code_hash]), self._run_id)

    def read_sequence(self, seq: str, start: int = 0) -> SequenceHistory:
        reply = self._call("read_sequence", [seq, start])
        return parse.read_sequence(reply, self._run_id, seq, start)

    def read_sequences(self, seqs: Sequence[str]) -> list[SequenceHistory]:
        if not seqs:
            return []
        reply = self._call("read_sequences", [READ_ENTRIES_BUDGET, *seqs])
        return parse.read_sequences(reply, self._run_id, seqs)

    def begin(self, seq: str, call: BeginCall) -> Began:
        args = [self._epoch, self._clock(), self._channel, seq, *call.argv()]
        reply = self._call("begin_op", args)
        return parse.begin_op(reply, self._run_id)

    def commit_begin(self, seq: str, commit: PendingCommit, call: BeginCall) -> Began | Conflict | Winner:
        args = [self._epoch, self._clock(), self._channel, seq, *astuple(commit), *call.argv()]
        reply = self._call("commit_begin", args)
        return parse.commit_begin(reply, self._run_id)

    def record(self, seq: str, commit: PendingCommit, *, compensation: bool = False) -> Recorded | Conflict:
        reply = self._call("record_op", [self._epoch, self._clock(), seq, *astuple(commit), int(compensation)])
        return parse.record_op(reply, self._run_id)

    def dispatch(
        self, seq: str, index: int, identity: str, width: int, token: str, position: int
    ) -> Dispatch | Conflict:
        args = [self._epoch, seq, index, identity, width, token, position, self._clock()]
        return parse.dispatch(self._call("dispatch", args), self._run_id)

    def sending(self, call: str, messages: Sequence[str]) -> None:
        reply = self._call("sending", [self._epoch, call, "", "", self._clock(), *messages])
        parse.sending(reply, self._run_id)

    def mark_sent(self, call: str) -> None:
        parse.mark_sent(self._call("mark_sent", [self._epoch, call]), self._run_id)

    def branch_outcomes(self, call: str, count: int, only: Sequence[int] | None = None) -> list[str | None]:
        indices = range(count) if only is None else only
        if not indices:
            return []
        return self._hmget(self._keys.journal, [schema.branch_field(call, j) for j in indices])

    def hand_off(self, call: str, giver: str, branches: Sequence[int], messages: Sequence[str]) -> None:
        args = [self._epoch, call, giver, schema.handoff_value(self._epoch, branches), self._clock(), *messages]
        parse.sending(self._call("sending", args), self._run_id)

    def unsent(self, messages: Sequence[str], *, call: str = "", giver: str = "", call_key: str = "") -> None:
        args = [self._epoch, self._clock(), call, giver, call_key, *messages]
        parse.unsent(self._call("unsent", args), self._run_id)

    def handed_off(self, call: str, giver: str) -> list[int]:
        [raw] = self._hmget(self._keys.journal, [schema.handoff_field(call, giver)])
        return schema.parse_handoff(raw, self._epoch)

    def complete_branch(self, call: str, branch: int, outcome: str, wake: str, ending: str = "") -> bool:
        return parse.complete_branch(self._complete(call, branch, outcome, wake, ending, []), self._run_id, held=False)

    def complete_held(
        self, call: str, branch: int, outcome: str, wake: str, ending: str, seq: str, held: PendingCommit
    ) -> bool | Winner | Conflict:
        reply = self._complete(call, branch, outcome, wake, ending, [seq, *astuple(held)])
        return parse.complete_branch(reply, self._run_id, held=True)

    def complete_begin(self, seq: str, held: HeldBranch, call: BeginCall) -> Began | Winner | Conflict:
        finished = [held.call, held.branch, held.outcome, held.wake, held.seq, *astuple(held.step)]
        args = [self._epoch, self._clock(), self._channel, seq, *finished, *call.argv()]
        reply = self._call("complete_begin", args)
        return parse.complete_begin(reply, self._run_id)

    def _complete(self, call: str, branch: int, outcome: str, wake: str, ending: str, held: list[Any]) -> Any:
        args = [self._epoch, call, branch, outcome, wake, self._clock(), ending, *held]
        return self._call("complete_branch", args)

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
        at = self._at(seq, index, schema.Identity.agent(agent_id))
        request = request_of.AgentCall(at, agent_id, request_json, owner, row_json, cut or "", message)
        reply = self._call("agent_call", request)
        return parse.agent_call(reply, self._run_id)

    def wait(
        self, seq: str, index: int, identity: str, kind: str, name: str, due_ms: int | None, owner: str
    ) -> WaitResult | Conflict:
        due = "" if due_ms is None else due_ms
        request = request_of.Wait(self._at(seq, index, identity), kind, name, due, owner, self._channel)
        reply = self._call("wait", request)
        result = parse.wait(reply, self._run_id)
        if isinstance(result, WaitResult) and not result.done and result.due is not None:
            self._look_at(result.due)  # the sweep fires the timer then
        return result

    def call(self, seq: str, index: int, key: str, owner: str, due_ms: int | None, cut: str | None,
             running_row: str, timeout_outcome: str, inputs: str = "") -> TaskCall | Conflict:
        at = self._at(seq, index, schema.Identity.call(key))
        due = "" if due_ms is None else due_ms
        error = f"TaskTimeout: {schema.decode_outcome(timeout_outcome).message}"
        request = request_of.Call(
            at, key, owner, due, cut or "", running_row, timeout_outcome, error, self._channel, inputs
        )
        result = parse.call(self._call("call", request), self._run_id)
        if isinstance(result, TaskCall) and result.verdict is not CallVerdict.HIT and due_ms is not None:
            self._look_at(due_ms)  # the sweep fires the time-out then
        return result

    def child(
        self, seq: str, index: int, key: str, owner: str, due_ms: int | None, cut: str | None,
        child_run_id: str, workflow: str, *, wait: bool,
    ) -> ChildCall | Conflict:
        at = self._at(seq, index, Identity.child(key) if wait else Identity.start_child(key))
        due = "" if due_ms is None else due_ms
        mode = "wait" if wait else "start"
        request = request_of.Child(at, key, owner, due, cut or "", child_run_id, workflow, mode, self._channel)
        reply = self._call("child", request)
        result = children.child(reply, self._run_id)
        if isinstance(result, ChildCall) and result.verdict is ChildVerdict.PENDING and due_ms is not None:
            self._look_at(due_ms)  # the sweep fires the time-out then
        return result

    def child_done(self, key: str, child_run_id: str, outcome: Outcome) -> ChildDone:
        request = request_of.ChildDone.of(self._clock(), key, child_run_id, outcome, "", self._epoch, self._channel)
        reply = self._call("child_done", request)
        done = children.child_done(reply, self._run_id)
        if done.verdict is DoneVerdict.MISSING:
            raise StorageCorruptError(f"Run record {self._run_id} is missing")
        if done.verdict in (DoneVerdict.STALE, DoneVerdict.SETTLED):
            raise StaleAttemptError(f"Run {self._run_id}: this attempt no longer owns the run ({done.verdict})")
        return done

    def mark_compensable(self) -> Flags:
        return children.compensable(self._call("compensable", [self._epoch]), self._run_id)

    def step_over(self, seq: str, index: int) -> Flags:
        reply = self._call("step_over", [self._epoch, seq, index])
        return children.step_over(reply, self._run_id)

    def wake_branches(self, call: str) -> list[int]:
        reply = self._call("wake_branches", [self._epoch, call])
        _, branches = children.wake_branches(reply, self._run_id)
        return branches
