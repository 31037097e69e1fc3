"""A run held in memory, and the lifecycle scripts an in-process driver needs.

``MemoryRun`` is what Redis holds of one run (``memory_prelude.RunState``)
plus the lock that makes each operation atomic, as a Lua script is. Its
methods are the run-level scripts (activate, finish, resume, cancel...),
ported line for line like the journal's, with the signatures of the
``RunStore`` methods that run them, so a driver written against one reads
the same against the other. The journal itself is ``MemoryJournal(run, epoch)``.

The scripts are ported as the journal seam's commit left them. The liveness
bookkeeping being added to them (a hash of messages in flight, an active-time
clock that runs only while one is) is not modelled: here active time runs
from activation to settlement, and a lease is what marks an attempt alive.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Mapping
from typing import Any

from celery_durable.broker import schema
from celery_durable.broker.journal import Flags
from celery_durable.broker.memory_prelude import (
    INCARNATION,
    RunState,
    active_ms,
    append_progress,
    check_limits,
    fence,
    flags,
    hincrby,
    interrupt_agents,
    interrupt_steps,
    is_stale_failure,
    lease_ms,
    made_progress,
    next_epoch,
)
from celery_durable.broker.progress import MAX_SEQ, PageMode, ProgressSlice, parse_slice
from celery_durable.broker.records import RunRecord
from celery_durable.broker.scripts import now_ms, refuse

Clock = Callable[[], int]
"""Milliseconds since the epoch; the scripts' ``now`` argument."""


