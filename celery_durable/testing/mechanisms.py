"""Which of the engine's production mechanisms a test environment runs.

Each mechanism is there for a cost it saves (``benchmarks/NOTES.md``) and
none may change what a run does: only where and how fast its work runs. A
test environment runs them all by default, as a fleet does, so the fast
suite runs the paths production takes; a test that depends on the older,
simpler delivery (every branch its own message, every answer and wake a
message) asks for ``Mechanisms.MESSAGES``, and ``tests/unit/test_mechanisms.py``
sweeps the switches to show every combination does the same.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from celery_durable.config import Settings

_DEFAULTS = Settings()


@dataclass(frozen=True, slots=True)
class Mechanisms:
    """The switches, one per mechanism."""

    in_place: bool = True
    """A delivering thread knows what its worker consumes: a call's answer
    is journaled where its task ran, and a wake runs in the thread that
    decided it (``tasks/in_place.py``), the main body's pass taken by the
    answer's own script when the body is kept here (``Where.TAKE``). Off:
    every answer and wake travels as a message."""
    kept: bool = True
    """Main bodies parked at a call and fan-out thunks kept per worker
    process (``settings.parked_executions``; 0 when off)."""
    home: bool = True
    """Each worker process has a home queue, and a kept body's wake goes
    there (``settings.home_queues``); needs ``kept``."""
    inline: bool = True
    """A narrow fan-out runs in the pass that dispatched it, and a branch
    task runs several branches, handing on slow ones
    (``settings.branch_batch_ms``, the production default unless the
    environment's settings give another; 0 when off)."""
    processes: int = 1
    """Worker processes in the in-process fleet: with two, a call's answer
    often lands in the process that does not keep the body."""

    ALL: ClassVar[Mechanisms]
    MESSAGES: ClassVar[Mechanisms]

    def __post_init__(self) -> None:
        if not 1 <= self.processes <= 8:
            raise ValueError(f"processes must be 1 to 8, got {self.processes}")

    def settings(self, base: Settings, max_fanout: int) -> dict[str, Any]:
        """The settings these switches set, over ``base``."""
        update: dict[str, Any] = {"home_queues": self.home, "max_fanout": max_fanout}
        if self.inline:
            update["branch_batch_ms"] = base.branch_batch_ms or _DEFAULTS.branch_batch_ms
            update["fanout_tasks"] = min(base.fanout_tasks, max_fanout)
        else:
            # Every branch its own message, which the fleet delivers in order
            # or at once: the coordinator never runs a fan-out inside its pass.
            update["branch_batch_ms"] = 0
            update["fanout_tasks"] = min(max_fanout, 100_000)
        update["parked_executions"] = (base.parked_executions or _DEFAULTS.parked_executions) if self.kept else 0
        return update


Mechanisms.ALL = Mechanisms()
Mechanisms.MESSAGES = Mechanisms(in_place=False, home=False, inline=False)
"""The environment as it was before it ran the production paths: every
branch, answer and wake its own message, delivered in the order sent (kept
bodies on: a wake delivered to the one process resumes the body it keeps)."""
