"""A run held in memory, and the lifecycle scripts an in-process driver needs.

``MemoryRun`` is what Redis holds of one run (``memory_prelude.RunState``)
plus the lock that makes each operation atomic, as a Lua script is. Its
methods are the run-level scripts (activate, finish, resume, cancel...),
ported line for line like the journal's, with the signatures of the
``RunStore`` methods that run them, so a driver written against one reads
the same against the other. The journal itself is ``MemoryJournal(run, epoch)``.

Every script that decides to send a Celery message takes that message's
task id and counts it in flight in the run's live hash, as on Redis; the
active-time clock runs only while something is (``memory_liveness``), so
``timeout_seconds`` counts the same time in memory as in Redis and waiting
is not active time. The fleet-wide scripts (``claim_due``,
``claim_dead_workers``) have no run to live in and are not ported: an
in-process driver knows which of its messages it lost.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from celery_durable.broker import schema
from celery_durable.broker.fleet_store import Examined
from celery_durable.broker.journal import READ_ENTRIES_BUDGET, BranchStart, CallDone, Flags, PassHere
from celery_durable.broker.memory_agents import MemoryAgentTurns
from celery_durable.broker.memory_liveness import (
    clock_start,
    liveness,
    lua_number,
    mark_received,
    parse_empty,
    token_done,
    token_queued,
    token_running,
    tokens_clear,
    wake_call_wait,
    wake_waits,
)
from celery_durable.broker.memory_prelude import (
    INCARNATION,
    RunState,
    append_progress,
    check_limits,
    fence,
    flags,
    hincrby,
    interrupt_agents,
    interrupt_steps,
    is_stale_failure,
    made_progress,
    next_epoch,
    sequence_replies,
    sequence_reply,
    settle_row,
)
from celery_durable.broker.progress import MAX_SEQ, PageMode, ProgressSlice, parse_slice
from celery_durable.broker.records import RunRecord
from celery_durable.broker.schema import SequenceHistory
from celery_durable.broker.scripts import now_ms, refuse
from celery_durable.broker.store import Signalled
from celery_durable.errors import StaleAttemptError

Clock = Callable[[], int]
"""Milliseconds since the epoch; the scripts' ``now`` argument."""


