"""A history event before it is shown, and its ``seq``: a function of the
event alone (see ``history_derive``), so a page's ``after`` holds as the run goes on."""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field
from typing import Any

KIND_ORDER = (
    "taken_over",
    "resumed",
    "attempt_started",
    "cancel_requested",
    "pause_requested",
    "signal_received",
    "timer_fired",
    "child_settled",
    "call_completed",
    "call_failed",
    "agent_completed",
    "agent_failed",
    "step_completed",
    "step_failed",
    "step_interrupted",
    "patched",
    "branches_dispatched",
    "timer_set",
    "child_started",
    "call_sent",
    "compensation_started",
    "note",
    "nondeterminism",
    "paused",
    "run_settled",
)
"""Every kind the history holds, in the order events of one millisecond are listed."""
RANK = {kind: rank for rank, kind in enumerate(KIND_ORDER)}
SLOTS = 1000 // len(KIND_ORDER)

ERROR_CHARS = 500
"""An error message's preview in an event's data."""


@dataclass(slots=True)
class Event:
    """One event before it is shown: ``ref`` is where its value lives
    (hash, field), previewed only for the page that shows it."""

    at: int
    kind: str
    key: str | None
    attempt: int
    data: dict[str, Any] = field(default_factory=dict)
    ref: tuple[str, str] | None = None
    seq: int = 0

    def stamp(self) -> None:
        identity = f"{self.kind}|{self.key}|{self.attempt}|{self.data.get('op', '')}"
        tie = zlib.crc32(identity.encode("utf-8", "surrogatepass")) % SLOTS
        self.seq = max(self.at, 0) * 1000 + RANK[self.kind] * SLOTS + tie


def cap(text: str, limit: int = ERROR_CHARS) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"
