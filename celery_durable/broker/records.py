"""The run record: the run hash parsed into one object (``schema.parse_run``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

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
    """Take-overs in a row with nothing journaled between them."""
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
