"""The replies of the recovery sweep's scripts: its schedule, the workers
that stopped beating and the messages they held, and each run's liveness."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from celery_durable.broker.replies.shape import count, script
from celery_durable.broker.schema.live import HeldMessage
from celery_durable.broker.schema.run import STATUSES


@dataclass(frozen=True, slots=True)
class DueRuns:
    """``claim_due.lua``'s answer: the runs due now, handed to this sweeper
    alone for a while, and when the next run falls due (None: none is scheduled).
    ``claim`` is the score the claim left on them, as ``looked.lua`` is told it."""

    runs: list[str]
    next_due: int | None
    claim: str = ""


@script("claim_due")
def claim_due(reply: Any) -> DueRuns:
    """claim_due.lua: {next due score or '', the claim's score, run id, run id, ...}."""
    float(reply[1])  # a claim's score is a number, or the reply is not claim_due's
    return DueRuns(
        runs=[str(run_id) for run_id in reply[2:]],
        next_due=int(float(reply[0])) if reply[0] not in ("", None) else None,
        claim=str(reply[1]),
    )


@script("look")
def look(reply: Any) -> int:
    """look.lua: how many runs' looks moved."""
    return count(reply)


@script("looked")
def looked(reply: Any) -> int:
    """looked.lua: how many runs had a look asked for while the sweep looked at them."""
    return count(reply)


@dataclass(frozen=True, slots=True)
class DeadWorker:
    """What a worker that stopped beating held (``schema.live.HeldMessage``)."""

    runs: dict[str, list[str]] = field(default_factory=dict)
    """Run id -> the task ids of the run's own messages: marked lost."""
    answers: list[str] = field(default_factory=list)
    """The broker's delivery tags of the calls' answers it held: given back."""


@script("claim_dead_workers")
def claim_dead_workers(reply: Any) -> dict[str, DeadWorker]:
    """claim_dead_workers.lua: {worker, 'task|held task|held ...', worker, ...}."""
    dead: dict[str, DeadWorker] = {}
    for worker, text in zip(reply[::2], reply[1::2], strict=True):
        held = DeadWorker()
        for pair in str(text).split():
            task_id, bar, value = pair.partition("|")
            if not bar:
                raise ValueError(f"held message {pair!r}")
            message = HeldMessage.parse(value)
            if message.answer_tag is not None:
                held.answers.append(message.answer_tag)
            else:
                held.runs.setdefault(message.run_id, []).append(task_id)
        dead[str(worker)] = held
    return dead


@script("mark_lost")
def mark_lost(reply: Any, run_id: str) -> int:
    """mark_lost.lua: how many messages were marked lost."""
    return count(reply)


@script("received")
def received(reply: Any, run_id: str) -> int:
    """received.lua: how many messages were marked held."""
    return count(reply)


class Liveness(StrEnum):
    """``liveness`` in ``_prelude.lua``: the sweep's verdict on a run's attempt."""

    ALIVE = "alive"
    """Work is in flight; the detail says when to look again."""
    WAITING = "waiting"
    """Nothing in flight, and the run waits for the outside world (a timer, a
    signal, a called task); the detail says when to look again ('' for never by itself)."""
    DEAD = "dead"
    """The attempt died; the detail says why."""
    SETTLED = ""
    """The run is not pending or running (paused, or settled for good): nothing to judge."""


@dataclass(frozen=True, slots=True)
class Examined:
    """A run as the sweep sees it (``examine.lua``): status, epoch, and for a
    pending or running run its liveness verdict with its detail (when to
    look again, or why it is dead)."""

    status: str
    epoch: int
    workflow: str
    verdict: Liveness
    detail: str
    woken: list[str] = field(default_factory=list)
    """Owners whose timers fired here: the caller sends each its message."""

    @property
    def alive(self) -> bool:
        """The attempt lives: work in flight, or a wait for the outside world."""
        return self.verdict is Liveness.ALIVE or self.verdict is Liveness.WAITING

    @property
    def next_check(self) -> int | None:
        return int(float(self.detail)) if self.alive and self.detail else None


@script("examine")
def examine(reply: Any, run_id: str) -> Examined | None:
    """examine.lua: {status, epoch, workflow, verdict, detail, owner, owner,
    ...} (verdict '' for a run that is not pending or running), or {} when
    the run does not exist (None)."""
    if not reply:
        return None
    status, epoch, workflow, verdict, detail, *woken = reply
    if status not in STATUSES:
        raise ValueError(f"unknown status {status!r}")
    return Examined(str(status), int(epoch), str(workflow), Liveness(verdict), str(detail), [str(o) for o in woken])
