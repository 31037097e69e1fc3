"""How values read on a page: times, durations, usage, waits, links to Flower.

Pure functions, registered as Jinja filters and globals by ``templating``.
They return plain strings, never markup: autoescaping applies to all of
them, so a hostile value can only ever come out as text.
"""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote, urlencode

from celery_durable import RunEnvelope

STATUSES = ("pending", "running", "completed", "halted", "paused", "cancelled", "error")
"""Every run status, in the order an operator filters by; the client validates them again."""
SETTLED_FOR_GOOD = frozenset({"completed", "cancelled"})
"""Statuses no action can change: the run page offers no buttons for them."""
DASH = "—"
SETTLED_CHILD = frozenset({"completed", "cancelled", "error"})
"""A waited-for child in one of these has answered its parent (halted or paused, it may go on)."""


def when(value: datetime | None) -> str:
    """UTC to the second: a run's times are compared across machines and logs, never local time."""
    if value is None:
        return DASH
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S")


def iso(value: datetime | None) -> str:
    return value.isoformat() if value is not None else ""


def seconds_text(seconds: float | None) -> str:
    if seconds is None or math.isnan(seconds) or seconds < 0:
        return DASH
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes} min {secs} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes} min"


def span(start: datetime | None, end: datetime | None, now: datetime | None = None) -> str:
    """Time from ``start`` to ``end``, or until now while it goes on."""
    if start is None:
        return DASH
    finish = end or now or datetime.now(UTC)
    return seconds_text((finish - start).total_seconds())


def run_duration(run: RunEnvelope) -> str:
    """Wall time since the run started; frozen once it settled (a paused run included)."""
    end = run.finished_at if run.is_terminal else None
    if run.is_terminal and end is None:
        return DASH
    return span(run.started_at, end)


def step_duration(step: Any) -> str:
    """A step row's duration where the client reports one (``duration_ms`` or start/finish times)."""
    duration_ms = getattr(step, "duration_ms", None)
    if isinstance(duration_ms, int | float):
        return seconds_text(duration_ms / 1000)
    started = getattr(step, "started_at", None)
    if isinstance(started, datetime):
        finished = getattr(step, "finished_at", None)
        return span(started, finished if isinstance(finished, datetime) else None)
    return DASH


def credits(value: Any) -> str:
    if not isinstance(value, int | float) or isinstance(value, bool) or value == 0:
        return "0"
    return f"{value:.4f}".rstrip("0").rstrip(".") if value >= 0.0001 else f"{value:.2e}"


def usage(value: Any) -> str:
    """An agent's usage: tokens in and out, credits; other keys as they are."""
    if not isinstance(value, dict) or not value:
        return DASH
    parts: list[str] = []
    if "prompt_tokens" in value:
        parts.append(f"{value['prompt_tokens']} in")
    if "completion_tokens" in value:
        parts.append(f"{value['completion_tokens']} out")
    if "ai_credits" in value:
        parts.append(f"{credits(value['ai_credits'])} credits")
    known = {"prompt_tokens", "completion_tokens", "ai_credits"}
    parts += [f"{key} {item}" for key, item in value.items() if key not in known]
    return " · ".join(parts)


def waiting(value: Any) -> str:
    """``snapshot["waiting_for"]`` in words: what must happen for the run to go on."""
    if not isinstance(value, dict):
        return ""
    kind, name, until = value.get("kind"), value.get("name"), value.get("until")
    if kind == "timer":
        text = "a timer"
    elif kind == "signal":
        text = f"the signal {name!s}" if name else "a signal"
    elif kind == "child":
        text = f"the child run {name!s}"
    elif kind == "throttle":
        text = f"a slot of the throttle {name!s}"
    else:
        text = str(kind or "an event")
    return f"{text} (until {_until(until)} UTC)" if until else text


def _until(value: Any) -> str:
    """A wait's due time as every time on the pages reads (``when``), not raw ISO 8601."""
    if isinstance(value, datetime):
        return when(value)
    try:
        return when(datetime.fromisoformat(str(value)))
    except ValueError:
        return str(value)


def waited_children(children: Any) -> list[Any]:
    """The child runs a run still waits for (``ctx.child``, not settled): the
    snapshot names one of them, the page says how many."""
    return [
        child
        for child in children or ()
        if not getattr(child, "detached", False) and getattr(child, "status", None) not in SETTLED_CHILD
    ]


def awaits_approval(run: RunEnvelope) -> bool:
    wait = run.snapshot.get("waiting_for")
    return isinstance(wait, dict) and wait.get("kind") == "signal" and wait.get("name") == "approval"


def pretty_json(value: Any) -> str:
    """Indented JSON for a <pre>: a step result or the run's args, readable and escaped."""
    return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=False, default=str)


def flower_task_url(flower: str | None, task_id: Any) -> str | None:
    if not flower or not isinstance(task_id, str) or not task_id:
        return None
    return f"{flower}/task/{quote(task_id, safe='')}"


def flower_search_url(flower: str | None, run_id: str) -> str | None:
    """Flower's task list searched for the run id: its tasks' kwargs name it."""
    if not flower:
        return None
    return f"{flower}/tasks?{urlencode({'search': run_id})}"


def query(base: dict[str, str | None], **changes: str | None) -> str:
    """A query string from ``base`` with ``changes``; empty values are left out."""
    merged = {**base, **changes}
    pairs = {key: value for key, value in merged.items() if value}
    return "?" + urlencode(pairs) if pairs else ""
