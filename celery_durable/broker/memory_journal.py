"""``Journal`` in memory: each method the Lua script of the same write, ported.

``tests/contract`` runs the same calls against this journal and against
``RedisJournal`` on a real Redis and expects the same typed results, so a
replay unit test on this journal tells the truth about Redis. To keep it
so, every method mirrors one script (named in its docstring) line for line,
through the prelude helpers of ``memory_prelude`` (named as in
``_prelude.lua``), and builds its answer as the Redis side parses the
script's reply. One lock per run makes each method atomic, as a script is:
fan-outs journal from several threads at once.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from celery_durable.broker import schema
from celery_durable.broker.journal import (
    READ_ENTRIES_BUDGET,
    AgentCall,
    Began,
    BeginCall,
    Conflict,
    Dispatch,
    HeldBranch,
    PendingCommit,
    Recorded,
    TaskCall,
    WaitResult,
    Winner,
)
from celery_durable.broker.memory_liveness import refresh_waiting, take_signal, token_done, token_queued
from celery_durable.broker.memory_prelude import (
    begin_call,
    check_limits,
    commit_call,
    cut_sequence,
    fence,
    flags,
    hincrby,
    is_stale_failure,
    made_progress,
    record_op,
    sequence_replies,
    sequence_reply,
    settle_row,
)
from celery_durable.broker.memory_run import MemoryRun
from celery_durable.broker.schema import SequenceHistory
from celery_durable.broker.scripts import refuse


class MemoryJournal:
    """One attempt's journal of one in-memory run."""

    def __init__(self, run: MemoryRun, epoch: int) -> None:
        self._run = run
        self._state = run.state
        self._epoch = epoch
        self._e = str(epoch)  # the epoch as Lua sees it: an ARGV string

    @property
    def run_id(self) -> str:
        return self._run.run_id

    @property
    def epoch(self) -> int:
        return self._epoch

    def _fence(self) -> None:
        """The script's first line; a refusal raised as ``RedisJournal`` raises it."""
        refusal = fence(self._state, self._e)
        if refusal is not None:
            refuse(self.run_id, [refusal])

    def now_ms(self) -> int:
        return self._run.clock()

    def read_sequence(self, seq: str, start: int = 0) -> SequenceHistory:
        """read_sequence.lua; the reply parsed by the parser the Redis side uses."""
        with self._run.lock:
            reply = sequence_reply(self._state, seq, start)
        return schema.parse_sequence(self.run_id, seq, reply, start)

    def read_sequences(self, seqs: Sequence[str]) -> list[SequenceHistory]:
        """read_sequences.lua."""
        with self._run.lock:
            replies = sequence_replies(self._state, seqs, READ_ENTRIES_BUDGET)
        return [schema.parse_sequence(self.run_id, seq, reply) for seq, reply in zip(seqs, replies, strict=False)]

    def begin(self, seq: str, call: BeginCall) -> Began:
        """begin_op.lua."""
        with self._run.lock:
            self._fence()
            outcome = begin_call(self._state, self._e, self._run.clock(), seq, call)
            return Began(flags(self._state), outcome or None)

    def commit_begin(self, seq: str, commit: PendingCommit, call: BeginCall) -> Began | Conflict | Winner:
        """commit_begin.lua: commit_call, then begin_call, in one atomic step."""
        with self._run.lock:
            self._fence()
            verdict, detail = commit_call(self._state, self._e, seq, commit)
            if verdict == "conflict":
                return Conflict(detail)
            if verdict == "winner":
                return Winner(detail)
            outcome = begin_call(self._state, self._e, self._run.clock(), seq, call)
            return Began(flags(self._state), outcome or None)

    def record(self, seq: str, commit: PendingCommit) -> Recorded | Conflict:
        """record_op.lua."""
        with self._run.lock:
            self._fence()
            verdict, detail = commit_call(self._state, self._e, seq, commit)
            if verdict == "conflict":
                return Conflict(detail)
            return Recorded(flags(self._state), detail or None)

    def dispatch(
        self, seq: str, index: int, identity: str, width: int, token: str, position: int
    ) -> Dispatch | Conflict:
        """dispatch.lua."""
        with self._run.lock:
            self._fence()
            journal, e = self._state.journal, self._e
            conflict, replaced = record_op(self._state, seq, index, identity, e)
            if conflict is not None:
                return Conflict(conflict)
            call = schema.call_id(seq, index)
            if replaced is not None:
                # Whatever stood here before, outcomes under this call id are not ours.
                for j in range(width):
                    journal.pop(schema.branch_field(call, j), None)
            stamp = f"{e}:{token}"
            previous = journal.get(f"d:{call}")
            if previous == stamp or (
                previous is not None and previous.startswith(f"{e}:") and journal.get(f"s:{call}") == e
            ):
                return Dispatch(pending=True, in_flight=len(self._state.live))
            indices: list[int] = []
            cut = False
            for j in range(width):
                outcome = journal.get(schema.branch_field(call, j))
                if is_stale_failure(outcome, e):
                    indices.append(j)
                    cut = cut or outcome is not None
            if cut:
                cut_sequence(self._state, seq, str(index), e, str(position))
            journal[f"c:{call}"] = str(len(indices))
            journal[f"d:{call}"] = stamp
            return Dispatch(cut=cut, indices=indices)

    def sending(self, call: str, messages: Sequence[str]) -> None:
        """sending.lua, without a giver."""
        self._sending(call, "", (), messages)

    def mark_sent(self, call: str) -> None:
        """mark_sent.lua."""
        with self._run.lock:
            self._fence()
            self._state.journal[f"s:{call}"] = self._e

    def branch_outcomes(self, call: str, count: int, only: Sequence[int] | None = None) -> list[str | None]:
        """The HMGET ``RedisJournal`` makes."""
        indices = range(max(count, 0)) if only is None else only
        with self._run.lock:
            return [self._state.journal.get(schema.branch_field(call, j)) for j in indices]

    def hand_off(self, call: str, giver: str, branches: Sequence[int], messages: Sequence[str]) -> None:
        """sending.lua, with a giver."""
        self._sending(call, giver, branches, messages)

    def _sending(self, call: str, giver: str, branches: Sequence[int], messages: Sequence[str]) -> None:
        with self._run.lock:
            self._fence()
            journal, e = self._state.journal, self._e
            if not (journal.get(f"d:{call}") or "").startswith(f"{e}:"):
                refuse(self.run_id, ["stale"])
            if giver:
                journal[schema.handoff_field(call, giver)] = schema.handoff_value(int(e), branches)
            now = self._run.clock()
            for message in messages:
                token_queued(self._state, message, "s", now, now)

    def handed_off(self, call: str, giver: str) -> list[int]:
        """The HGET ``RedisJournal`` makes."""
        with self._run.lock:
            return schema.parse_handoff(self._state.journal.get(schema.handoff_field(call, giver)), self.epoch)

    def complete_branch(self, call: str, branch: int, outcome: str, wake: str, ending: str = "") -> bool:
        """complete_branch.lua."""
        done = self._complete(call, branch, outcome, wake, ending, None)
        assert isinstance(done, bool)
        return done

    def complete_held(
        self, call: str, branch: int, outcome: str, wake: str, ending: str, seq: str, held: PendingCommit
    ) -> bool | Winner | Conflict:
        """complete_branch.lua with a held step."""
        return self._complete(call, branch, outcome, wake, ending, (seq, held))

    def complete_begin(self, seq: str, held: HeldBranch, call: BeginCall) -> Began | Winner | Conflict:
        """complete_begin.lua: complete_branch's write, then begin_call, in one atomic step."""
        with self._run.lock:
            self._fence()
            e = self._e
            self._check_dispatched(held.call)
            verdict, detail = commit_call(self._state, e, held.seq, held.step)
            if verdict == "conflict":
                return Conflict(detail)
            if verdict == "winner":
                return Winner(detail)
            now = self._run.clock()
            woken = self._branch_outcome(held.call, held.branch, held.outcome)
            if woken:
                token_queued(self._state, held.wake, "c", now, now)
            outcome = begin_call(self._state, e, now, seq, call)
            return Began(flags(self._state), outcome or None, woke=woken)

    def _check_dispatched(self, call: str) -> None:
        """(Under the lock) refuse an outcome of a fan-out another attempt dispatched."""
        if not (self._state.journal.get(f"d:{call}") or "").startswith(f"{self._e}:"):
            refuse(self.run_id, ["stale"])  # not counted as refused, as in the script

    def _branch_outcome(self, call: str, branch: int, outcome: str) -> bool:
        """(Under the lock) branch_outcome in _prelude.lua: journal it; whether to wake."""
        journal, e = self._state.journal, self._e
        name, counter = schema.branch_field(call, branch), f"c:{call}"
        current = journal.get(name)
        if current is not None and not is_stale_failure(current, e):
            # A second delivery: wake again when everything is in, in case
            # the first delivery died between journaling and waking.
            return int(journal.get(counter) or "0") <= 0
        journal[name] = outcome
        made_progress(self._state)
        return hincrby(journal, counter, -1) <= 0 or outcome[:1] == "f"

    def _complete(
        self, call: str, branch: int, outcome: str, wake: str, ending: str, held: tuple[str, PendingCommit] | None
    ) -> bool | Winner | Conflict:
        with self._run.lock:
            self._fence()
            e = self._e
            self._check_dispatched(call)
            if held is not None:
                verdict, detail = commit_call(self._state, e, *held)
                if verdict == "conflict":
                    return Conflict(detail)
                if verdict == "winner":
                    return Winner(detail)
            woken = self._branch_outcome(call, branch, outcome)
            run = self._state.run
            if ending:
                woken = woken or (run.get("status") == "running" and run.get("pause") == "1" and wake != "")
            now = self._run.clock()
            if woken:  # the message stays running until the caller sent the wake
                token_queued(self._state, wake, "c", now, now)
            elif ending:
                token_done(self._state, ending, now)
            return woken

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
        """agent_call.lua."""
        with self._run.lock:
            self._fence()
            state, e = self._state, self._e
            run, journal = state.run, state.journal
            if cut:
                cut_index, _, position = cut.partition(":")
                cut_sequence(state, seq, cut_index, e, position)
            conflict, _ = record_op(state, seq, index, schema.Identity.agent(agent_id), e)
            if conflict is not None:
                return Conflict(conflict)
            outcome = journal.get(f"a:{agent_id}")
            if outcome is not None and not is_stale_failure(outcome, e):
                return AgentCall("hit", flags(state), outcome)
            # Someone already asked for this turn in this attempt: wait for it too.
            if journal.get(f"qe:{agent_id}") == e:
                waiters = journal.get(f"w:{agent_id}") or ""
                if f" {owner} " not in f" {waiters} ":
                    journal[f"w:{agent_id}"] = f"{waiters} {owner}"
                return AgentCall("pending", flags(state))
            now = self._run.clock()
            reached = check_limits(state, now)
            if reached == "":
                total = run.get("lim_total")
                if total and int(run.get("subagents_used") or "0") >= int(total):
                    reached = run["limit"] = "max_total_subagents"
            if reached != "":
                return AgentCall("limit", flags(state))
            journal.update({f"q:{agent_id}": request_json, f"qe:{agent_id}": e, f"w:{agent_id}": owner})
            hincrby(run, "subagents_used", 1)
            # One row per turn and attempt: a turn interrupted with its attempt keeps its row.
            state.agents[schema.agent_row_key(agent_id, self._epoch)] = row_json
            token_queued(state, message, "a", now, now)
            return AgentCall("dispatch", flags(state))

    def wait(
        self, seq: str, index: int, identity: str, kind: str, name: str, due_ms: int | None, owner: str
    ) -> WaitResult | Conflict:
        """wait.lua."""
        with self._run.lock:
            self._fence()
            state, journal, e = self._state, self._state.journal, self._e
            conflict, replaced = record_op(state, seq, index, identity, e)
            if conflict is not None:
                return Conflict(conflict)
            at = schema.call_id(seq, index)
            outcome_field, due_field = schema.value_field(seq, index), f"wd:{at}"
            # What an abandoned op left at this index is not this wait's.
            if replaced is not None:
                journal.pop(outcome_field, None)
                journal.pop(due_field, None)
            done = journal.get(outcome_field)
            if done is not None:
                return WaitResult(True, flags(state), outcome=done)
            due = journal.get(due_field)
            if due is None:
                due = "" if due_ms is None else str(due_ms)
                journal[due_field] = due
            now = self._run.clock()
            outcome = take_signal(state, name, at) if kind == "signal" else None
            if outcome is None and due != "" and now >= int(due):
                outcome = '{"received":false,"payload":null}' if kind == "signal" else '{"fired":true}'
            if outcome is not None:
                journal[outcome_field] = outcome
                if state.waits.pop(at, None) is not None:
                    refresh_waiting(state)
                made_progress(state)
                return WaitResult(True, flags(state), outcome=outcome)
            entry: dict[str, str | int] = {"owner": owner, "kind": kind, "name": name}
            if due != "":
                entry["until"] = int(due)
            state.waits[at] = json.dumps(entry, separators=(",", ":"), ensure_ascii=False)
            refresh_waiting(state)
            # (PUBLISH of "<run> waiting": nobody listens to an in-memory run.)
            return WaitResult(False, flags(state), due=int(due) if due != "" else None)

    def call(
        self,
        seq: str,
        index: int,
        key: str,
        owner: str,
        due_ms: int | None,
        cut: str | None,
        running_row: str,
        timeout_outcome: str,
    ) -> TaskCall | Conflict:
        """call.lua."""
        with self._run.lock:
            self._fence()
            state, e = self._state, self._e
            run, journal = state.run, state.journal
            if cut:
                cut_index, _, position = cut.partition(":")
                cut_sequence(state, seq, cut_index, e, position)
            conflict, replaced = record_op(state, seq, index, schema.Identity.call(key), e)
            if conflict is not None:
                return Conflict(conflict)
            at = schema.call_id(seq, index)
            due_field = f"wd:{at}"
            if replaced is not None:
                journal.pop(due_field, None)
            outcome = journal.get(schema.step_field(key))
            if outcome is not None and not is_stale_failure(outcome, e):
                state.waits.pop(at, None)  # a call's wait is never in the 'waiting' summary
                return TaskCall("hit", flags(state), outcome)
            due = journal.get(due_field)
            if due is None:
                due = "" if due_ms is None else str(due_ms)
                journal[due_field] = due
            now = self._run.clock()
            if due != "" and now >= int(due):
                # No result within the time-out: the call fails in this attempt.
                journal[schema.step_field(key)] = timeout_outcome
                error = f"TaskTimeout: {schema.decode_outcome(timeout_outcome).message}"
                row = settle_row(state.running.get(key) or running_row, "failed", now, error)
                if state.running.pop(key, None) is not None:
                    hincrby(run, "steps_running", -1)
                state.steps[key] = row
                state.waits.pop(at, None)
                made_progress(state)
                return TaskCall("hit", flags(state), timeout_outcome)
            entry: dict[str, str | int] = {"owner": owner, "kind": "call", "name": key}
            if due != "":
                entry["until"] = int(due)
            state.waits[at] = json.dumps(entry, separators=(",", ":"), ensure_ascii=False)
            verdict = "pending"
            if journal.get(f"ce:{key}") != e:
                # Not published by this attempt yet: publish now, and show it running.
                journal[f"ce:{key}"] = e
                if key not in state.running:
                    hincrby(run, "steps_running", 1)
                state.running[key] = running_row
                verdict = "publish"
            return TaskCall(verdict, flags(state))

