"""A run's event history (SPEC §4 ``get_workflow_run_history``): its types,
its pages, and the values it previews.

The events are derived, page by page, from what the run keeps anyway
(``history_derive``): no second log, and kept exactly as long as the run.
A page shows each value (a step's or call's result, an agent's answer, a
signal's payload) as a preview capped at ``PREVIEW_CHARS``; the whole value
is one :func:`read_value` away, by the ``value_ref`` the event carries.
"""

from __future__ import annotations

import json
import threading
from bisect import bisect_right
from collections import OrderedDict
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from celery_durable.broker import schema
from celery_durable.broker.history_facts import (
    read_child_times,
    read_fingerprint,
    read_history_facts,
    read_values,
)
from celery_durable.errors import RunNotFoundError
from celery_durable.history_derive import derive
from celery_durable.history_event import KIND_ORDER, Event
from celery_durable.history_rows import Timeline
from celery_durable.workflows.envelope import from_ms

if TYPE_CHECKING:
    from celery_durable.broker.store_core import StoreCore

__all__ = ["HISTORY_KINDS", "PREVIEW_CHARS", "HistoryEvent", "HistoryPage", "history_page", "read_value"]

HISTORY_KINDS = KIND_ORDER
DEFAULT_LIMIT = 200
LIMIT_MAX = 500
PREVIEW_CHARS = 500
"""A value longer than this (as JSON text) is shown cut, with its full length."""
_TIME_FIELDS = ("started_at", "until")


@dataclass(frozen=True, slots=True)
class HistoryEvent:
    """One event of a run's history. ``data`` is a JSON object: its times are
    ISO 8601 text; a value is ``result``/``payload``/``inputs`` (a call's
    ``{"args", "kwargs"}``) whole when short, else ``…_preview`` text,
    ``…_chars`` and ``value_ref`` to read it whole."""

    seq: int
    at: datetime
    attempt: int
    kind: str
    key: str | None
    data: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        return {
            "seq": self.seq,
            "at": self.at.isoformat(),
            "attempt": self.attempt,
            "kind": self.kind,
            "key": self.key,
            "data": self.data,
        }


@dataclass(frozen=True, slots=True)
class HistoryPage:
    """Events in ascending ``seq``; ``next`` is the ``after`` of the next page (None: this is the last)."""

    events: list[HistoryEvent]
    next: int | None

    def to_dict(self) -> dict[str, Any]:
        return {"events": [event.to_dict() for event in self.events], "next": self.next}


def check_page(after: Any, limit: Any) -> tuple[int, int]:
    """``after`` and ``limit`` as a page takes them; a bad one is a ValueError naming it."""
    if after is None:
        after = -1
    elif isinstance(after, bool) or not isinstance(after, int) or after < 0:
        raise ValueError(f"after must be None or an event's seq (an integer >= 0), got {after!r:.80}")
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= LIMIT_MAX:
        raise ValueError(f"limit must be an integer from 1 to {LIMIT_MAX}, got {limit!r:.80}")
    return after, limit


class _Derived:
    """The derived events of the runs paged last, by run, with the
    fingerprint of the facts they came from (``read_fingerprint``): the next
    page of a long run is cut from them while its facts stand still, not
    derived again. A cache of a derived value, never the truth: a changed
    fingerprint derives the run again."""

    RUNS = 8

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._runs: OrderedDict[tuple[str, str], tuple[tuple[object, ...], Timeline]] = OrderedDict()

    def events(self, store: StoreCore, run_id: str) -> Timeline:
        fingerprint = read_fingerprint(store, run_id)
        if fingerprint is None:
            raise RunNotFoundError(f"Run not found: {run_id}")
        place = (store.keys.prefix, run_id)
        with self._lock:
            kept = self._runs.get(place)
            if kept is not None and kept[0] == fingerprint:
                self._runs.move_to_end(place)
                return kept[1]
        events = _derive(store, run_id)
        with self._lock:
            self._runs[place] = (fingerprint, events)
            self._runs.move_to_end(place)
            while len(self._runs) > self.RUNS:
                self._runs.popitem(last=False)
        return events


_DERIVED = _Derived()


def _derive(store: StoreCore, run_id: str) -> Timeline:
    facts = read_history_facts(store, run_id)
    if facts is None:
        raise RunNotFoundError(f"Run not found: {run_id}")
    child_ids = [child for child in map(_child_id, facts.children.values()) if child is not None]
    times = read_child_times(store, child_ids)
    children = {child: (_int(c), _int(f), s) for child, (c, f, s) in zip(child_ids, times, strict=True)}
    return derive(facts, run_id, children)


def history_page(store: StoreCore, run_id: str, after: int, limit: int) -> HistoryPage:
    """The events with seq > ``after``, at most ``limit`` (more only to keep events of one seq together)."""
    events = _DERIVED.events(store, run_id)
    start = bisect_right(events.seqs, after)
    end = min(start + limit, len(events))
    while 0 < end < len(events) and events.seqs[end] == events.seqs[end - 1]:
        end += 1
    chosen = events.events(start, end)
    _preview(store, run_id, chosen)
    nxt = chosen[-1].seq if chosen and end < len(events) else None
    return HistoryPage([_shown(event) for event in chosen], nxt)


