"""What the child scripts answer (``child.lua``, ``child_done.lua``), typed:
the ``Journal``'s child calls and the store's telling a parent its child ended."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from celery_durable.broker.journal import Flags


class ChildVerdict(StrEnum):
    """``child.lua``'s verdicts."""

    START = "start"  # ctx.start_child: the child is entered; the caller makes sure it exists
    HIT = "hit"  # the child's end is journaled
    PENDING = "pending"  # it waits for the child; the caller makes sure it exists
    DUE = "due"  # its time-out passed: cancel the child, journal the time-out


@dataclass(frozen=True, slots=True)
class ChildCall:
    """``child.lua``'s answer: ``workflow`` is the child's (the journaled
    one, whatever the call asked for), ``outcome`` comes with a hit."""

    verdict: ChildVerdict
    flags: Flags
    workflow: str
    outcome: str | None = None


class DoneVerdict(StrEnum):
    """``child_done.lua``'s verdicts, refusals included: a child's end told to
    a parent that moved on is nothing to raise about."""

    OK = "ok"  # journaled; ``owner`` is woken when a prefix was given
    LATE = "late"  # the key has a live outcome already: ``outcome`` is it
    DETACHED = "detached"  # a start_child's child: nothing waits for it
    UNKNOWN = "unknown"  # the parent has no such child
    MISSING = "missing"  # a refusal: the parent's run is gone
    STALE = "stale"  # a refusal: the parent runs as another epoch than the caller's
    SETTLED = "settled"  # a refusal: the parent is no longer running, pending or paused


@dataclass(frozen=True, slots=True)
class ChildDone:
    """``child_done.lua``'s answer."""

    verdict: DoneVerdict
    epoch: int = 0
    workflow: str = ""
    """The parent's workflow (with ``OK`` and ``LATE``), for the wake's message."""
    outcome: str | None = None
    owner: str | None = None
    """The owner to wake by message ``<prefix>-1``."""
    throttled: bool = True
    """With ``OK``: an op of the parent ever asked a throttle for a slot (else
    none is held for this child: no round trip to look for one)."""
