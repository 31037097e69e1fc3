"""One line per history event, as the CLI's table and the web view show it."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from celery_durable.client.history import HistoryEvent

SUMMARY_CHARS = 160


def _value(data: dict[str, Any], name: str) -> str:
    if name in data:
        text = json.dumps(data[name], ensure_ascii=False)
    elif f"{name}_preview" in data:
        text = f"{data[f'{name}_preview']} ({data[f'{name}_chars']} chars)"
    else:
        return ""
    return text if len(text) <= SUMMARY_CHARS else text[: SUMMARY_CHARS - 1] + "…"


def _time(value: Any) -> str:
    """A due time (ISO 8601 in the event's data) as the tables' other times
    read: UTC to the second, no 'T', no offset."""
    try:
        moment = value if isinstance(value, datetime) else datetime.fromisoformat(str(value))
    except ValueError:
        return str(value)
    if moment.tzinfo is None:
        return str(value)
    return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S")


def event_summary(event: HistoryEvent) -> str:
    """What the event says beyond its kind and key: a result, an error, a cause, a payload."""
    data, kind = event.data, event.kind
    if data.get("error"):
        return str(data["error"])[:SUMMARY_CHARS]
    if kind == "taken_over":
        return f"cause: {data.get('cause')}"
    if kind == "resumed":
        return f"from {data.get('from')}, by {data.get('by')}"
    if kind == "nondeterminism":
        return f"expected {data.get('expected')}, got {data.get('got')}" if "expected" in data else data["message"]
    if kind == "run_settled":
        return str(data.get("status"))
    if kind == "call_sent":
        queue = data.get("queue") or "its own route"
        inputs = _value(data, "inputs")
        sent = f"task {data.get('task')} id {data.get('task_id')} on {queue}"
        return f"{sent} {inputs}" if inputs else sent
    if kind == "branches_dispatched":
        return f"{data.get('kind')} of {data.get('width')}"
    if kind == "wait_started":
        until = f" until {_time(data['until'])}" if data.get("until") else ""
        what = f"run {data.get('name')}" if data.get("kind") == "child" else str(data.get("name") or data.get("op"))
        return f"{data.get('kind')} {what}{until}"
    if kind in ("timer_set", "timer_fired", "signal_timed_out"):
        return f"until {_time(data.get('until'))}"
    if kind in ("child_started", "child_settled"):
        status = f" {data['status']}" if "status" in data else ""
        return f"run {data.get('run_id')} ({data.get('workflow')}){status} {_value(data, 'result')}".rstrip()
    if kind == "signal_received":
        return _value(data, "payload")
    if kind in ("compensation_started", "note"):
        return str(data.get("message", ""))
    return _value(data, "result")
