"""The journal contract tests' moves (tests/contract): outcomes, a step's
commit, an agent's ask and a task call, as replay builds them."""

from __future__ import annotations

from typing import Any

from celery_durable.broker import schema
from celery_durable.broker.journal import AgentCall, Conflict, Journal, PendingCommit, TaskCall
from celery_durable.broker.schema import Identity, StepRow
from celery_durable.errors import StepFailed
from tests.contract.conftest import Backend, BackendFactory

RUNNING = schema.StepRow.running(1, 1_000).encode()
AGENT, OTHER = "a" * 32, "b" * 32
REQUEST = '{"label":"reviewer","model":null,"prompt":"Review","schema":null}'


def ok(value: Any) -> str:
    return schema.value_outcome(value).encode()


def failed(epoch: int, message: str = "boom", *, fatal: bool = False) -> str:
    return schema.failure_outcome(epoch, ValueError(message), fatal=fatal).encode()


def step(index: int, key: str, outcome: str) -> PendingCommit:
    """A step's commit as replay builds it: op, outcome, and the row it leaves."""
    row = schema.StepRow.running(1, 1_000).settled(schema.decode_outcome(outcome), 2_000).encode()
    return PendingCommit(index, Identity.step(key), schema.step_field(key), outcome, key, row)


def agent_row(agent_id: str, attempt: int = 1) -> str:
    return schema.queued_agent_row(agent_id, "reviewer", None, attempt, 1_000)


def ask(journal: Journal, seq: str, index: int, agent_id: str = AGENT, **options: Any) -> AgentCall | Conflict:
    return journal.agent_call(
        seq,
        index,
        agent_id,
        REQUEST,
        options.get("owner", "m"),
        agent_row(agent_id, journal.epoch),
        options.get("cut"),
        options.get("message", "message-id"),
    )


# -- task calls (ctx.call) ---------------------------------------------------------------

CALL_RUNNING = StepRow.running(1, 1000, "m:0").encode()
"""A task call's row while its task runs (the owner named)."""


def call_failed(epoch: int, error_type: str, message: str) -> str:
    return schema.failure_outcome(epoch, StepFailed("k", error_type, message, found_by_engine=True)).encode()


TIMED_OUT = call_failed(1, "TaskTimeout", "did not finish within 5 s")


def call(journal: Journal, key: str, *, due: int | None = None) -> TaskCall | Conflict:
    return journal.call("m", 0, key, "m", due, None, CALL_RUNNING, TIMED_OUT)


# -- waits -----------------------------------------------------------------------------


def started(make_backend: BackendFactory) -> Backend:
    """A run its first pass has activated: the sweep fires the timers of running runs only."""
    backend = make_backend()
    backend.settle("running")
    return backend
