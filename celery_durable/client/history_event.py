"""A history event as a page shows it, made from what a script recorded
(``broker.schema.history``). Pure: no I/O, so every client (threaded or
asyncio) makes the same events from the same entries.

One stored entry is one event, with the entry's number as its ``seq``. Most
kinds are recorded as they are shown; a step, call or agent event carries
the row its script wrote, and a ``system`` progress record is told by its
message (the runtime's lifecycle: attempts, take-overs, cancel, pause,
settling).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from celery_durable.broker import schema
from celery_durable.broker.schema.history import AGENT_KINDS, ROW_KINDS, StoredEvent
from celery_durable.workflows.calls import call_task_id

ERROR_CHARS = 500
"""An error message's preview in an event's data."""

_ATTEMPT_SUFFIX = re.compile(r" \(attempt (\d+)\)\Z")
_DIVERGED = re.compile(r"expected (.+?), got (.+?)(?:\. Check that|\Z)", re.S)


@dataclass(slots=True)
class Event:
    """One event before it is shown: ``ref`` is where its value lives
    (hash, field), ``taker`` where a signal's taker is, both read only for
    the page that shows it."""

    seq: int
    at: int
    kind: str
    key: str | None
    attempt: int
    data: dict[str, Any] = field(default_factory=dict)
    ref: tuple[str, str] | None = None
    taker: tuple[str, str] | None = None


def cap(text: str, limit: int = ERROR_CHARS) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def event_of(stored: StoredEvent, run_id: str) -> Event:
    """The event an entry tells."""
    if stored.kind == "system":
        return _system(stored)
    if stored.kind in ROW_KINDS:
        return _row(stored, run_id)
    if stored.kind in AGENT_KINDS:
        return _agent(stored)
    event = Event(stored.seq, stored.at, stored.kind, stored.key, stored.attempt, dict(stored.data))
    if stored.kind == "signal_received" and stored.key is not None:
        index = stored.data.get("index")
        event.ref = ("signals", f"p:{stored.key}:{index}")
        event.taker = ("signals", f"k:{stored.key}:{index}")
    elif stored.kind == "child_settled":
        event.ref = ("journal", f"v:{stored.key}")
    elif stored.kind == "nondeterminism":
        event.data = nondeterminism_data(str(stored.data.get("message", "")))
    elif stored.kind == "wait_started" and event.data.get("until") is None:
        event.data["until"] = None
    return event


def _row(stored: StoredEvent, run_id: str) -> Event:
    row, key, kind = stored.data, stored.key or "", stored.kind
    attempt = _whole(row.get("attempt", 1))
    started, finished, op = row.get("started_at"), row.get("finished_at"), str(row.get("op") or "")
    if kind == "call_sent":
        task, queue = row.get("task"), row.get("queue")
        data: dict[str, Any] = {
            "op": op,
            "task_id": call_task_id(run_id, key),
            "task": None if task is None else str(task),
            "queue": None if queue is None else str(queue),
        }
        return Event(stored.seq, stored.at, kind, key, attempt, data, ("journal", f"i:{key}"))
    data = {"op": op}
    if started is not None:
        data["started_at"] = _whole(started)
        if finished is not None:
            data["duration_ms"] = _whole(finished) - _whole(started)
    if kind in ("step_failed", "call_failed"):
        data["error"] = cap(str(row.get("error") or ""))
    ref = ("journal", f"v:{key}") if kind in ("step_completed", "call_completed") else None
    return Event(stored.seq, stored.at, kind, key, attempt, data, ref)


def _agent(stored: StoredEvent) -> Event:
    row = schema.parse_agent_row(json.dumps(stored.data))
    agent_id = str(row["agent_id"] or stored.key or "")
    data: dict[str, Any] = {
        "agent_id": agent_id,
        "label": row["label"],
        "model": row["model"],
        "started_at": row["started_at"],
        "active_ms": row["active_ms"],
        "usage": row["usage"],
    }
    key = row["label"] or agent_id
    attempt = int(row["attempt"] or stored.attempt)
    if stored.kind == "agent_completed":
        return Event(stored.seq, stored.at, stored.kind, key, attempt, data, ("journal", f"a:{agent_id}"))
    data["error"] = cap(str(row["error"] or ""))
    return Event(stored.seq, stored.at, stored.kind, key, attempt, data)


def _whole(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"not a number: {value!r:.40}")
    return int(value)


# -- the progress stream's system records ---------------------------------------


def _system(stored: StoredEvent) -> Event:
    message, attempt = str(stored.data.get("message", "")), stored.attempt
    found = _ATTEMPT_SUFFIX.search(message)
    if found:
        message = message[: found.start()]
        attempt = int(found.group(1))
    kind, data = system_kind(message)
    return Event(stored.seq, stored.at, kind, None, attempt, data)


def system_kind(message: str) -> tuple[str, dict[str, Any]]:
    """The kind and data of a system record's message."""
    if message.startswith("Attempt ") and message.endswith(" started"):
        return "attempt_started", {}
    if message.startswith("Run recovered after its attempt died"):
        cause = message.removeprefix("Run recovered after its attempt died").strip().removeprefix("(").removesuffix(")")
        return "taken_over", {"cause": cause or "its attempt died", "by": "recovery"}
    if message.startswith("Run taken over by force"):
        return "taken_over", {"cause": "resumed by force while its attempt looked alive", "by": "client"}
    if message.startswith("Run resumed from "):
        rest = message.removeprefix("Run resumed from ")
        if " to cancel it" in rest:
            return "resumed", {"from": rest.partition(" ")[0], "by": "cancel"}
        return "resumed", {"from": rest, "by": "client"}
    simple = {"Cancel requested": "cancel_requested", "Pause requested": "pause_requested", "Run paused": "paused"}
    if message in simple:
        return simple[message], {}
    if message.startswith("Compensating after "):
        return "compensation_started", {"message": cap(message)}
    settled = _settlement(message)
    if settled is None:
        return "note", {"message": cap(message)}
    return "run_settled", settled


def _settlement(message: str) -> dict[str, Any] | None:
    if message == "Run completed":
        return {"status": "completed"}
    if message == "Run cancelled":
        return {"status": "cancelled"}
    if message.startswith("Run stopped: nondeterminism"):
        error = message.removeprefix("Run stopped: nondeterminism").removeprefix(":").strip()
        return {"status": "error", "reason": "nondeterminism", "error": cap(error)}
    if message.startswith("Run failed: "):
        return {"status": "error", "error": cap(message.removeprefix("Run failed: "))}
    if message.startswith("Run stopped: "):
        return {"status": "error", "error": cap(message.removeprefix("Run stopped: "))}
    if message.startswith("Run halted"):
        return {"status": "halted", "error": cap(message.removeprefix("Run halted").removeprefix(":").strip())}
    return None


def nondeterminism_data(error: str) -> dict[str, Any]:
    found = _DIVERGED.search(error)
    data: dict[str, Any] = {"message": cap(error)}
    if found:
        data |= {"expected": found.group(1), "got": found.group(2)}
    return data
