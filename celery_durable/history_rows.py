"""The events of a run's step rows, and the ``Timeline`` that keeps a run's
events in order: most of a long run's events are its rows', so they are
indexed in one lean pass over every row and made only for the page that
shows them (a run of 10,000 steps, SPEC §4's history, pages in well under
100 ms; benchmarks case 18).
"""

from __future__ import annotations

import json
import zlib
from typing import TYPE_CHECKING, Any, NoReturn

from celery_durable.broker import schema
from celery_durable.errors import StorageCorruptError
from celery_durable.history_event import RANK, SLOTS, Event, cap
from celery_durable.workflows.calls import call_task_id

if TYPE_CHECKING:
    from celery_durable.broker.history_facts import HistoryFacts


def _ms(raw: str | None) -> int | None:
    return int(raw) if raw else None


RowFact = tuple[str, dict[str, Any]]
"""A step row as the history reads it: its key, and the row decoded (``schema.StepRow``'s format)."""


def decode_rows(rows: dict[str, str]) -> list[RowFact]:
    """Every row at once: one JSON parse for all of them (a long run has
    tens of thousands, and its first page reads them all)."""
    if not rows:
        return []
    try:
        decoded = json.loads("[" + ",".join(rows.values()) + "]")
    except ValueError:
        _corrupt_row(rows)
    return list(zip(rows, decoded, strict=True))


def _corrupt_row(rows: dict[str, str]) -> NoReturn:
    for key, raw in rows.items():
        schema.StepRow.parse(key, raw)  # names the corrupt row
    raise StorageCorruptError("A step row is not one celery-durable wrote")


def _whole(value: Any) -> int:
    """A row's number (a time, an attempt) as the row's parse takes it (``schema.optional_ms``)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"not a number: {value!r:.40}")
    return int(value)


class OpTimes:
    """When each op of the journal happened, as far as a fact says, by ``"<seq>:<i>"``."""

    def __init__(self, facts: HistoryFacts, run_id: str) -> None:
        self.run_id = run_id
        self.ops: dict[str, str] = {}
        self.known: dict[str, int] = {}
        for name, raw in facts.journal.items():
            if name.startswith("o:"):
                self.ops[name[2:]] = raw.partition(":")[2]
            elif name.startswith(("wf:", "wt:")):
                op = name[3:]
                if raw and (name.startswith("wf:") or op not in self.known):
                    self.known[op] = int(raw)
        self.calls = {op for op, identity in self.ops.items() if identity.startswith("c|")}
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


class Timeline:
    """Every event of a run, in seq order, as flat lists of plain values. A
    step row's events (most of a long run's) are made only for the page that
    shows them, from the row as stored: a run of 10,000 steps keeps no
    20,000 event objects, nor objects the garbage collector must walk."""

    __slots__ = ("_ats", "_keys", "_kinds", "_made", "_rows", "_run_id", "seqs")

    def __init__(self, index: Index, rows: dict[str, str], run_id: str) -> None:
        order = sorted(zip(index.seqs, index.keys, range(len(index.seqs)), strict=True))
        self.seqs = [seq for seq, _, _ in order]
        """Each event's seq, ascending (``bisect`` them)."""
        self._keys = [key for _, key, _ in order]
        self._kinds = [index.kinds[i] for _, _, i in order]
        self._ats = [index.ats[i] for _, _, i in order]
        self._made = {position: index.made[i] for position, (_, _, i) in enumerate(order) if i in index.made}
        self._rows = rows
        self._run_id = run_id

    def __len__(self) -> int:
        return len(self.seqs)

    def kind(self, i: int) -> str:
        return self._kinds[i]

    def event(self, i: int) -> Event:
        """The ``i``-th event, a fresh object: a page adds its previews to it."""
        made = self._made.get(i)
        if made is not None:
            return Event(made.at, made.kind, made.key, made.attempt, dict(made.data), made.ref, made.seq)
        key = self._keys[i]
        try:
            row = json.loads(self._rows[key])
            return _row_event(self._kinds[i], self._ats[i], (key, row), self.seqs[i], self._run_id)
        except (ValueError, KeyError, TypeError, AttributeError):
            _corrupt_row({key: self._rows.get(key, "")})

    def events(self, start: int, end: int) -> list[Event]:
        return [self.event(i) for i in range(max(start, 0), min(end, len(self)))]


