"""A run's history stream (``P:{R}:history``): one entry per event, written by
``record_event`` in ``_prelude.lua`` in the same script as the fact it tells.

The entry id is ``"<n>-0"``, ``n`` the event's ``seq`` from the run hash's
``events`` counter: dense, in the order the writes reached Redis, never
renumbered. Its fields:

=====  ===================================================================
``k``  the kind the script recorded (``STORED_KINDS``)
``y``  the step, call, child, signal or timer it concerns ('' for none)
``a``  the run's attempt count when it was written
``t``  when, ms
``d``  a JSON object, or '': the row a step, call or agent event settled
       (``StepRow``/agent row format), a system record's ``message``, or
       the event's own fields (``op``, ``until``, ``run_id``...)
=====  ===================================================================
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

ROW_KINDS = frozenset(
    {"step_completed", "step_failed", "step_interrupted", "call_sent", "call_completed", "call_failed"}
)
"""Kinds whose ``d`` is the step row the script wrote (``StepRow``'s format)."""
AGENT_KINDS = frozenset({"agent_completed", "agent_failed"})
"""Kinds whose ``d`` is the agent row (``parse_agent_row``'s format)."""
KINDS = (
    "attempt_started",
    "taken_over",
    "resumed",
    "step_completed",
    "step_failed",
    "step_interrupted",
    "call_sent",
    "call_completed",
    "call_failed",
    "branches_dispatched",
    "agent_completed",
    "agent_failed",
    "timer_set",
    "timer_fired",
    "wait_started",
    "signal_received",
    "signal_timed_out",
    "child_started",
    "child_settled",
    "patched",
    "compensation_started",
    "pause_requested",
    "paused",
    "cancel_requested",
    "note",
    "nondeterminism",
    "run_settled",
)
"""Every kind the history holds, as a page shows it (``client/history_event.py``)."""
TOLD_BY_MESSAGE = frozenset(
    {"taken_over", "resumed", "compensation_started", "pause_requested", "paused", "cancel_requested"}
) | {"note", "run_settled"}
"""Kinds shown from a ``system`` progress record, told by its message."""
STORED_KINDS = frozenset(KINDS) - TOLD_BY_MESSAGE | {"system"}
"""Every kind a script records: the others, and ``system``."""


@dataclass(frozen=True, slots=True)
class StoredEvent:
    """One entry of the history stream, decoded."""

    seq: int
    kind: str
    key: str | None
    attempt: int
    at: int
    data: dict[str, Any]


def parse_event(entry_id: str, fields: Sequence[str]) -> StoredEvent:
    """An entry as XRANGE gives it: its id and its flat field list; ValueError
    for one no script writes (the reply's parser says it is corruption)."""
    try:
        raw = dict(zip(fields[::2], fields[1::2], strict=True))
        seq = int(entry_id.partition("-")[0])
        kind = raw["k"]
        if kind not in STORED_KINDS:
            raise ValueError(kind)
        data = json.loads(raw["d"]) if raw.get("d") else {}
        if not isinstance(data, dict):
            raise ValueError("data")
        return StoredEvent(seq, kind, raw.get("y") or None, int(raw.get("a") or 1), int(raw["t"]), data)
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"history entry {entry_id!r:.40}: {exc!r:.80}") from None
