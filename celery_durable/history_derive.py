"""A run's history derived from its facts (``broker.history_facts``): the
journal's ops, step, call, agent and child rows, signals, and the progress
stream's system records. Nothing here is stored; the history cannot
disagree with the journal because it is read from it.

Order and ``seq``. Every event has a time (``at``, ms): the one its fact
records (a step's end, a signal's arrival, a system record's), or, for an op
whose fact carries none (a fan-out's dispatch, a patch marker), the time of
the op before it in its sequence, which is final once the op exists. ``seq``
is ``at * 1000`` plus the kind's rank within a millisecond (``KIND_ORDER``)
and a checksum of the event's identity: a function of the event alone, so
an event keeps its seq as the run goes on and later events get higher ones
(page with ``after=<last seq>``). Two events may share a seq; a page never
splits them.
"""

from __future__ import annotations

import json
import re
from bisect import bisect_right
from typing import Any

from celery_durable.broker import schema
from celery_durable.broker.history_facts import HistoryFacts, SystemRecord
from celery_durable.errors import StorageCorruptError
from celery_durable.history_event import KIND_ORDER, Event, cap
from celery_durable.history_rows import Index, OpTimes, Timeline, decode_rows, row_sources

__all__ = ["KIND_ORDER", "ChildTimes", "Event", "Timeline", "attempt_at", "derive", "nondeterminism_data"]

_ATTEMPT_SUFFIX = re.compile(r" \(attempt (\d+)\)\Z")
_DIVERGED = re.compile(r"expected (.+?), got (.+?)(?:\. Check that|\Z)", re.S)


ChildTimes = dict[str, tuple[int | None, int | None, str | None]]
"""Each child run's (created_at, finished_at, status), by its run id."""


def derive(facts: HistoryFacts, run_id: str, children: ChildTimes) -> Timeline:
    """Every event of the run, in seq order. ``children``: each child run's
    (created_at, finished_at, status), by its run id."""
    events: list[Event] = []
    lifecycle = [event for record in facts.system for event in _system_events(record)]
    events.extend(lifecycle)
    events.extend(_fallbacks(facts, lifecycle))
    starts = sorted((e.at, e.attempt) for e in events if e.kind == "attempt_started")
    times = OpTimes(facts, run_id)
    index = Index()
    rows = {**facts.steps, **facts.running}
    row_sources(decode_rows(rows), times, index)
    events.extend(_agent_events(facts))
    events.extend(_signal_events(facts, starts))
    events.extend(_op_events(facts, run_id, times, starts, children))
    for event in events:
        index.add(event)
    return Timeline(index, rows, run_id)


def attempt_at(starts: list[tuple[int, int]], at: int) -> int:
    """The attempt that ran at ``at``: the last one started by then."""
    i = bisect_right(starts, (at, 1 << 62))
    return starts[i - 1][1] if i else 1


# -- the progress stream's system records ---------------------------------------


def _system_events(record: SystemRecord) -> list[Event]:
    message, at, attempt = record.message, record.at, record.attempt
    found = _ATTEMPT_SUFFIX.search(message)
    if found:
        message = message[: found.start()]
        attempt = int(found.group(1))
    if message.startswith("Attempt ") and message.endswith(" started"):
        return [Event(at, "attempt_started", None, attempt)]
    if message.startswith("Run recovered after its attempt died"):
        cause = message.removeprefix("Run recovered after its attempt died").strip().removeprefix("(").removesuffix(")")
        data = {"cause": cause or "its attempt died", "by": "recovery"}
        return [Event(at, "taken_over", None, attempt, data), Event(at, "attempt_started", None, attempt)]
    if message.startswith("Run taken over by force"):
        data = {"cause": "resumed by force while its attempt looked alive", "by": "client"}
        return [Event(at, "taken_over", None, attempt, data), Event(at, "attempt_started", None, attempt)]
    if message.startswith("Run resumed from "):
        data = {"from": message.removeprefix("Run resumed from "), "by": "client"}
        return [Event(at, "resumed", None, attempt, data), Event(at, "attempt_started", None, attempt)]
    if message == "Cancel requested":
        return [Event(at, "cancel_requested", None, attempt)]
    if message == "Pause requested":
        return [Event(at, "pause_requested", None, attempt)]
    if message == "Run paused":
        return [Event(at, "paused", None, attempt)]
    if message.startswith("Compensating after "):
        return [Event(at, "compensation_started", None, attempt, {"message": cap(message)})]
    if message.startswith("Signal ") and message.endswith(" received"):
        return []  # the signals hash says it, with the payload
    settled = _settlement(message)
    if settled is None:
        return [Event(at, "note", None, attempt, {"message": cap(message)})]
    events = [Event(at, "run_settled", None, attempt, settled)]
    if settled.get("reason") == "nondeterminism":
        events.insert(0, Event(at, "nondeterminism", None, attempt, nondeterminism_data(settled.get("error", ""))))
    return events


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