class MemoryRun(MemoryAgentTurns):
    """One run's stored state, in memory; thread-safe."""

    def __init__(
        self,
        fields: Mapping[str, str],
        *,
        message: str = "",
        clock: Clock = now_ms,
        lease_ms: int = 30_000,
        lock_ms: int = 30_000,
    ) -> None:
        """create_run.lua: ``fields`` as ``schema.new_run_fields`` builds them;
        ``message`` the task id of the run's first coordinator message."""
        self.state = RunState(run={**fields, "incarnation": INCARNATION, "attempt": "1"})
        self.lock = threading.RLock()
        self.clock = clock
        self.lease_ms = lease_ms
        self.lock_ms = lock_ms
        now = clock()
        token_queued(self.state, message, "c", now, now)

    @property
    def run_id(self) -> str:
        return self.state.run["id"]

    def _fence(self, epoch: int) -> None:
        refusal = fence(self.state, str(epoch))
        if refusal is not None:
            refuse(self.run_id, [refusal])

    # -- reading ------------------------------------------------------------------

    def record(self) -> RunRecord:
        with self.lock:
            return schema.parse_run(self.run_id, dict(self.state.run))

    def step_rows(self) -> dict[str, str]:
        """Every step row: settled ones, then the ones running now (``RunStore.step_rows``)."""
        with self.lock:
            return {**self.state.steps, **self.state.running}

    def agent_rows(self) -> dict[str, str]:
        with self.lock:
            return dict(self.state.agents)

    def refused_writes(self) -> int:
        with self.lock:
            return int(self.state.run.get("refused") or 0)

    def progress_page(self, phase_id: str, mode: PageMode, cursor: int, count: int) -> ProgressSlice:
        """read_progress.lua; the phase index is the stream's records of the phase."""
        cursor = min(max(cursor, 0), MAX_SEQ)
        with self.lock:
            stream = self.state.progress
            scope = [seq for seq, entry in stream.items() if phase_id == "" or entry["phase_id"] == phase_id]
            reply: list[Any] = [self.state.run.get("next_seq") or "0", "", ""]
            if not scope:
                return parse_slice(self.run_id, reply)
            reply[1:3] = [str(scope[0]), str(scope[-1])]
            if mode == "after":
                page = [seq for seq in scope if seq > cursor][:count]
            elif mode == "before":
                page = [seq for seq in scope if seq < cursor][-count:]
            else:
                page = scope[-count:]
            reply += [[f"{seq}-0", [item for pair in stream[seq].items() for item in pair]] for seq in page]
        return parse_slice(self.run_id, reply)

    # -- activation, heartbeats, task starts and ends ------------------------------------

    def activate(self, epoch: int, token: str, resend: str = "") -> Flags | int:
        """activate.lua: the run's flags; or, when another pass holds the lock
        (and was told to run once more), the ms until message ``resend`` is due."""
        with self.lock:
            self._fence(epoch)
            state, run, now = self.state, self.state.run, self.clock()
            if run.get("status") == "paused":
                refuse(self.run_id, ["settled"])
            if self._lock_busy(token, now):
                run["wake"] = "1"
                wait = int(run["lock_until"]) - now + 100
                token_done(state, token, now)
                token_queued(state, resend, "c", now + wait, now)
                return wait
            run.update(lock=token, lock_until=str(now + self.lock_ms), wake="0")
            if run.get("status") == "pending":
                run.update(status="running", started_at=str(now), updated_at=str(now), active_since="")
                attempt = run.get("attempt") or "1"
                append_progress(state, "system", "", f"Attempt {attempt} started", now, indexed=False)
                clock_start(state, now)
            token_running(state, token, now + self.lease_ms, now)
            return flags(state)

    def _lock_busy(self, token: str, now: int) -> bool:
        """Another pass holds the run's lock (activate_run's busy test)."""
        run = self.state.run
        lock = run.get("lock")
        return bool(lock) and lock != token and int(run.get("lock_until") or "0") > now

    def activate_reading(
        self, epoch: int, token: str, resend: str, seq: str, start: int
    ) -> tuple[Flags, SequenceHistory] | int:
        """activate.lua with a tail to read: ``activate``, then sequence
        ``seq`` from ``start`` on, under the same lock."""
        with self.lock:
            activation = self.activate(epoch, token, resend)
            if isinstance(activation, int):
                return activation
            reply = sequence_reply(self.state, seq, start)
        return activation, schema.parse_sequence(self.run_id, seq, reply, start)

    def release(self, token: str, epoch: int) -> bool:
        """release.lua: True when an activation arrived meanwhile and the caller runs again."""
        with self.lock:
            run = self.state.run
            if run.get("lock") != token:
                return False
            if run.get("wake") == "1" and run.get("epoch") == str(epoch) and run.get("status") == "running":
                run["wake"] = "0"
                return True
            run.update(lock="", lock_until="0")
            if run.get("epoch") == str(epoch):
                token_done(self.state, token, self.clock())
            return False

    def redirect_wake(self, epoch: int, token: str, new: str) -> bool:
        """redirect_wake.lua: a wake sent home, not started yet, goes to the coordinator queue as ``new``."""
        with self.lock:
            run, live = self.state.run, self.state.live
            if run.get("epoch") != str(epoch) or run.get("status") != "running":
                return False
            if (live.get(token) or "")[:2] != "q|":
                return False
            now = self.clock()
            del live[token]
            token_queued(self.state, new, "c", now, now)
            return True

    def heartbeat(self, epoch: int, token: str, *, coordinator: bool = False, wake: str = "") -> tuple[Flags, bool]:
        """heartbeat.lua: renew the running task ``token``; the flags, and whether a
        ceiling was newly reached and the coordinator must be woken by message ``wake``."""
        with self.lock:
            self._fence(epoch)
            state, run, now = self.state, self.state.run, self.clock()
            # Only a task still in flight is renewed: a run that settled (a pause)
            # or was taken over cleared the entries, and they must not come back.
            if token in state.live:
                token_running(state, token, now + self.lease_ms, now)
            if coordinator and run.get("lock") == token:
                run["lock_until"] = str(now + self.lock_ms)
            before = run.get("limit") or ""
            reached = check_limits(state, now)
            woken = before == "" and reached != "" and wake != "" and not coordinator
            if woken:
                token_queued(state, wake, "c", now, now)
            return flags(state), woken

    def branch_start(
        self, epoch: int, workflow: str, token: str, call: str, indices: Sequence[int], seqs: Sequence[str]
    ) -> BranchStart | str:
        """branch_start.lua: a branch task's message runs, its lease starts now, and its first reads; or the refusal."""
        with self.lock:
            run = self.state.run
            if "epoch" not in run:
                return "missing"
            if run["epoch"] != str(epoch):
                return "stale"
            if run.get("workflow") != workflow:
                return "forged"
            if run.get("status") not in ("running", "paused"):
                return "settled"
            now = self.clock()
            token_running(self.state, token, now + self.lease_ms, now)
            check_limits(self.state, now)
            journal = self.state.journal
            replies = sequence_replies(self.state, seqs, READ_ENTRIES_BUDGET)
            return BranchStart(
                record=schema.parse_run(self.run_id, dict(run)),
                flags=flags(self.state),
                outcomes=[journal.get(schema.branch_field(call, j)) for j in indices],
                handed_off=schema.parse_handoff(journal.get(schema.handoff_field(call, token)), epoch),
                sequences={
                    seq: schema.parse_sequence(self.run_id, seq, reply)
                    for seq, reply in zip(seqs, replies, strict=False)
                },
            )

    def task_end(self, epoch: int, token: str, wake: str = "") -> bool:
        """task_end.lua: a branch task's message is no longer in flight; True
        when a pause waits for it and the coordinator is woken by ``wake``."""
        with self.lock:
            run = self.state.run
            if run.get("epoch") != str(epoch):
                return False
            now = self.clock()
            token_done(self.state, token, now)
            if run.get("status") == "running" and run.get("pause") == "1" and wake:
                token_queued(self.state, wake, "c", now, now)
                return True
            return False

    def received(self, task_ids: Sequence[str]) -> int:
        """received.lua: queued messages a worker says it received are held."""
        with self.lock:
            return mark_received(self.state, task_ids, self.clock())

    def mark_lost(self, task_ids: Sequence[str]) -> int:
        """mark_lost.lua: queued messages that died with their worker; how many were in flight."""
        with self.lock:
            now, live, marked = self.clock(), self.state.live, 0
            for task_id in task_ids:
                if (live.get(task_id) or "")[:2] == "q|":
                    live[task_id] = f"l|{now}"
                    marked += 1
            return marked

    def examine(self, room: str = "", *, fire_prefix: str = "") -> Examined:
        """examine.lua: status and liveness; with ``fire_prefix`` its due timers
        fire, the owners to wake in ``woken``, the n-th by message "<prefix>-<n>"."""
        with self.lock:
            state, run = self.state, self.state.run
            status, epoch, workflow = run["status"], int(run["epoch"]), run.get("workflow") or ""
            if status not in ("pending", "running"):
                return Examined(status, epoch, workflow, "", "")
            now = self.clock()
            woken: list[str] = []
            if fire_prefix and status == "running":
                woken = wake_waits(state, fire_prefix, now, lambda wait: _due_by(wait, now))
            verdict, detail = liveness(state, now, self.lease_ms, parse_empty(room))
            return Examined(status, epoch, workflow, verdict, str(detail), woken)

    # -- signals --------------------------------------------------------------------------

    def signal(self, name: str, payload_json: str, wake_prefix: str) -> Signalled:
        """signal.lua: keep the signal (in arrival order, whatever the run does now)
        and wake what waits for it; a run that can no longer continue refuses it."""
        with self.lock:
            state, run = self.state, self.state.run
            status = run["status"]
            if status in ("completed", "cancelled") or (status == "error" and run.get("can_resume") != "1"):
                return Signalled("refused", status=status)
            now, signals = self.clock(), state.signals
            n = hincrby(signals, f"n:{name}", 1)
            signals.update({f"p:{name}:{n}": payload_json, f"t:{name}:{n}": str(now)})
            append_progress(state, "system", "", f"Signal {name} received", now, indexed=False)
            owners: list[str] = []
            if status in ("running", "pending"):
                owners = wake_waits(
                    state, wake_prefix, now, lambda wait: wait.get("kind") == "signal" and wait.get("name") == name
                )
            return Signalled("ok", epoch=int(run["epoch"]), owners=owners)

    # -- task calls -------------------------------------------------------------------

    def call_done_here(
        self, epoch: int, key: str, outcome: str, error: str, wake_prefix: str, here: PassHere | None
    ) -> CallDone | None:
        """call_done.lua with the pass to run here: ``call_done``, then, when it
        woke the main body alone and the run is not paused, ``activate_reading``
        for ``here``, under the same lock (none when soft and the lock is busy)."""
        with self.lock:
            owners = self.call_done(epoch, key, outcome, error, wake_prefix)
            if owners is None:
                return None
            run = self.state.run
            if here is None or owners != [schema.MAIN] or run.get("status") == "paused":
                return CallDone(owners)
            if here.soft and self._lock_busy(here.token, self.clock()):
                return CallDone(owners)
            return CallDone(owners, self.activate_reading(epoch, here.token, here.resend, here.seq, here.start))

    def call_done(self, epoch: int, key: str, outcome: str, error: str, wake_prefix: str) -> list[str] | None:
        """call_done.lua: a called task's outcome, journaled by the attempt that
        published it (first write wins); the owners to wake, None when late."""
        with self.lock:
            self._fence(epoch)
            state, run, journal, e = self.state, self.state.run, self.state.journal, str(epoch)
            if journal.get(f"ce:{key}") != e:
                raise StaleAttemptError(f"Run {self.run_id}: this attempt no longer owns the run (stale)")
            current = journal.get(schema.step_field(key))
            if current is not None and not is_stale_failure(current, e):
                return None
            journal[schema.step_field(key)] = outcome
            made_progress(state)
            if outcome.startswith("o"):
                hincrby(run, "steps_done", 1)
            now = self.clock()
            status = "failed" if error else "completed"
            row = settle_row(state.running.get(key) or "{}", status, now, error or None)
            if state.running.pop(key, None) is not None:
                hincrby(run, "steps_running", -1)
            state.steps[key] = row

            def ours(wait: dict[str, Any]) -> bool:
                return wait.get("kind") == "call" and wait.get("name") == key

            settled = json.loads(row)
            op = settled.get("op") if isinstance(settled, dict) else None
            owners = wake_call_wait(state, wake_prefix, now, op if isinstance(op, str) else "", ours)
            return owners if owners is not None else wake_waits(state, wake_prefix, now, ours)

    # -- settling, resuming, cancelling ------------------------------------------------

    def finish(
        self,
        epoch: int,
        status: str,
        *,
        reason: str = "",
        error: str = "",
        can_resume: bool = False,
        result_json: str | None = None,
        message: str = "",
    ) -> None:
        """finish.lua."""
        with self.lock:
            self._fence(epoch)
            run, now = self.state.run, self.clock()
            tokens_clear(self.state, now)
            run.update(
                status=status,
                reason=reason,
                error=error,
                can_resume="1" if can_resume else "0",
                has_result="1" if result_json is not None else "0",
                result=result_json or "",
                finished_at=str(now),
                updated_at=str(now),
                lock="",
                lock_until="0",
                wake="0",
            )
            if status == "completed" and run.get("phase_id"):
                run[f"pe:{run['phase_id']}"] = str(now)
            # Settled for good, the run fences out every later write: a step or
            # turn still running can never finish. A paused run lets them finish.
            if status != "paused":
                interrupt_steps(self.state)
                interrupt_agents(self.state)
                run["agents_running"] = "0"
            if message:
                append_progress(self.state, "system", "", message, now, indexed=False)

    def resume(
        self,
        record: RunRecord,
        *,
        limits_json: str,
        message: str,
        code_hash: str,
        message_id: str = "",
        recovery: bool = False,
        ceilings: str = "",
        room: str = "",
    ) -> int | None:
        """resume.lua: a compare-and-set on epoch and status (and for a
        ``recovery``, the old attempt must be dead); the new epoch, or None.
        The new attempt's first coordinator message is ``message_id``."""
        with self.lock:
            state, run, now = self.state, self.state.run, self.clock()
            if run.get("epoch") != str(record.epoch) or run.get("status") != record.status:
                return None
            if recovery and liveness(state, now, self.lease_ms, parse_empty(room))[0] != "dead":
                return None
            tokens_clear(state, now)
            # A recovery takes over an attempt that died, not the requests made of it.
            cancel, pause = "0", "0"
            if recovery:
                cancel, pause = run.get("cancel") or "0", run.get("pause") or "0"
            epoch = next_epoch(state, now)
            if recovery:
                hincrby(run, "recoveries", 1)
            else:
                made_progress(state)  # a resume by hand starts the count again
            run.update(
                status="running", reason="", error="", can_resume="0", cancel=cancel, pause=pause,
                lock="", lock_until="0", wake="0", lease_until=str(now + self.lease_ms), finished_at="",
                updated_at=str(now), limit="", active_since="", agents_running="0",
            )  # fmt: skip
            for pair in filter(None, ceilings.split(",")):
                name, _, value = pair.partition("=")
                run[name] = value
            interrupt_agents(state)
            if run.get("started_at") == "":
                run["started_at"] = str(now)
            if limits_json:
                run["limits"] = limits_json
            if code_hash:
                run["code_hash"] = code_hash
            interrupt_steps(state)
            token_queued(state, message_id, "c", now, now)
            append_progress(state, "system", "", f"{message} (attempt {run['attempt']})", now, indexed=False)
            return epoch

    def halt(self, record: RunRecord, room: str = "") -> bool:
        """halt.lua: the attempt died and automatic recovery is off."""
        with self.lock:
            state, run, now = self.state, self.state.run, self.clock()
            if run.get("epoch") != str(record.epoch) or run.get("status") != record.status:
                return False
            if liveness(state, now, self.lease_ms, parse_empty(room))[0] != "dead":
                return False
            tokens_clear(state, now)
            run["agents_running"] = "0"
            next_epoch(state, now)
            hincrby(run, "attempt", -1)  # no new attempt runs: the count stays
            run.update(
                status="halted", reason="interrupted",
                error="The attempt driving this run died and automatic recovery is off; resume it to continue",
                can_resume="1", finished_at=str(now), updated_at=str(now), lock="", lock_until="0",
            )  # fmt: skip
            interrupt_steps(state)
            interrupt_agents(state)
            append_progress(state, "system", "", "Run halted: its attempt died", now, indexed=False)
            return True

    def cancel(self, message: str = "") -> tuple[str, int | None]:
        """cancel.lua: ('requested', epoch) — the caller sends coordinator message
        ``message`` —, ('cancelled', None) or ('settled', None)."""
        with self.lock:
            state, run, now = self.state, self.state.run, self.clock()
            status = run.get("status", "")
            if status in ("completed", "cancelled"):
                return "settled", None
            if status in ("pending", "running"):
                run.update(cancel="1", updated_at=str(now))
                token_queued(state, message, "c", now, now)
                return "requested", int(run["epoch"])
            next_epoch(state, now)
            hincrby(run, "attempt", -1)  # fencing only: no new attempt runs
            run.update(
                status="cancelled", reason="cancelled", error=f"Cancelled while {status}", can_resume="0",
                finished_at=str(now), updated_at=str(now), cancel="1",
            )  # fmt: skip
            tokens_clear(state, now)
            append_progress(state, "system", "", "Run cancelled", now, indexed=False)
            return "cancelled", None

    def pause(self, message: str = "") -> tuple[str, int | None]:
        """pause.lua: ('requested', epoch) — the caller sends coordinator message
        ``message`` — or ('settled', None)."""
        with self.lock:
            run = self.state.run
            if run.get("status") not in ("pending", "running"):
                return "settled", None
            run["pause"] = "1"
            now = self.clock()
            token_queued(self.state, message, "c", now, now)
            return "requested", int(run["epoch"])


def _due_by(wait: dict[str, Any], now: int) -> bool:
    """examine.lua's match: a wait with a due time that has come."""
    until = lua_number(wait.get("until"))
    return until is not None and until <= now
