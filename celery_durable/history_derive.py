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
import zlib
from bisect import bisect_right
from dataclasses import dataclass, field
from typing import Any

from celery_durable.broker import schema
from celery_durable.broker.history_facts import HistoryFacts, SystemRecord
from celery_durable.errors import StorageCorruptError
from celery_durable.workflows.calls import call_task_id

KIND_ORDER = (
    "taken_over",
    "resumed",
    "attempt_started",
    "cancel_requested",
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
_RANK = {kind: rank for rank, kind in enumerate(KIND_ORDER)}
_SLOTS = 1000 // len(KIND_ORDER)

ERROR_CHARS = 500
"""An error message's preview in an event's data."""

_ATTEMPT_SUFFIX = re.compile(r" \(attempt (\d+)\)\Z")
_DIVERGED = re.compile(r"expected (.+?), got (.+?)(?:\. Check that|\Z)", re.S)


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
        tie = zlib.crc32(identity.encode("utf-8", "surrogatepass")) % _SLOTS
        self.seq = max(self.at, 0) * 1000 + _RANK[self.kind] * _SLOTS + tie


def cap(text: str, limit: int = ERROR_CHARS) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


ChildTimes = dict[str, tuple[int | None, int | None, str | None]]
"""Each child run's (created_at, finished_at, status), by its run id."""


def derive(facts: HistoryFacts, run_id: str, children: ChildTimes) -> list[Event]:
    """Every event of the run, in seq order. ``children``: each child run's
    (created_at, finished_at, status), by its run id."""
    events: list[Event] = []
    lifecycle = [event for record in facts.system for event in _system_events(record)]
    events.extend(lifecycle)
    events.extend(_fallbacks(facts, lifecycle))
    starts = sorted((e.at, e.attempt) for e in events if e.kind == "attempt_started")
    times = OpTimes(facts)
    events.extend(_row_events(facts, run_id, times))
    events.extend(_agent_events(facts))
    events.extend(_signal_events(facts, starts))
    events.extend(_op_events(facts, run_id, times, starts, children))
    for event in events:
        event.stamp()
    events.sort(key=lambda e: (e.seq, e.key or ""))
    return events


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
    if finished is not None and status not in ("pending", "running") and not any(
        e.kind in ("run_settled", "paused") and e.at >= finished for e in lifecycle
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


@dataclass(frozen=True, slots=True)
class Row:
    """A step row's fields the history reads (``schema.StepRow``'s format)."""

    status: str
    attempt: int
    started_at: int | None
    finished_at: int | None
    error: str | None
    op: str
    task: str | None
    queue: str | None


def parse_rows(rows: dict[str, str]) -> dict[str, Row]:
    """Every row at once: one JSON parse for all of them (a long run has tens of thousands)."""
    if not rows:
        return {}
    try:
        decoded = json.loads("[" + ",".join(rows.values()) + "]")
        return {
            key: Row(
                str(row["status"]),
                int(row.get("attempt", 1)),
                row.get("started_at"),
                row.get("finished_at"),
                row.get("error"),
                str(row.get("op") or ""),
                row.get("task"),
                row.get("queue"),
            )
            for key, row in zip(rows, decoded, strict=True)
        }
    except (ValueError, KeyError, TypeError, AttributeError):
        for key, raw in rows.items():
            schema.StepRow.parse(key, raw)  # names the corrupt row
        raise StorageCorruptError("A step row is not one celery-durable wrote") from None


class OpTimes:
    """When each op of the journal happened, as far as a fact says, by ``"<seq>:<i>"``."""

    def __init__(self, facts: HistoryFacts) -> None:
        self.ops: dict[str, str] = {}
        self.known: dict[str, int] = {}
        for name, raw in facts.journal.items():
            if name.startswith("o:"):
                self.ops[name[2:]] = raw.partition(":")[2]
            elif name.startswith(("wf:", "wt:")):
                op = name[3:]
                if raw and (name.startswith("wf:") or op not in self.known):
                    self.known[op] = int(raw)
        self.rows = parse_rows({**facts.steps, **facts.running})
        for row in self.rows.values():
            when = row.finished_at or row.started_at
            if row.op and when is not None:
                self.known.setdefault(row.op, when)
        started = _ms(facts.run.get("started_at")) or _ms(facts.run.get("created_at")) or 0
        self.origin = started

    def at(self, op: str) -> int:
        """The op's time, else the previous op's of its sequence, else its sequence's start."""
        found = self.known.get(op)
        if found is not None:
            return found
        seq, _, index = op.rpartition(":")
        for i in range(int(index) - 1, -1, -1):
            before = self.known.get(f"{seq}:{i}")
            if before is not None:
                self.known[op] = before
                return before
        parent = seq.rpartition(".")[0]
        when = self.at(parent.rpartition(".")[0] + ":" + parent.rpartition(".")[2]) if "." in seq else self.origin
        self.known[op] = when
        return when


def _row_events(facts: HistoryFacts, run_id: str, times: OpTimes) -> list[Event]:
    events: list[Event] = []
    for key, row in times.rows.items():
        is_call = times.ops.get(row.op, "").startswith("c|") or row.task is not None
        base: dict[str, Any] = {"op": row.op}
        if row.started_at is not None:
            base["started_at"] = row.started_at
        if row.finished_at is not None and row.started_at is not None:
            base["duration_ms"] = row.finished_at - row.started_at
        if is_call:
            sent = {"op": row.op, "task_id": call_task_id(run_id, key), "task": row.task, "queue": row.queue}
            events.append(Event(row.started_at or times.at(row.op), "call_sent", key, row.attempt, sent))
        if row.status == "running":
            continue
        at = row.finished_at or row.started_at or times.at(row.op)
        if row.status == "completed":
            kind = "call_completed" if is_call else "step_completed"
            events.append(Event(at, kind, key, row.attempt, base, ref=("journal", f"v:{key}")))
        elif row.status == "failed":
            kind = "call_failed" if is_call else "step_failed"
            events.append(Event(at, kind, key, row.attempt, base | {"error": cap(row.error or "")}))
        else:
            events.append(Event(at, "step_interrupted", key, row.attempt, base))
    return events


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
