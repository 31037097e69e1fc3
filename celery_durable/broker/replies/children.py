"""The replies of the child scripts (``child_types``): a parent's call that
starts or waits for a child, a child's end journaled in its parent; and the
sagas': a run marked compensable, a cancelled run's waiting branches woken."""

from __future__ import annotations

from typing import Any

from celery_durable.broker.child_types import ChildCall, ChildDone, ChildVerdict, DoneVerdict
from celery_durable.broker.journal import Conflict, Flags
from celery_durable.broker.replies.shape import flags, script, throttled_flag, verdict


@script("child")
def child(reply: Any, run_id: str) -> ChildCall | Conflict:
    """child.lua: {verdict, cancel, pause, limit, workflow, detail}, verdict
    'start', 'hit' (detail: the outcome), 'pending' or 'due'; or {'conflict', identity}."""
    said = verdict(reply, run_id, *ChildVerdict, "conflict")
    if said == "conflict":
        return Conflict(str(reply[1]))
    hit = said == ChildVerdict.HIT
    return ChildCall(ChildVerdict(said), flags(reply), str(reply[4]), str(reply[5]) if hit else None)


@script("child_done")
def child_done(reply: Any, run_id: str) -> ChildDone:
    """child_done.lua: {'ok', epoch, workflow, outcome, throttled, owner?},
    {'late', epoch, workflow, outcome}, {'detached'}, {'unknown'}, or a
    refusal {'missing'}, {'stale'}, {'settled'}."""
    said = DoneVerdict(verdict(reply, None, *DoneVerdict))
    if said is DoneVerdict.OK:
        owner = str(reply[5]) if len(reply) > 5 and reply[5] else None
        return ChildDone(said, int(reply[1]), str(reply[2]), str(reply[3]) or None, owner, throttled_flag(reply[4]))
    if said is DoneVerdict.LATE:
        return ChildDone(said, int(reply[1]), str(reply[2]), str(reply[3]) or None)
    return ChildDone(said)


@script("compensable")
def compensable(reply: Any, run_id: str) -> Flags:
    """compensable.lua: {'ok', cancel, pause, limit}."""
    verdict(reply, run_id, "ok")
    return flags(reply)


@script("step_over")
def step_over(reply: Any, run_id: str) -> Flags:
    """step_over.lua: {'ok', cancel, pause, limit} or {refusal}, raised."""
    verdict(reply, run_id, "ok")
    return flags(reply)


@script("wake_branches")
def wake_branches(reply: Any, run_id: str) -> tuple[Flags, list[int]]:
    """wake_branches.lua: {'ok', cancel, pause, limit, j, j, ...}."""
    verdict(reply, run_id, "ok")
    return flags(reply), [int(j) for j in reply[4:]]
