"""Operation throttles (SPEC §5e): ``throttle=``/``throttle_key=`` on
``ctx.step``, ``ctx.call``, ``ctx.agent`` and ``ctx.child``.

An op the journal does not answer takes a slot before it runs: its intent
is written in the run first (fenced), then the throttle is asked; a slot
queued leaves a wait of kind ``throttle`` and suspends the sequence holding
no worker, and the release that frees a slot wakes it through the one wake
path (``tasks/throttling.py``). A journaled op replays without a slot. A
step gives its slot back once its outcome is journaled (here); a call, an
agent turn and a child once their answer is (the task that journals it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from celery_durable.throttles import check_throttle_key, check_throttle_name

if TYPE_CHECKING:
    from celery_durable.workflows.cursor import Cursor
    from celery_durable.workflows.replay import Replay


class ThrottlePort(Protocol):
    """What an execution asks of the fleet's throttles (``tasks/throttling.EngineThrottles``)."""

    def enter(self, epoch: int, op: str, name: str, key: str) -> bool:
        """Write op's intent; True when this attempt was given the slot already."""

    def acquire(self, epoch: int, op: str, name: str, key: str) -> str:
        """Ask for the slot: 'granted', 'held', 'queued' or 'unknown' (no such throttle)."""

    def wait(self, epoch: int, op: str, owner: str, name: str) -> bool:
        """Wait for the slot holding no worker; True when it was given meanwhile."""

    def done(self, epoch: int, op: str, name: str) -> None:
        """Give op's slot back (its outcome is journaled) and forget its intent."""


@dataclass(frozen=True, slots=True)
class Slot:
    """A slot this execution holds for an op."""

    op: str
    name: str


Throttled = tuple[str, str] | None
"""An op's ``throttle=``/``throttle_key=``, checked: (name, key), or None when not throttled."""


def check_throttle(throttle: object, key: object) -> Throttled:
    """``throttle=``/``throttle_key=`` checked (``ValueError`` naming them), or None when not throttled."""
    if throttle is None:
        if key is not None:
            raise ValueError("throttle_key is given without throttle")
        return None
    return check_throttle_name(throttle), "" if key is None else check_throttle_key(key)


class ThrottleOps:
    """The slots of one execution's ops."""

    def __init__(self, replay: Replay, port: ThrottlePort | None) -> None:
        self._replay = replay
        self._port = port

    def gate(self, cursor: Cursor, op: str, throttle: Throttled, what: str) -> Slot | None:
        """Before op runs (the journal did not answer it): hold a slot, or
        suspend the sequence until one is given. None: not throttled (or
        the throttle does not exist: the op runs unthrottled, and a
        ``system`` record says so)."""
        port, replay = self._port, self._replay
        if throttle is None or port is None or not cursor.writes:
            return None
        name, key = throttle
        epoch = replay.epoch
        replay.flush(cursor)  # what came before is journaled before the op waits
        if port.enter(epoch, op, name, key):
            return Slot(op, name)
        verdict = port.acquire(epoch, op, name, key)
        if verdict == "unknown":
            replay.system(f"Throttle {name!r} does not exist: {what} runs unthrottled")
            # Written now: an agent turn or a child suspends the pass before any
            # write would take it along, and its replay never comes back here.
            replay.flush(cursor)
            port.done(epoch, op, name)
            return None
        if verdict == "queued" and not port.wait(epoch, op, cursor.owner, name):
            replay.check_pause(cursor)
            replay.wait_for_wake(cursor)
        return Slot(op, name)

    def release(self, slot: Slot | None) -> None:
        if slot is not None and self._port is not None:
            self._port.done(self._replay.epoch, slot.op, slot.name)