class Index:
    """The events of a run before they are ordered: parallel lists, one item
    per event; ``made`` holds the events already made (all but rows'), by position."""

    __slots__ = ("ats", "keys", "kinds", "made", "seqs")

    def __init__(self) -> None:
        self.seqs: list[int] = []
        self.keys: list[str] = []
        self.kinds: list[str] = []
        self.ats: list[int] = []
        self.made: dict[int, Event] = {}

    def add(self, event: Event) -> None:
        """An event made already (stamped here)."""
        event.stamp()
        self.made[len(self.seqs)] = event
        self.seqs.append(event.seq)
        self.keys.append(event.key or "")
        self.kinds.append(event.kind)
        self.ats.append(event.at)


def row_sources(rows: list[RowFact], times: OpTimes, index: Index) -> None:
    """The events of every step row, with their seqs (``Event.stamp``'s), not
    made yet; and each row's time into ``times``. One pass, kept lean: a long
    run's first page waits for it over every row."""
    known, calls, ranks, crc32, statuses = times.known, times.calls, RANK, zlib.crc32, schema.STEP_STATUSES
    seqs, keys, kinds, ats = index.seqs, index.keys, index.kinds, index.ats
    timeless: list[RowFact] = []
    for fact in rows:
        key, row = fact
        try:
            status, get = row["status"], row.get
            started, finished, attempt, op = get("started_at"), get("finished_at"), get("attempt", 1), get("op") or ""
            if status not in statuses or type(attempt) is not int:
                raise ValueError(status)
            when = finished or started
            if when is None:
                timeless.append(fact)
                continue
            if type(when) is not int or type(started) not in (int, type(None)):
                raise ValueError(when)
        except (ValueError, KeyError, TypeError, AttributeError):
            _corrupt_row({key: json.dumps(row)})
        if op and op not in known:
            known[op] = when
        is_call = get("task") is not None or op in calls
        if is_call and started is not None:
            identity = f"call_sent|{key}|{attempt}|{op}".encode("utf-8", "surrogatepass")
            seqs.append(max(started, 0) * 1000 + ranks["call_sent"] * SLOTS + crc32(identity) % SLOTS)
            keys.append(key)
            kinds.append("call_sent")
            ats.append(started)
        elif is_call:
            timeless.append(fact)  # its sending's time is another op's: known only after this pass
        if status == "running":
            continue
        kind = _settled_kind(status, is_call)
        identity = f"{kind}|{key}|{attempt}|{op}".encode("utf-8", "surrogatepass")
        seqs.append(max(when, 0) * 1000 + ranks[kind] * SLOTS + crc32(identity) % SLOTS)
        keys.append(key)
        kinds.append(kind)
        ats.append(when)
    for fact in timeless:
        _timeless_row(fact, times, index)


def _settled_kind(status: str, is_call: bool) -> str:
    if status == "completed":
        return "call_completed" if is_call else "step_completed"
    if status == "failed":
        return "call_failed" if is_call else "step_failed"
    return "step_interrupted"


def _timeless_row(fact: RowFact, times: OpTimes, index: Index) -> None:
    """A row's events whose times are another op's (a row without one, or a call never started)."""
    key, row = fact
    try:
        started, finished, op = row.get("started_at"), row.get("finished_at"), str(row.get("op") or "")
        when = finished or started
        is_call = row.get("task") is not None or op in times.calls
        made: list[Event] = []
        if is_call and started is None:
            made.append(_row_event("call_sent", times.at(op), fact, 0, times.run_id))
        if when is None and row["status"] != "running":
            made.append(_row_event(_settled_kind(row["status"], is_call), times.at(op), fact, 0, times.run_id))
    except (ValueError, KeyError, TypeError, AttributeError):
        _corrupt_row({key: json.dumps(row)})
    for event in made:
        index.add(event)


def _row_event(kind: str, at: int, fact: RowFact, seq: int, run_id: str) -> Event:
    """The event of a row, made for the page that shows it."""
    key, row = fact
    get = row.get
    attempt, started, finished, op = _whole(get("attempt", 1)), get("started_at"), get("finished_at"), get("op") or ""
    if kind == "call_sent":
        task, queue = get("task"), get("queue")
        sent = {
            "op": op,
            "task_id": call_task_id(run_id, key),
            "task": None if task is None else str(task),
            "queue": None if queue is None else str(queue),
        }
        return Event(at, kind, key, attempt, sent, ("journal", f"i:{key}"), seq)
    data: dict[str, Any] = {"op": op}
    if started is not None:
        data["started_at"] = _whole(started)
    if finished is not None and started is not None:
        data["duration_ms"] = _whole(finished) - _whole(started)
    if kind in ("step_completed", "call_completed"):
        return Event(at, kind, key, attempt, data, ("journal", f"v:{key}"), seq)
    if kind in ("step_failed", "call_failed"):
        data["error"] = cap(str(get("error") or ""))
    return Event(at, kind, key, attempt, data, None, seq)
