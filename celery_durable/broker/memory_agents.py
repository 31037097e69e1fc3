"""Agent turns of a run held in memory: agent_start.lua and agent_finish.lua.

A mixin of ``MemoryRun``: the turn's slot under the run's concurrency
ceiling, and its outcome journaled with its usage, as the Lua does it.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable

from celery_durable.broker import schema
from celery_durable.broker.memory_liveness import owner_kind, token_done, token_queued, token_running
from celery_durable.broker.memory_prelude import RunState, check_limits, hincrby, is_stale_failure, made_progress
from celery_durable.broker.scripts import refuse


class MemoryAgentTurns:
    """``MemoryRun``'s agent-turn scripts; it gives ``state``, ``lock``, ``clock`` and ``_fence``."""

    state: RunState
    lock: threading.RLock
    clock: Callable[[], int]
    lease_ms: int

    @property
    def run_id(self) -> str:
        raise NotImplementedError

    def _fence(self, epoch: int) -> None:
        raise NotImplementedError

    def agent_start(
        self, epoch: int, agent_id: str, token: str, resend: str = "", delay_ms: int = 0
    ) -> tuple[str, str | None]:
        """agent_start.lua: ('go', request json), ('wait', None) — the turn comes
        back as message ``resend`` in ``delay_ms`` —, ('done', None) or
        ('running', None) — message ``token`` runs the turn already, and this is
        the broker delivering it again —; a turn this attempt did not ask for is
        refused (``StaleAttemptError``) as on Redis."""
        with self.lock:
            self._fence(epoch)
            state, run, journal, e = self.state, self.state.run, self.state.journal, str(epoch)
            now = self.clock()
            outcome = journal.get(f"a:{agent_id}")
            if outcome is not None and not is_stale_failure(outcome, e):
                token_done(state, token, now)
                return "done", None
            request = journal.get(f"q:{agent_id}")
            if request is None or journal.get(f"qe:{agent_id}") != e:
                token_done(state, token, now)
                refuse(self.run_id, ["stale"])
            assert request is not None
            row_key = schema.agent_row_key(agent_id, epoch)
            row = json.loads(state.agents.get(row_key) or "{}")
            if row.get("status") == "running" and state.live.get(token, "").startswith("x|"):
                return "running", None  # its first delivery's heartbeat speaks for the turn
            ceiling = run.get("lim_concurrent")
            # A second delivery of a running turn never runs one turn twice at
            # once; at the ceiling, a turn waits for a slot.
            if row.get("status") == "running" or (ceiling and int(run.get("agents_running") or "0") >= int(ceiling)):
                token_done(state, token, now)
                token_queued(state, resend, "a", now + delay_ms, now)
                return "wait", None
            hincrby(run, "agents_running", 1)
            row.update(status="running", started_at=now)
            state.agents[row_key] = json.dumps(row, separators=(",", ":"), ensure_ascii=False)
            token_running(state, token, now + self.lease_ms, now)
            return "go", request

    def agent_finish(
        self,
        epoch: int,
        agent_id: str,
        outcome: str,
        row_json: str,
        usage: tuple[int, int, int],
        token: str,
        wake_prefix: str,
    ) -> list[str]:
        """agent_finish.lua: journal the turn's outcome with its usage (nano-credits,
        prompt and completion tokens); the owners to wake, the n-th (from 1) by
        message "<wake_prefix>-<n>"."""
        with self.lock:
            self._fence(epoch)
            state, run, journal, e = self.state, self.state.run, self.state.journal, str(epoch)
            now = self.clock()
            current = journal.get(f"a:{agent_id}")
            if current is None or is_stale_failure(current, e):
                journal[f"a:{agent_id}"] = outcome
                made_progress(state)
            if int(run.get("agents_running") or "0") > 0:
                hincrby(run, "agents_running", -1)
            hincrby(run, "agents_done", 1)
            for name, amount in zip(("credits_nano", "prompt_tokens", "completion_tokens"), usage, strict=True):
                hincrby(run, name, amount)
            state.agents[schema.agent_row_key(agent_id, epoch)] = row_json
            check_limits(state, now)
            waiters = [owner for owner in (journal.get(f"w:{agent_id}") or "").split() if owner]
            for prefix in ("q:", "qe:", "w:"):
                journal.pop(prefix + agent_id, None)
            for n, owner in enumerate(waiters, start=1):
                token_queued(state, f"{wake_prefix}-{n}", owner_kind(owner), now, now)
            token_done(state, token, now)
            return waiters