@dataclass(frozen=True, slots=True)
class HistoryTail:
    """The newest events of a run, for a view that shows where it stands."""

    events: list[HistoryEvent]
    total: int
    """Events in the whole history."""
    first_start: tuple[datetime, int] | None
    """When the first attempt that started did, and its number."""


def newest(store: StoreCore, run_id: str, count: int, *, previews: bool = True) -> HistoryTail:
    """The last ``count`` events (not a page of the API: a view's tail);
    without ``previews``, their values are not read."""
    events = _DERIVED.events(store, run_id)
    chosen = events.events(len(events) - count, len(events)) if count > 0 else []
    if previews:
        _preview(store, run_id, chosen)
    index = next((i for i in range(len(events)) if events.kind(i) == "attempt_started"), None)
    started = _shown(events.event(index)) if index is not None else None
    first = (started.at, started.attempt) if started is not None else None
    return HistoryTail([_shown(event) for event in chosen], len(events), first)


def read_value(store: StoreCore, run_id: str, ref: str) -> Any:
    """The whole value an event previews, by its ``value_ref``: a result, an
    answer, a payload, a call's inputs (``{"args", "kwargs"}``); for a
    failure, ``{"error_type", "message"}``.
    ``LookupError`` when there is none (or no longer), ``ValueError`` for a ref
    that names no value."""
    hash_name, field = _parse_ref(ref)
    (raw,) = read_values(store, run_id, [(hash_name, field)])
    if raw is None:
        raise LookupError(f"Run {run_id} has no value {ref}")
    return _decode(hash_name, field, raw)


CALL_INPUTS_SHOWN = 500
"""The calls whose inputs a view previews at most (the first ones): the rest get a link."""


def call_inputs(store: StoreCore, run_id: str, keys: list[str]) -> dict[str, str]:
    """A preview of the inputs of each call of ``keys`` that kept them
    (``{"args", "kwargs"}`` JSON, cut at ``PREVIEW_CHARS``), by key: one
    pipelined read. The whole value: ``read_value(..., "i:<key>")``."""
    keys = keys[:CALL_INPUTS_SHOWN]
    raws = read_values(store, run_id, [("journal", f"i:{key}") for key in keys])
    return {
        key: raw if len(raw) <= PREVIEW_CHARS else raw[: PREVIEW_CHARS - 1] + "…"
        for key, raw in zip(keys, raws, strict=True)
        if raw is not None
    }


def _parse_ref(ref: Any) -> tuple[str, str]:
    if isinstance(ref, str):
        if ref.startswith(("v:", "a:", "i:")) and len(ref) > 2:
            return "journal", ref
        if ref.startswith("p:") and ref.count(":") >= 2:
            return "signals", ref
    raise ValueError(f"Not a value reference of the history: {ref!r:.120}")


def _decode(hash_name: str, field: str, raw: str) -> Any:
    if hash_name == "signals" or field.startswith("i:"):
        return json.loads(raw)
    outcome = schema.decode_outcome(raw)
    if outcome.kind == "o":
        return outcome.value
    return {"error_type": outcome.error_type, "message": outcome.message}


def _preview(store: StoreCore, run_id: str, events: list[Event]) -> None:
    wanted = [event for event in events if event.ref is not None]
    raws = read_values(store, run_id, [event.ref for event in wanted if event.ref is not None])
    for event, raw in zip(wanted, raws, strict=True):
        if raw is None or event.ref is None:
            continue
        hash_name, field = event.ref
        plain = hash_name == "signals" or field.startswith("i:")  # JSON as sent, not an outcome
        name = "payload" if hash_name == "signals" else "inputs" if plain else "result"
        text = raw if plain else raw[1:]
        if not plain and not raw.startswith("o"):
            failure = schema.decode_outcome(raw)
            event.data["error"] = f"{failure.error_type}: {failure.message}"[:PREVIEW_CHARS]
            continue
        if len(text) <= PREVIEW_CHARS:
            event.data[name] = json.loads(text)
        else:
            event.data[f"{name}_preview"] = text[: PREVIEW_CHARS - 1] + "…"
            event.data[f"{name}_chars"] = len(text)
        event.data["value_ref"] = field


def _shown(event: Event) -> HistoryEvent:
    data = dict(event.data)
    for name in _TIME_FIELDS:
        if isinstance(data.get(name), int):
            data[name] = from_ms(data[name]).isoformat()  # type: ignore[union-attr]
    at = from_ms(event.at)
    assert at is not None
    return HistoryEvent(event.seq, at, event.attempt, event.kind, event.key, data)


def _child_id(raw: str) -> str | None:
    try:
        entry = json.loads(raw)
    except ValueError:
        return None
    return str(entry["run_id"]) if isinstance(entry, dict) and entry.get("run_id") else None


def _int(raw: str | None) -> int | None:
    return int(raw) if raw else None
