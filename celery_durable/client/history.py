"""A run's event history (SPEC §3 ``get_workflow_run_history``): its types,
its pages, and the values it previews.

The history is a record, not a reconstruction: each event was written by
the script that made it happen, numbered by the run's event counter in that
same script (``broker/schema/history.py``), so events are in the order they
happened and a page reads ``limit`` of them by number, whatever the run's
size. A page shows each value (a step's or call's result, an agent's answer,
a signal's payload) as a preview capped at ``PREVIEW_CHARS``; the whole
value is one :func:`read_value` away, by the ``value_ref`` the event carries.

What is made of the stored entries is pure (``page_of``, ``preview_refs``,
``with_values``): an asyncio client reuses it around its own reads.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from celery_durable.broker import schema
from celery_durable.broker.history_log import read_events, read_tail, read_values
from celery_durable.broker.schema.history import KINDS, StoredEvent
from celery_durable.client.history_event import Event, event_of
from celery_durable.errors import RunNotFoundError
from celery_durable.workflows.envelope import from_ms

if TYPE_CHECKING:
    from celery_durable.broker.store_core import StoreCore

__all__ = ["HISTORY_KINDS", "PREVIEW_CHARS", "HistoryEvent", "HistoryPage", "history_page", "read_value"]

HISTORY_KINDS = KINDS
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


def history_page(store: StoreCore, run_id: str, after: int, limit: int) -> HistoryPage:
    """The events with seq > ``after``, at most ``limit``: one read of ``limit + 1``
    events by number, one of the values they preview."""
    read = read_events(store, run_id, after, limit + 1)
    if read is None:
        raise RunNotFoundError(f"Run not found: {run_id}")
    _, stored = read
    events = events_of(stored[:limit], run_id)
    refs = preview_refs(events)
    return page_of(with_values(events, refs, read_values(store, run_id, refs)), more=len(stored) > limit)


def events_of(stored: list[StoredEvent], run_id: str) -> list[Event]:
    return [event_of(entry, run_id) for entry in stored]


def page_of(events: list[HistoryEvent], *, more: bool) -> HistoryPage:
    """A page of ``events``; ``more``: the history holds events after them."""
    return HistoryPage(events, events[-1].seq if events and more else None)


@dataclass(frozen=True, slots=True)
class HistoryTail:
    """The newest events of a run, for a view that shows where it stands."""

    events: list[HistoryEvent]
    total: int
    """Events in the whole history."""
    first_start: tuple[datetime, int] | None
    """When the first attempt that started did, and its number."""


FIRST_START_WITHIN = 16
"""The events a run's first start is looked for in (it is among its first: nothing runs before it)."""


def newest(store: StoreCore, run_id: str, count: int, *, previews: bool = True) -> HistoryTail:
    """The last ``count`` events (not a page of the API: a view's tail);
    without ``previews``, their values are not read."""
    read = read_tail(store, run_id, max(count, 1))
    if read is None:
        raise RunNotFoundError(f"Run not found: {run_id}")
    total, stored = read[0], read[1] if count > 0 else []
    events = events_of(stored, run_id)
    refs = preview_refs(events) if previews else []
    shown = with_values(events, refs, read_values(store, run_id, refs))
    head = read_events(store, run_id, 0, FIRST_START_WITHIN)
    firsts = events_of(head[1], run_id) if head is not None else []
    started = next((_shown(event) for event in firsts if event.kind == "attempt_started"), None)
    first = (started.at, started.attempt) if started is not None else None
    return HistoryTail(shown, total, first)


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


def preview_refs(events: list[Event]) -> list[tuple[str, str]]:
    """The fields a page of ``events`` reads: each one's value, and each signal's taker."""
    refs: list[tuple[str, str]] = []
    for event in events:
        refs.extend(ref for ref in (event.ref, event.taker) if ref is not None)
    return refs


def with_values(events: list[Event], refs: list[tuple[str, str]], raws: list[str | None]) -> list[HistoryEvent]:
    """The events as shown, with the values read at ``refs`` (``preview_refs``) previewed."""
    found = dict(zip(refs, raws, strict=True))
    for event in events:
        if event.taker is not None and found.get(event.taker):
            event.data["taken_by"] = found[event.taker]
        raw = found.get(event.ref) if event.ref is not None else None
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
    return [_shown(event) for event in events]


def _shown(event: Event) -> HistoryEvent:
    data = dict(event.data)
    for name in _TIME_FIELDS:
        if isinstance(data.get(name), int):
            data[name] = from_ms(data[name]).isoformat()  # type: ignore[union-attr]
    at = from_ms(event.at)
    assert at is not None
    return HistoryEvent(event.seq, at, event.attempt, event.kind, event.key, data)
