"""Reading a run's progress: the pages of SPEC §7, and following a run live.

The client's progress methods are one line into here. Option checking comes
first and names the option at fault; a page is one atomic read in Redis
(``read_progress.lua``), so its ``has_more`` flags, bounds and revision
always describe the records it holds.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from celery_durable.broker.events import RunUpdate
from celery_durable.broker.progress import PageMode, ProgressSlice
from celery_durable.errors import WorkflowWaitCancelled
from celery_durable.workflows.envelope import ProgressEntry, ProgressPage

if TYPE_CHECKING:
    from celery_durable.client import Client

DEFAULT_LIMIT = 200
MAX_LIMIT = 500
DEFAULT_POLL_SECONDS = 1.0


@dataclass(frozen=True, slots=True)
class PageQuery:
    """Checked options of one page: where it starts and how long it is."""

    mode: PageMode
    cursor: int
    limit: int


def check_query(after_seq: int | None, before_seq: int | None, limit: int | None) -> PageQuery:
    """The page the options ask for; a ``ValueError`` naming the first bad one."""
    for name, value in (("after_seq", after_seq), ("before_seq", before_seq)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < -1):
            raise ValueError(f"{name} must be an integer >= -1, got {value!r}")
    if after_seq is not None and before_seq is not None:
        raise ValueError("after_seq and before_seq cannot be given together: page forward or backward")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_LIMIT):
        raise ValueError(f"limit must be an integer from 1 to {MAX_LIMIT}, got {limit!r}")
    count = DEFAULT_LIMIT if limit is None else limit
    if after_seq is not None:
        return PageQuery("after", max(after_seq, 0), count)  # -1 and 0 both mean from the start
    if before_seq is not None:
        return PageQuery("before", max(before_seq, 0), count)
    return PageQuery("newest", 0, count)


def check_phase_id(phase_id: object, declared: list[str] | None, workflow: str) -> str:
    """``phase_id`` as the store takes it ('' for the whole run).

    A phase the workflow does not declare is refused rather than answered
    with an empty page: a typo should not look like a quiet phase. When this
    engine does not know the workflow (``declared`` is None), any id passes.
    """
    if phase_id is None:
        return ""
    if not isinstance(phase_id, str) or not phase_id:
        raise ValueError(f"phase_id must be a non-empty string, got {phase_id!r}")
    if declared is not None and phase_id not in declared:
        known = ", ".join(declared) or "none"
        raise ValueError(f"phase_id {phase_id!r} is not a phase of workflow {workflow!r} (its phases: {known})")
    return phase_id


def to_page(data: ProgressSlice, query: PageQuery) -> ProgressPage:
    """A ``ProgressPage``: ``has_more_older``/``has_more_newer`` say whether
    records in scope lie before or after the page; an empty page is placed
    at its cursor, so paging on from it still works."""
    records = [ProgressEntry.from_record(record) for record in data.records]
    if records:
        low, high = records[0].seq, records[-1].seq
    elif query.mode == "after":
        low = high = query.cursor + 1  # the page would have started right after the cursor
    elif query.mode == "before":
        low = high = query.cursor - 1  # ... and ended right before it
    else:
        low, high = 0, 0  # no cursor and no record: nothing in scope at all
    return ProgressPage(
        records=records,
        oldest_seq=data.oldest,
        newest_seq=data.newest,
        has_more_older=data.oldest is not None and data.oldest < low,
        has_more_newer=data.newest is not None and data.newest > high,
        revision=data.revision,
    )


def follow(
    client: Client,
    run_id: str,
    *,
    phase_id: str | None,
    after_seq: int,
    timeout: float | None,
    poll_interval: float,
    cancel_event: threading.Event | None,
) -> Iterator[ProgressEntry]:
    """Records after ``after_seq`` as they are written, until the run settles.

    The watch is subscribed before the first read, so nothing written after
    that read goes unnoticed; silence longer than ``poll_interval`` reads
    again anyway, because pub/sub may drop an update. Once the run is seen
    settled, one more read takes the records written with its final status
    (the same script writes both).
    """
    deadline = None if timeout is None else time.monotonic() + timeout
    with client.watch_runs(run_ids=[run_id]) as watch:
        settled = False
        while True:
            page = client.get_workflow_run_progress(run_id, phase_id=phase_id, after_seq=after_seq, limit=MAX_LIMIT)
            yield from page.records
            if page.records:
                after_seq = page.records[-1].seq
            if page.has_more_newer:
                continue
            if settled:
                return
            if client.get_workflow_run(run_id).is_terminal:
                settled = True
                continue
            _wait(watch.get, deadline, poll_interval, cancel_event, run_id, timeout)


def _wait(
    get: Callable[[float], RunUpdate | None],
    deadline: float | None,
    poll_interval: float,
    cancel_event: threading.Event | None,
    run_id: str,
    timeout: float | None,
) -> None:
    """Until an update of the run, ``poll_interval`` of silence, the deadline
    (``TimeoutError``) or the cancel event (``WorkflowWaitCancelled``)."""
    quiet_until = time.monotonic() + poll_interval
    while True:
        if cancel_event is not None and cancel_event.is_set():
            raise WorkflowWaitCancelled(f"Following run {run_id} was cancelled; the run goes on")
        now = time.monotonic()
        if deadline is not None and now >= deadline:
            raise TimeoutError(f"Run {run_id} has not settled after {timeout}s")
        if now >= quiet_until:
            return
        limit = quiet_until if deadline is None else min(quiet_until, deadline)
        # Short slices so that a cancel_event is noticed within 50 ms.
        if get(min(limit - now, 0.05)) is not None:
            return