class MemoryRun:
    """One run's stored state, in memory; thread-safe."""

    def __init__(
        self, fields: Mapping[str, str], *, clock: Clock = now_ms, lease_ms: int = 30_000, lock_ms: int = 30_000
    ) -> None:
        """create_run.lua: ``fields`` as ``schema.new_run_fields`` builds them."""
        self.state = RunState(run={**fields, "incarnation": INCARNATION, "attempt": "1"})
        self.lock = threading.RLock()
        self.clock = clock
        self.lease_ms = lease_ms
        self.lock_ms = lock_ms

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

    # -- activation and liveness -----------------------------------------------------

    def activate(self, epoch: int, token: str) -> Flags | int:
        """activate.lua: the run's flags, or the ms another pass's lock has left."""
        with self.lock:
            self._fence(epoch)
            run, now = self.state.run, self.clock()
            if run.get("status") == "paused":
                refuse(self.run_id, ["settled"])
            lock, lock_until = run.get("lock"), int(run.get("lock_until") or "0")
            if lock and lock != token and lock_until > now:
                run["wake"] = "1"
                return lock_until - now
            run.update(
                lock=token,
                lock_until=str(now + self.lock_ms),
                lease_until=str(now + lease_ms(self.state, self.lease_ms)),
                wake="0",
            )
            if run.get("status") == "pending":
                run.update(status="running", started_at=str(now), updated_at=str(now), active_since=str(now))
                attempt = run.get("attempt") or "1"
                append_progress(self.state, "system", "", f"Attempt {attempt} started", now, indexed=False)
            return flags(self.state)

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
            return False

    def heartbeat(self, epoch: int, token: str = "") -> Flags:
        """heartbeat.lua."""
        with self.lock:
            self._fence(epoch)
            run, now = self.state.run, self.clock()
            run["lease_until"] = str(now + lease_ms(self.state, self.lease_ms))
            if token and run.get("lock") == token:
                run["lock_until"] = str(now + self.lock_ms)
            check_limits(self.state, now)
            return flags(self.state)

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
            run.update(active_ms=str(active_ms(self.state, now)), active_since="")
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
        require_expired: bool = False,
        ceilings: str = "",
    ) -> int | None:
        """resume.lua: a compare-and-set on epoch and status; the new epoch, or None."""
        with self.lock:
            state, run, now = self.state, self.state.run, self.clock()
            if run.get("epoch") != str(record.epoch) or run.get("status") != record.status:
                return None
            if require_expired and int(run.get("lease_until") or "0") > now:
                return None
            if record.status in ("running", "pending"):
                run["active_ms"] = str(active_ms(state, now))
            # A recovery takes over an attempt that died, not the requests made of it.
            cancel, pause = "0", "0"
            if require_expired:
                cancel, pause = run.get("cancel") or "0", run.get("pause") or "0"
            epoch = next_epoch(state, now)
            if require_expired:
                hincrby(run, "recoveries", 1)
            else:
                made_progress(state)
            run.update(
                status="running", reason="", error="", can_resume="0", cancel=cancel, pause=pause,
                lock="", lock_until="0", wake="0", lease_until=str(now + lease_ms(state, self.lease_ms)),
                finished_at="", updated_at=str(now), limit="", active_since=str(now), agents_running="0",
            )
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
            append_progress(state, "system", "", f"{message} (attempt {run['attempt']})", now, indexed=False)
            return epoch

    def halt(self, record: RunRecord) -> bool:
        """halt.lua: the attempt died and automatic recovery is off."""
        with self.lock:
            state, run, now = self.state, self.state.run, self.clock()
            if (
                run.get("epoch") != str(record.epoch)
                or run.get("status") != record.status
                or int(run.get("lease_until") or "0") > now
            ):
                return False
            run.update(active_ms=str(active_ms(state, now)), active_since="", agents_running="0")
            next_epoch(state, now)
            hincrby(run, "attempt", -1)  # no new attempt runs: the count stays
            run.update(
                status="halted", reason="interrupted",
                error="The attempt driving this run died and automatic recovery is off; resume it to continue",
                can_resume="1", finished_at=str(now), updated_at=str(now), lock="", lock_until="0",
            )
            interrupt_steps(state)
            interrupt_agents(state)
            append_progress(state, "system", "", "Run halted: its attempt died", now, indexed=False)
            return True

    def cancel(self) -> tuple[str, int | None]:
        """cancel.lua: ('requested', epoch), ('cancelled', None) or ('settled', None)."""
        with self.lock:
            state, run, now = self.state, self.state.run, self.clock()
            status = run.get("status", "")
            if status in ("completed", "cancelled"):
                return "settled", None
            if status in ("pending", "running"):
                run.update(cancel="1", updated_at=str(now))
                return "requested", int(run["epoch"])
            next_epoch(state, now)
            hincrby(run, "attempt", -1)  # fencing only: no new attempt runs
            run.update(
                status="cancelled", reason="cancelled", error=f"Cancelled while {status}", can_resume="0",
                finished_at=str(now), updated_at=str(now), cancel="1",
            )
            append_progress(state, "system", "", "Run cancelled", now, indexed=False)
            return "cancelled", None

    def pause(self) -> tuple[str, int | None]:
        """pause.lua: ('requested', epoch) or ('settled', None)."""
        with self.lock:
            run = self.state.run
            if run.get("status") not in ("pending", "running"):
                return "settled", None
            run["pause"] = "1"
            return "requested", int(run["epoch"])

    # -- agent turns -----------------------------------------------------------------

    def agent_start(self, epoch: int, agent_id: str) -> tuple[str, str | None]:
        """agent_start.lua: ('go', request json), ('wait', None) or ('done', None);
        a turn this attempt did not ask for is refused (``StaleAttemptError``)."""
        with self.lock:
            self._fence(epoch)
            state, run, journal, e = self.state, self.state.run, self.state.journal, str(epoch)
            outcome = journal.get(f"a:{agent_id}")
            if outcome is not None and not is_stale_failure(outcome, e):
                return "done", None
            request = journal.get(f"q:{agent_id}")
            if request is None or journal.get(f"qe:{agent_id}") != e:
                refuse(self.run_id, ["stale"])
            assert request is not None
            row_key = schema.agent_row_key(agent_id, epoch)
            row = json.loads(state.agents.get(row_key) or "{}")
            if row.get("status") == "running":
                # A second delivery of a running turn: never run one turn twice at once.
                return "wait", None
            ceiling = run.get("lim_concurrent")
            if ceiling and int(run.get("agents_running") or "0") >= int(ceiling):
                return "wait", None
            hincrby(run, "agents_running", 1)
            row.update(status="running", started_at=self.clock())
            state.agents[row_key] = json.dumps(row, separators=(",", ":"), ensure_ascii=False)
            return "go", request

    def agent_finish(
        self,
        epoch: int,
        agent_id: str,
        outcome: str,
        row_json: str,
        credits_nano: int,
        prompt_tokens: int,
        completion_tokens: int,
    ) -> list[str]:
        """agent_finish.lua: journal the turn's outcome; the owners to wake."""
        with self.lock:
            self._fence(epoch)
            state, run, journal, e = self.state, self.state.run, self.state.journal, str(epoch)
            current = journal.get(f"a:{agent_id}")
            if current is None or is_stale_failure(current, e):
                journal[f"a:{agent_id}"] = outcome
                made_progress(state)
            if int(run.get("agents_running") or "0") > 0:
                hincrby(run, "agents_running", -1)
            hincrby(run, "agents_done", 1)
            hincrby(run, "credits_nano", credits_nano)
            hincrby(run, "prompt_tokens", prompt_tokens)
            hincrby(run, "completion_tokens", completion_tokens)
            state.agents[schema.agent_row_key(agent_id, epoch)] = row_json
            check_limits(state, self.clock())
            waiters = journal.get(f"w:{agent_id}") or ""
            for prefix in ("q:", "qe:", "w:"):
                journal.pop(prefix + agent_id, None)
            return [owner for owner in waiters.split() if owner]