def _fallbacks(facts: HistoryFacts, lifecycle: list[Event]) -> list[Event]:
    """What the run hash still says once its progress records were trimmed
    (``progress_max``): the first start, and how the run settled."""
    run, out = facts.run, []
    kinds = {event.kind for event in lifecycle}
    started = _ms(run.get("started_at"))
    if "attempt_started" not in kinds and started is not None:
        out.append(Event(started, "attempt_started", None, 1))
    status, finished = run.get("status", ""), _ms(run.get("finished_at"))
    if (
        finished is not None
        and status not in ("pending", "running")
        and not any(e.kind in ("run_settled", "paused") and e.at >= finished for e in lifecycle)
    ):
        attempt = int(run.get("attempt") or 1)
        if run.get("reason") == "nondeterminism" and "nondeterminism" not in kinds:
            out.append(Event(finished, "nondeterminism", None, attempt, nondeterminism_data(run.get("error", ""))))
        data = {"status": status, "reason": run.get("reason") or None, "error": cap(run.get("error") or "") or None}
        out.append(Event(finished, "paused" if status == "paused" else "run_settled", None, attempt, data))
    return out


def _ms(raw: str | None) -> int | None:
    return int(raw) if raw else None


# -- ops: what the journal and the rows say ---------------------------------------


def _agent_events(facts: HistoryFacts) -> list[Event]:
    events = []
    for name, raw in facts.agents.items():
        row = schema.parse_agent_row(raw)
        if row["status"] not in ("completed", "failed"):
            continue
        agent_id = str(row["agent_id"] or name.rpartition("@")[0])
        data = {
            "agent_id": agent_id,
            "label": row["label"],
            "model": row["model"],
            "started_at": row["started_at"],
            "active_ms": row["active_ms"],
            "usage": row["usage"],
        }
        at = row["completed_at"] or row["started_at"] or 0
        attempt = int(row["attempt"] or 1)
        key = row["label"] or agent_id
        if row["status"] == "completed":
            events.append(Event(at, "agent_completed", key, attempt, data, ref=("journal", f"a:{agent_id}")))
        else:
            events.append(Event(at, "agent_failed", key, attempt, data | {"error": cap(str(row["error"] or ""))}))
    return events


def _signal_events(facts: HistoryFacts, starts: list[tuple[int, int]]) -> list[Event]:
    events = []
    for name, raw in facts.signals.items():
        if not name.startswith("t:"):
            continue
        signal, _, index = name[2:].rpartition(":")
        at = int(raw)
        data: dict[str, Any] = {"index": int(index)}
        taker = facts.signals.get(f"k:{signal}:{index}")
        if taker:
            data["taken_by"] = taker
        ref = ("signals", f"p:{signal}:{index}")
        events.append(Event(at, "signal_received", signal, attempt_at(starts, at), data, ref))
    return events


def _op_events(
    facts: HistoryFacts,
    run_id: str,
    times: OpTimes,
    starts: list[tuple[int, int]],
    children: ChildTimes,
) -> list[Event]:
    events: list[Event] = []
    entries = _children(facts)
    for op, identity in times.ops.items():
        tag, _, rest = identity.partition("|")
        if tag in ("p", "l"):
            at = times.at(op)
            data = {"op": op, "kind": "parallel" if tag == "p" else "pipeline", "width": int(rest or 0)}
            events.append(Event(at, "branches_dispatched", op, attempt_at(starts, at), data))
        elif tag == "v":
            at = times.at(op)
            events.append(Event(at, "patched", rest, attempt_at(starts, at), {"op": op}))
        elif tag == "z":
            events.extend(_timer_events(facts, times, starts, op))
        elif tag in ("k", "d"):
            entry = entries.get(rest) or {"run_id": schema.child_run_id(run_id, rest)}
            events.extend(_child_events(times, starts, op, rest, entry, children, waited=tag == "k"))
    return events


def _timer_events(facts: HistoryFacts, times: OpTimes, starts: list[tuple[int, int]], op: str) -> list[Event]:
    due = _ms(facts.journal.get(f"wd:{op}"))
    set_at = _ms(facts.journal.get(f"wt:{op}"))
    if set_at is None:
        set_at = times.at(op)
    data: dict[str, Any] = {"op": op, "until": due}
    events = [Event(set_at, "timer_set", op, attempt_at(starts, set_at), data)]
    if f"x:{op}" in facts.journal:
        fired = _ms(facts.journal.get(f"wf:{op}")) or due or set_at
        events.append(Event(fired, "timer_fired", op, attempt_at(starts, fired), dict(data)))
    return events


def _children(facts: HistoryFacts) -> dict[str, dict[str, Any]]:
    entries = {}
    for key, raw in facts.children.items():
        try:
            entry = json.loads(raw)
        except ValueError:
            raise StorageCorruptError(f"The children entry {key[:200]!r} is not one celery-durable wrote") from None
        if isinstance(entry, dict):
            entries[key] = entry
    return entries


def _child_events(
    times: OpTimes,
    starts: list[tuple[int, int]],
    op: str,
    key: str,
    entry: dict[str, Any],
    children: ChildTimes,
    *,
    waited: bool,
) -> list[Event]:
    run_id = str(entry["run_id"])
    workflow = entry.get("workflow")
    created, finished, status = children.get(run_id, (None, None, None))
    at = created if created is not None else times.at(op)
    data = {"op": op, "run_id": run_id, "workflow": workflow, "waited": waited}
    events = [Event(at, "child_started", key, attempt_at(starts, at), data)]
    if waited and status in schema.SETTLED_FOR_PARENT and finished is not None:
        settled = data | {"status": status}
        ref = ("journal", f"v:{key}")
        events.append(Event(finished, "child_settled", key, attempt_at(starts, finished), settled, ref))
    return events
