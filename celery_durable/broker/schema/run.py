"""The run hash (``P:{R}:run``): every field, how a new run's is built, and
the run record it parses into (``RunRecord``, by ``parse_run``)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from celery_durable.broker.schema.rows import optional_ms
from celery_durable.errors import StorageCorruptError

TERMINAL_STATUSES = frozenset({"completed", "halted", "paused", "cancelled", "error"})
STATUSES = ("pending", "running", *sorted(TERMINAL_STATUSES))


@dataclass(frozen=True, slots=True)
class RunRecord:
    run_id: str
    workflow: str
    namespace: str
    status: str
    epoch: int
    attempt: int
    reason: str | None
    error: str | None
    can_resume: bool
    args: Any
    limits: dict[str, Any]
    has_result: bool
    result: Any
    code_hash: str
    created_at: int
    started_at: int | None
    finished_at: int | None
    phase: str | None
    phase_id: str | None
    steps_done: int
    steps_running: int
    cancel_requested: bool
    pause_requested: bool
    lease_until: int
    lock_until: int
    idempotency_key: str | None
    agents_running: int = 0
    agents_done: int = 0
    subagents_used: int = 0
    credits_nano: int = 0
    limit_reached: str | None = None
    phase_times: dict[str, tuple[int | None, int | None]] = field(default_factory=dict)
    waiting_for: dict[str, Any] | None = None
    """What the run waits for: {"kind": "timer"|"signal"|"child"|"throttle", "name", "until" (ms or None)}."""
    recoveries: int = 0
    """Take-overs in a row with nothing new journaled between them (a failure
    in place of another is nothing new: ``journals_new`` in ``_prelude.lua``)."""
    unserved_since: int | None = None
    """Since when (ms) its messages find only workers that do not know its workflow."""
    parent_run_id: str | None = None
    """The run that started this one as a child (SPEC §5b), else None."""
    parent_key: str | None = None
    children: int = 0
    """Child keys the run started: none means no child to look at."""
    schedule_id: str | None = None
    """The schedule whose tick started the run (SPEC §5d), else None."""
    scheduled_at: int | None = None
    """That tick, in ms."""
    compensates: bool = False
    """A saga of the run registered a compensation (SPEC §5c)."""
    attempt_code_hash: str = ""
    """The code hash its latest pass ran (``code_hash`` is the one it started
    with): after a run stopped on nondeterminism, the code that diverged."""
    trace_parent: str = ""
    """W3C traceparent of the span the run was started under ('' : none; ``telemetry``)."""
    trace_attempt: str = ""
    """W3C traceparent of the span that started the current attempt, when it
    was not the start ('' : the run's ``trace_parent``)."""
    throttle: str | None = None
    """The throttle whose slot the run holds while it runs (SPEC §5e), else None."""
    throttle_key: str | None = None
    priority: int = 0
    """Its place among a throttle's waiters: higher first."""
    slot: int | None = None
    """The epoch whose attempt was given the run's throttle slot, else None."""


RUN_FIELDS: dict[str, str] = {
    "id": "the run id (scripts publish it on the events channel)",
    "workflow": "workflow name",
    "namespace": "namespace the run is listed in",
    "status": "pending, running, completed, halted, paused, cancelled or error",
    "epoch": "the fencing token: every write of an attempt names it",
    "attempt": "attempts users see (the epoch may jump after a Redis restart)",
    "incarnation": "Redis run_id under which the epoch was last bumped",
    "reason": "stable code of a settled run's status, or ''",
    "error": "human-readable error of a settled run, or ''",
    "can_resume": "'1' when resume is allowed",
    "args": "JSON arguments",
    "limits": "JSON limits in force",
    "has_result": "'1' when result holds the run's JSON result",
    "result": "JSON result",
    "code_hash": "hash of the workflow's code and meta the run started with (what resume compares)",
    "attempt_code_hash": "hash of the code the run's latest pass ran, written by note_code.lua only when it "
    "differs from what the run has ('' : the code it started with); for a run stopped on nondeterminism, "
    "the code that diverged",
    "idempotency_key": "the start's idempotency key, or ''",
    "created_at": "ms",
    "started_at": "ms, or '' before the first activation",
    "finished_at": "ms, or '' while the run can still run",
    "updated_at": "ms of the last status change",
    "phase": "title of the current phase",
    "phase_id": "id of the current phase",
    "ps:": "ps:<phase id>: ms the phase began",
    "pe:": "pe:<phase id>: ms the phase ended",
    "next_seq": "last progress seq handed out: the run's progress revision",
    "noted:": "noted:<what>: ms a note of the runtime's was said (note.lua: once each)",
    "events": "last history event number handed out (record_event in _prelude.lua): the history's length",
    "progress_max": "progress records kept (0: all)",
    "steps_done": "steps journaled as completed",
    "steps_running": "rows in the running hash",
    "agents_running": "agent turns holding a concurrency slot",
    "agents_done": "agent turns finished",
    "subagents_used": "agent turns dispatched (max_total_subagents counts these)",
    "credits_nano": "AI credits used, in nano-credits",
    "prompt_tokens": "agent prompt tokens used",
    "completion_tokens": "agent completion tokens used",
    "lim_concurrent": "max_concurrent_subagents ceiling, or ''",
    "lim_total": "max_total_subagents ceiling, or ''",
    "lim_credits_nano": "max_ai_credits ceiling in nano-credits, or ''",
    "lim_timeout_ms": "timeout_seconds ceiling in ms, or ''",
    "limit": "name of the ceiling reached, or ''",
    "active_ms": "active time of attempts that ended",
    "active_since": "ms the running attempt's active time began, or ''",
    "cancel": "'1' once cancellation was requested",
    "pause": "'1' once a pause was requested",
    "lock": "token of the coordinator pass holding the activation lock, or ''",
    "lock_until": "ms the lock expires",
    "wake": "'1' when an activation arrived while the lock was held",
    "lease_until": "ms the attempt's lease runs out",
    "recoveries": "take-overs since the run last journaled something new",
    "refused": "writes the fence refused (stale epochs), for operators",
    "unserved_since": "ms a message of the run first reached a worker that does not know its workflow, "
    "since a pass last ran; '' while one that knows it runs it (requeue.lua)",
    "unserved_passes": "how many times its messages were passed on by workers that do not know its workflow "
    "since a pass or a branch of it last ran: the next pass-on's backoff doubles with it (requeue.lua)",
    "waiting": "JSON summary of what the run waits for (snapshot.waiting_for), or ''",
    "ixv": "how many times its status or waiting summary changed (set_status, set_waiting in _prelude.lua): "
    "the version its namespace's indexes were written from (run_index.py); absent: 0",
    "parent_run_id": "the run that started this one with ctx.child/ctx.start_child (schema.children), or absent",
    "parent_key": "the key its parent started it under, or absent",
    "schedule_id": "the schedule whose tick started the run (schema.schedules), or absent",
    "scheduled_at": "that tick (ms), or absent",
    "children": "how many child keys the run started (its children hash's fields)",
    "compensates": "'1' once a saga of the run registered a compensation: a cancelled run replays to run them",
    "throttle": "the throttle the run holds a slot of while it runs (start_workflow's throttle=), or absent",
    "throttle_key": "its throttle key, or absent ('' : none)",
    "priority": "its priority among a throttle's waiters (higher first), or absent (0)",
    "slot": "the epoch whose attempt was given the run's throttle slot ('' : none yet): a pass of another "
    "attempt asks for one first (tasks/throttling.py)",
    "throttled": "'1' once an op of the run wrote a slot intent (its throttles hash): a settle gives them back",
    "trace_parent": "W3C traceparent of the span the run was started under (the caller's, or the start's own), "
    "written with the run by create_run.lua; '' when the start knew none: the run's trace is then its run id "
    "(docs/telemetry.md)",
    "trace_attempt": "W3C traceparent of the span that began the current attempt (a recovery's, a resume's), "
    "set by resume.lua with the new epoch; '' for the first attempt or when that span was not traced",
}
"""Every field of the run hash and what it holds; prefixes end with ':'."""

THROTTLE_FIELDS: dict[str, str] = {
    "concurrency": "slots held at once across the fleet, or absent (P:{throttle:N:T}:conf; throttle_set.lua)",
    "rate_n": "slots taken in any window of rate_ms, or absent",
    "rate_ms": "the rate's window in ms",
    "pk_concurrency": "slots held at once per throttle key, or absent",
    "pk_rate_n": "slots taken per key in any window of pk_rate_ms, or absent",
    "pk_rate_ms": "the per-key rate's window in ms",
    "seq": "the waiters' arrival counter (their rank's second half)",
    "created_at": "ms",
    "updated_at": "ms of the last set_throttle",
}
"""Every field of a throttle's conf hash."""

INDEX_META_FIELDS: dict[str, str] = {
    "built": "'1' once the namespace's indexes cover every run it holds (P:{ns:N}:ixmeta; run_index.py)",
}


def new_run_fields(
    *,
    run_id: str,
    workflow: str,
    namespace: str,
    args_json: str,
    limits_json: str,
    code_hash: str,
    created_ms: int,
    lease_ms: int,
    idempotency_key: str | None,
    progress_max: int,
    ceilings: Mapping[str, str],
    trace_parent: str = "",
) -> dict[str, str]:
    """The run hash of a run that was just started (``create_run.lua`` adds
    ``incarnation`` and ``attempt``)."""
    return {
        "id": run_id,
        "workflow": workflow,
        "namespace": namespace,
        "status": "pending",
        "epoch": "1",
        "args": args_json,
        "limits": limits_json,
        "code_hash": code_hash,
        "created_at": str(created_ms),
        # A pending run is given one lease to be picked up before the
        # recovery sweep considers its coordinator message lost.
        "lease_until": str(created_ms + lease_ms),
        "started_at": "",
        "finished_at": "",
        "can_resume": "0",
        "has_result": "0",
        "next_seq": "0",
        "idempotency_key": idempotency_key or "",
        "progress_max": str(progress_max),
        **ceilings,
        # Only when there is one: a run started outside any trace costs no field.
        **({"trace_parent": trace_parent} if trace_parent else {}),
    }


def parse_run(run_id: str, raw: Mapping[str, str]) -> RunRecord:
    """A run hash as a ``RunRecord``; anything that does not fit is corruption, said as such."""
    try:
        phase_times: dict[str, tuple[int | None, int | None]] = {}
        for name, value in raw.items():
            if name.startswith(("ps:", "pe:")):
                start, end = phase_times.get(name[3:], (None, None))
                if name.startswith("ps:"):
                    start = int(value)
                else:
                    end = int(value)
                phase_times[name[3:]] = (start, end)
        status = raw["status"]
        if status not in STATUSES:
            raise ValueError(f"unknown status {status!r}")
        has_result = raw.get("has_result") == "1"
        limits = json.loads(raw.get("limits") or "{}")
        if not isinstance(limits, dict):
            raise ValueError("limits is not a JSON object")
        return RunRecord(
            run_id=run_id,
            workflow=raw["workflow"],
            namespace=raw["namespace"],
            status=status,
            epoch=int(raw["epoch"]),
            attempt=int(raw.get("attempt") or raw["epoch"]),
            reason=raw.get("reason") or None,
            error=raw.get("error") or None,
            can_resume=raw.get("can_resume") == "1",
            args=json.loads(raw["args"]),
            limits=limits,
            has_result=has_result,
            result=json.loads(raw["result"]) if has_result else None,
            code_hash=raw.get("code_hash", ""),
            attempt_code_hash=raw.get("attempt_code_hash") or raw.get("code_hash", ""),
            created_at=int(raw["created_at"]),
            started_at=_optional_int(raw.get("started_at")),
            finished_at=_optional_int(raw.get("finished_at")),
            phase=raw.get("phase") or None,
            phase_id=raw.get("phase_id") or None,
            steps_done=int(raw.get("steps_done") or 0),
            steps_running=max(0, int(raw.get("steps_running") or 0)),
            cancel_requested=raw.get("cancel") == "1",
            pause_requested=raw.get("pause") == "1",
            lease_until=int(raw.get("lease_until") or 0),
            lock_until=int(raw.get("lock_until") or 0),
            idempotency_key=raw.get("idempotency_key") or None,
            phase_times=phase_times,
            agents_running=max(0, int(raw.get("agents_running") or 0)),
            agents_done=int(raw.get("agents_done") or 0),
            subagents_used=int(raw.get("subagents_used") or 0),
            credits_nano=int(raw.get("credits_nano") or 0),
            limit_reached=raw.get("limit") or None,
            waiting_for=_waiting(raw.get("waiting")),
            unserved_since=_optional_int(raw.get("unserved_since")),
            recoveries=int(raw.get("recoveries") or 0),
            parent_run_id=raw.get("parent_run_id") or None,
            parent_key=raw.get("parent_key") or None,
            children=int(raw.get("children") or 0),
            schedule_id=raw.get("schedule_id") or None,
            scheduled_at=_optional_int(raw.get("scheduled_at")),
            compensates=raw.get("compensates") == "1",
            trace_parent=raw.get("trace_parent", ""),
            trace_attempt=raw.get("trace_attempt", ""),
            throttle=raw.get("throttle") or None,
            throttle_key=raw.get("throttle_key") or None,
            priority=int(raw.get("priority") or 0),
            slot=int(raw["slot"]) if raw.get("slot") else None,
        )
    except (KeyError, ValueError, TypeError) as exc:
        raise StorageCorruptError(f"Run record {run_id} is corrupt: {exc!r}") from None


def _optional_int(value: str | None) -> int | None:
    return int(value) if value else None


def _waiting(raw: str | None) -> dict[str, Any] | None:
    """snapshot.waiting_for as stored: {"kind", "name", "until" (ms, or absent)}."""
    if not raw:
        return None
    data = json.loads(raw)
    if not isinstance(data, dict) or data.get("kind") not in ("timer", "signal", "child", "throttle"):
        raise ValueError(f"waiting {raw[:80]!r}")
    until = data.get("until")
    return {"kind": data["kind"], "name": str(data.get("name") or ""), "until": optional_ms(until)}


def wait_outcome(raw: str) -> dict[str, Any]:
    """A wait op's journaled outcome (wait.lua): {"fired": true} for a timer,
    {"received": bool, "payload": ..., "index"?: k} for a signal."""
    try:
        data = json.loads(raw)
        if not isinstance(data, dict):
            raise TypeError("not an object")
        return data
    except (ValueError, TypeError) as exc:
        raise StorageCorruptError(f"Journal entry is not a wait outcome celery-durable wrote: {raw[:80]!r}") from exc
