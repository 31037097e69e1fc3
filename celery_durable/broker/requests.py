"""Typed requests: a script's ARGV as named fields, in ARGV order, for the
scripts whose ARGV is long enough to get wrong by position (``request`` in
``ops.py``; ``StoreCore.call`` takes one in place of a list and checks it is
its row's). A field that is itself a request, or a sequence, spreads; a
bool is sent as 0/1.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Any

from celery_durable.broker.schema import Outcome, child_status, outcome_payload


@dataclass(frozen=True, slots=True)
class Request:
    def argv(self) -> list[Any]:
        return _spread([getattr(self, field.name) for field in fields(self)])


def _spread(values: Sequence[Any]) -> list[Any]:
    out: list[Any] = []
    for value in values:
        if isinstance(value, Request):
            out += value.argv()
        elif isinstance(value, Sequence) and not isinstance(value, str):
            out += _spread(value)
        else:
            out.append(int(value) if isinstance(value, bool) else value)
    return out


@dataclass(frozen=True, slots=True)
class Lock(Request):
    """What taking a pass's lock needs (``activate_run`` in ``_prelude.lua``)."""

    lock_ms: int
    lease_ms: int
    channel: str
    resend: str
    """The message that comes back if another pass holds the lock."""


@dataclass(frozen=True, slots=True)
class Activate(Request):
    epoch: int
    token: str
    now: int
    lock: Lock
    tail: Sequence[Any] = ()
    """A sequence and the index its tail is read from, or nothing."""


@dataclass(frozen=True, slots=True)
class CallDone(Request):
    epoch: int
    now: int
    key: str
    outcome: str
    error: str
    wake_prefix: str
    here: Sequence[Any] = ()
    """The pass taken where the answer came: its token, ``Lock``, sequence,
    start and soft flag, or nothing."""


@dataclass(frozen=True, slots=True)
class Finish(Request):
    epoch: int
    now: int
    channel: str
    status: str
    reason: str
    error: str
    can_resume: bool
    has_result: bool
    result: str
    message: str
    retention_ms: int


@dataclass(frozen=True, slots=True)
class Resume(Request):
    epoch: int
    """The epoch the caller read: the script refuses if it changed."""
    status: str
    now: int
    channel: str
    limits_json: str
    message: str
    lease_ms: int
    code_hash: str
    recovery: int
    """0 a resume, 1 a recovery (the old attempt must be dead), 2 a forced one."""
    run_fields: str
    message_id: str
    room: str


@dataclass(frozen=True, slots=True)
class Halt(Request):
    epoch: int
    """The epoch the caller read: the script refuses if it changed."""
    status: str
    now: int
    channel: str
    lease_ms: int
    room: str
    new_status: str
    reason: str
    error: str
    message: str
    recoveries: int
    forced: bool
    retention_ms: int


@dataclass(frozen=True, slots=True)
class OpAt(Request):
    """Where a journal op is entered (``enter_op`` in ``_prelude.lua``)."""

    epoch: int
    now: int
    seq: str
    index: int
    identity: str


@dataclass(frozen=True, slots=True)
class Call(Request):
    at: OpAt
    key: str
    owner: str
    due: int | str
    """When the call times out, '' for never."""
    cut: str
    running_row: str
    timeout_outcome: str
    timeout_error: str
    channel: str
    inputs: str


@dataclass(frozen=True, slots=True)
class Child(Request):
    at: OpAt
    key: str
    owner: str
    due: int | str
    cut: str
    child_run_id: str
    workflow: str
    mode: str
    """'wait' (ctx.child) or 'start' (ctx.start_child)."""
    channel: str


@dataclass(frozen=True, slots=True)
class AgentCall(Request):
    at: OpAt
    agent_id: str
    request_json: str
    owner: str
    row_json: str
    cut: str
    message: str


@dataclass(frozen=True, slots=True)
class Wait(Request):
    at: OpAt
    kind: str
    name: str
    due: int | str
    owner: str
    channel: str


@dataclass(frozen=True, slots=True)
class ChildDone(Request):
    now: int
    key: str
    child_run_id: str
    tag: str
    payload: str
    wake_prefix: str
    epoch: int | str
    """The parent's attempt that tells it, '' for the child's settling."""
    channel: str
    status: str

    @classmethod
    def of(cls, now: int, key: str, child_run_id: str, outcome: Outcome, wake_prefix: str, epoch: int | str,
           channel: str) -> ChildDone:
        """The child's end, as its journaled ``outcome`` says it."""
        tag, payload = outcome_payload(outcome)
        return cls(now, key, child_run_id, tag, payload, wake_prefix, epoch, channel, child_status(outcome))
