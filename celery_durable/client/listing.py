"""Listing a namespace's runs, newest first, in pages (``Client.list_workflow_runs``).

Without a filter a page reads the namespace's runs zset (``{ns:N}:runs``,
scored by start). With one, it reads the namespace's index (keys.py,
``broker/indexes.py``): the range of the most selective filter given (the
status and workflow pair, a wait's name, waiting at all, a status, a
workflow, every run in a time range), counted in O(log n) each so the
smallest is read, and checks every run it reads against its record for the
other filters, and for the one it read: an entry behind its record (a write
under way on a Redis Cluster, ``broker/run_index.py``) is repaired, never
shown. A run-id prefix reads the id index instead, in id order.

A cursor is the place of the last run given in the order read ("s<score>"
in the runs zset, "o<ord>" in the index, "i<run id>" by id). A run's place
never changes, so a run that changes status meanwhile is neither skipped
nor given twice in a filter it stayed in.

A namespace of a store written before the indexes existed (``index_built``
false) is scanned as before, every record checked, until ``celery-durable
runs reindex`` builds them (docs/architecture.md).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime

from celery_durable.broker import STATUSES, RunRecord, RunStore, indexes
from celery_durable.broker.indexes import OrdRange
from celery_durable.client import progress as paging
from celery_durable.names import SIGNAL_NAME_MAX, WORKFLOW_NAME_PATTERN, name_pattern
from celery_durable.workflows.envelope import RunEnvelope, RunPage
from celery_durable.workflows.jsonvalue import short_repr

RUN_ID_PREFIX = re.compile(r"\A[0-9a-f]{1,32}\Z")
WAIT_NAME = name_pattern(max(SIGNAL_NAME_MAX, 32))
"""What a run waits for by name: a signal's name, or a child's run id."""


ANY_WAIT = "*"
"""How text (the CLI's --waiting alone, the web's ``waiting=*``) says "waiting for anything"."""


def waiting_param(text: str | None) -> bool | str | None:
    """The ``waiting`` filter a text parameter names: '' or None none, "*" any wait, else a name."""
    if not text:
        return None
    return True if text == ANY_WAIT else text


def time_param(name: str, text: str | None) -> datetime | None:
    """A time filter given as ISO 8601 text ('' or None: none); a ValueError names a bad one."""
    if not text:
        return None
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(f"{name} takes an ISO 8601 time such as 2024-05-01T09:00:00Z, got {text!r:.80}") from None
    if when.tzinfo is None:
        raise ValueError(f"{name} needs a time zone (2024-05-01T09:00:00Z, or +02:00), got {text!r:.80}")
    return when


@dataclass(frozen=True, slots=True)
class RunFilter:
    """What a listing keeps (None: any). Times are ms; after inclusive, before exclusive."""

    status: str | None = None
    workflow: str | None = None
    waiting: bool | str | None = None
    run_id_prefix: str | None = None
    created_after: int | None = None
    created_before: int | None = None
    schedule_id: str | None = None

    @property
    def empty(self) -> bool:
        return self == RunFilter()

    def matches(self, record: RunRecord) -> bool:
        waiting = record.waiting_for
        return (
            (self.status is None or record.status == self.status)
            and (self.workflow is None or record.workflow == self.workflow)
            and (
                self.waiting is None
                or (waiting is not None and (self.waiting is True or waiting.get("name") == self.waiting))
            )
            and (self.run_id_prefix is None or record.run_id.startswith(self.run_id_prefix))
            and (self.created_after is None or record.created_at >= self.created_after)
            and (self.created_before is None or record.created_at < self.created_before)
            and (self.schedule_id is None or record.schedule_id == self.schedule_id)
        )


def check_filter(
    status: object,
    workflow: object,
    waiting: object,
    run_id_prefix: object,
    created_after: object,
    created_before: object,
) -> RunFilter:
    """The filter, or a ValueError naming the first bad value."""
    if status is not None and status not in STATUSES:
        raise ValueError(f"status must be one of {', '.join(STATUSES)}, got {short_repr(status)}")
    if workflow is not None and not (isinstance(workflow, str) and WORKFLOW_NAME_PATTERN.match(workflow)):
        raise ValueError(f"workflow must be a workflow name, got {short_repr(workflow)}")
    if waiting is not None and waiting is not True and not (isinstance(waiting, str) and WAIT_NAME.match(waiting)):
        raise ValueError(
            f"waiting must be None, True (any wait) or the name of what runs wait for, got {short_repr(waiting)}"
        )
    if run_id_prefix is not None and not (isinstance(run_id_prefix, str) and RUN_ID_PREFIX.match(run_id_prefix)):
        raise ValueError(f"run_id_prefix must be 1-32 lowercase hex digits, got {short_repr(run_id_prefix)}")
    after = _ms(created_after, "created_after")
    before = _ms(created_before, "created_before")
    if after is not None and before is not None and after >= before:
        raise ValueError("created_after must be earlier than created_before")
    return RunFilter(status, workflow, waiting, run_id_prefix, after, before)


def _ms(value: object, name: str) -> int | None:
    if value is None:
        return None
    if not isinstance(value, datetime):
        raise ValueError(f"{name} must be a timezone-aware datetime, got {type(value).__name__}")
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError(f"{name} must be a timezone-aware datetime, got a naive one: {value.isoformat()}")
    return math.ceil(value.timestamp() * 1000)


def list_runs(
    store: RunStore,
    namespace: str,
    status: str | None,
    workflow: str | None,
    limit: int,
    cursor: str | None,
    **more: object,
) -> RunPage:
    """One page of ``namespace``'s runs that pass the filters (None: any);
    ``more``: ``waiting``, ``run_id_prefix``, ``created_after``, ``created_before``,
    ``schedule_id`` (the runs a schedule started, newest tick first)."""
    unknown = set(more) - {"waiting", "run_id_prefix", "created_after", "created_before", "schedule_id"}
    if unknown:
        raise TypeError(f"list_workflow_runs got unexpected keyword arguments: {', '.join(sorted(unknown))}")
    keep = check_filter(
        status,
        workflow,
        more.get("waiting"),
        more.get("run_id_prefix"),
        more.get("created_after"),
        more.get("created_before"),
    )
    paging.check_page_limit(limit)
    if cursor is not None and not isinstance(cursor, str):
        raise ValueError(f"cursor is not one list_workflow_runs returned: {short_repr(cursor)}")
    schedule_id = more.get("schedule_id")
    if schedule_id is not None:
        if not (isinstance(schedule_id, str) and WORKFLOW_NAME_PATTERN.match(schedule_id)):
            raise ValueError(f"schedule_id must be a schedule id, got {short_repr(schedule_id)}")
        keep = replace(keep, schedule_id=schedule_id)
        return _by_schedule(store, namespace, keep, limit, _cursor(cursor, "k", str.isdigit))
    if keep.empty:
        return _by_start(store, namespace, keep, limit, _cursor(cursor, "s", str.isdigit))
    if not store.index_built(namespace):
        return _by_start(store, namespace, keep, limit, _cursor(cursor, "s", str.isdigit))
    store.repair_indexes(namespace)
    if keep.run_id_prefix is not None:
        return _by_id(store, namespace, keep, limit, _cursor(cursor, "i", RUN_ID_PREFIX.match))
    return _by_index(store, namespace, keep, limit, _cursor(cursor, "o", indexes.is_ord))


def _cursor(cursor: str | None, kind: str, valid: Callable[[str], object]) -> str | None:
    if cursor is None:
        return None
    if not cursor.startswith(kind) or not valid(cursor[1:]):
        raise ValueError(f"cursor is not one list_workflow_runs returned for these filters: {short_repr(cursor)}")
    return cursor[1:]


class _Page:
    """The runs of one page as they are met, and where the next one starts."""

    def __init__(self, limit: int, keep: RunFilter) -> None:
        self.limit = limit
        self.keep = keep
        self.runs: list[RunEnvelope] = []
        self.corrupt: list[dict[str, str]] = []
        self.last = ""
        self.full = False

    def take(self, store: RunStore, namespace: str, batch: list[tuple[str, str]]) -> list[RunRecord]:
        """Add the matching runs of ``batch`` ((place, run id) in order);
        returns the records met that the filter does not keep."""
        loaded, damaged = store.load_runs([run_id for _, run_id in batch])
        records = {record.run_id: record for record in loaded}
        # Indexed runs whose keys expired (run retention) leave the indexes as they are met.
        store.forget_runs(namespace, [r for _, r in batch if r not in records and r not in damaged])
        behind: list[RunRecord] = []
        for place, run_id in batch:
            if run_id in damaged:
                if self.keep.empty:
                    error = damaged[run_id]
                    self.corrupt.append({"run_id": run_id, "code": error.code or "", "error": error.message})
                continue
            record = records.get(run_id)
            if record is None or record.namespace != namespace:
                continue
            if not self.keep.matches(record):
                behind.append(record)
                continue
            if len(self.runs) == self.limit:
                # A cursor only when another matching run exists, so a
                # filtered listing never ends on an empty page.
                self.full = True
                return behind
            self.runs.append(RunEnvelope.from_record(record))
            self.last = place
        return behind

    def page(self, kind: str) -> RunPage:
        return RunPage(self.runs, f"{kind}{self.last}" if self.full else None, self.corrupt)


def _by_start(store: RunStore, namespace: str, keep: RunFilter, limit: int, cursor: str | None) -> RunPage:
    """The runs zset, every record checked: no filter, or an unindexed namespace."""
    page = _Page(limit, keep)
    before = float(cursor) if cursor is not None else None
    while not page.full:
        batch = store.list_run_ids(namespace, before, max(limit * 2, 64))
        if not batch:
            break
        page.take(store, namespace, [(f"{score:.0f}", run_id) for run_id, score in batch])
        before = batch[-1][1]
    return page.page("s")


def _by_schedule(store: RunStore, namespace: str, keep: RunFilter, limit: int, cursor: str | None) -> RunPage:
    """The runs a schedule started (its runs zset, by tick), every record checked for the other filters."""
    assert keep.schedule_id is not None
    page = _Page(limit, keep)
    before = int(cursor) if cursor is not None else None
    while not page.full:
        batch = store.schedule_runs(namespace, keep.schedule_id, before, max(limit * 2, 64))
        if not batch:
            break
        page.take(store, namespace, [(str(tick), run_id) for run_id, tick in batch])
        before = batch[-1][1]
    return page.page("k")


def _by_index(store: RunStore, namespace: str, keep: RunFilter, limit: int, cursor: str | None) -> RunPage:
    prefix = _smallest(store, namespace, keep, OrdRange(*_times(keep)))
    low, high = _times(keep)
    if cursor is not None and (high is None or cursor < high):
        high = cursor
    page = _Page(limit, keep)
    while not page.full:
        batch = store.index_page(namespace, prefix, OrdRange(low, high), max(limit * 2, 64))
        if not batch:
            break
        behind = page.take(store, namespace, batch)
        stale = [record.run_id for record in behind if not _belongs(record, prefix)]
        if stale:
            store.repair_indexes(namespace, stale)
        high = batch[-1][0]
    return page.page("o")


def _belongs(record: RunRecord, prefix: str) -> bool:
    """Whether the run belongs in the index range it was read from (else
    its entry is behind its record, and is repaired)."""
    return prefix in _prefixes(RunFilter(record.status, record.workflow, _waited(record)), every=True)


def _waited(record: RunRecord) -> bool | str | None:
    waiting = record.waiting_for
    if waiting is None:
        return None
    name = waiting.get("name")
    return name if isinstance(name, str) and name else True


def _by_id(store: RunStore, namespace: str, keep: RunFilter, limit: int, cursor: str | None) -> RunPage:
    assert keep.run_id_prefix is not None
    page = _Page(limit, keep)
    after = cursor
    while not page.full:
        ids = store.ids_page(namespace, keep.run_id_prefix, after, max(limit * 2, 64))
        if not ids:
            break
        page.take(store, namespace, [(run_id, run_id) for run_id in ids])
        after = ids[-1]
    return page.page("i")


def _times(keep: RunFilter) -> tuple[str | None, str | None]:
    low = indexes.created_ord(keep.created_after) if keep.created_after is not None else None
    high = indexes.created_ord(keep.created_before) if keep.created_before is not None else None
    return low, high


def _prefixes(keep: RunFilter, *, every: bool = False) -> list[str]:
    """The index ranges that hold every run ``keep`` passes (``every``: also
    the ones a run is in, when ``keep`` describes one run)."""
    found: list[str] = []
    if keep.status is not None and keep.workflow is not None:
        found.append(indexes.by_status_and_workflow(keep.status, keep.workflow))
    if isinstance(keep.waiting, str):
        found.append(indexes.waiting_for(keep.waiting))
    if keep.waiting is True or (every and keep.waiting is not None):
        found.append(indexes.waiting_any())
    if keep.status is not None:
        found.append(indexes.by_status(keep.status))
    if keep.workflow is not None:
        found.append(indexes.by_workflow(keep.workflow))
    if every or not found:
        found.append(indexes.all_runs())
    return found


def _smallest(store: RunStore, namespace: str, keep: RunFilter, rng: OrdRange) -> str:
    candidates = _prefixes(keep)
    if len(candidates) == 1:
        return candidates[0]
    counts = store.index_counts(namespace, candidates, rng)
    return min(zip(counts, candidates, strict=True))[1]
