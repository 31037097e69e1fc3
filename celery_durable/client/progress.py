"""Reading a run's progress (SPEC §7), and the one loop that waits for a run.

The client's progress and wait methods are one line into here. Options are
pydantic models checked first, and a bad one is a ``ValueError`` naming it;
a page is one atomic read in Redis (``read_progress.lua``), so its
``has_more`` flags, bounds and revision always describe the records it holds.

Waiting for a run and following its progress are the same loop,
:func:`settling`: it yields the run's envelope now and after every change,
until the run settles. :func:`wait_for_run` keeps the last envelope;
:func:`follow` reads the new records at each one.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, TypeVar

from pydantic import BaseModel, ConfigDict, Field, InstanceOf, StrictInt, StrictStr, ValidationError

from celery_durable.broker.events import RunUpdate, RunWatch
from celery_durable.broker.progress import PageMode, ProgressSlice
from celery_durable.errors import WorkflowWaitCancelled
from celery_durable.workflows.envelope import ProgressEntry, ProgressPage, RunEnvelope, is_terminal_status
from celery_durable.workflows.validation import Loc, PositiveNumber, at_most, described, explain

if TYPE_CHECKING:
    from celery_durable.client.client import Client

DEFAULT_LIMIT = 200
PAGE_LIMIT_MAX = 500
"""The most one page holds: progress records, and runs in ``list_workflow_runs``."""
DEFAULT_POLL_MS = 1000
MAX_POLL_MS = 3_600_000
MAX_TIMEOUT = 1e9
"""About 31 years: longer is "forever", which None says; and a deadline must stay a finite float."""
CANCEL_CHECK_SECONDS = 0.05
"""How soon a set ``cancel_event`` ends a wait."""

Options = TypeVar("Options", bound=BaseModel)


class PageOptions(BaseModel):
    """The options of one progress page, as ``get_workflow_run_progress`` takes them."""

    model_config = ConfigDict(strict=True, frozen=True)

    after_seq: Annotated[StrictInt, Field(ge=-1), described("an integer >= -1")] | None = None
    before_seq: Annotated[StrictInt, Field(ge=-1), described("an integer >= -1")] | None = None
    limit: (
        Annotated[StrictInt, Field(ge=1, le=PAGE_LIMIT_MAX), described(f"an integer from 1 to {PAGE_LIMIT_MAX}")] | None
    ) = None
    phase_id: Annotated[StrictStr, Field(min_length=1), described("a non-empty string")] | None = None


class WaitOptions(BaseModel):
    """How long and how to wait for a run: ``wait_for_workflow_run``, ``follow_workflow_run_progress``."""

    model_config = ConfigDict(strict=True, frozen=True)

    timeout: (
        Annotated[
            PositiveNumber,
            at_most(MAX_TIMEOUT),
            described(f"a positive number of seconds up to {MAX_TIMEOUT:.0e} (None waits without limit)"),
        ]
        | None
    ) = None
    poll_interval_ms: (
        Annotated[StrictInt, Field(ge=1, le=MAX_POLL_MS), described(f"an integer from 1 to {MAX_POLL_MS}")] | None
    ) = None
    cancel_event: Annotated[InstanceOf[threading.Event], described("a threading.Event")] | None = None

    @property
    def poll_seconds(self) -> float:
        return (self.poll_interval_ms or DEFAULT_POLL_MS) / 1000


@dataclass(frozen=True, slots=True)
class PageQuery:
    """Checked options of one page: where it starts and how long it is."""

    mode: PageMode
    cursor: int
    limit: int


def check_query(
    after_seq: int | None, before_seq: int | None, limit: int | None, phase_id: str | None = None
) -> PageQuery:
    """The page the options ask for; a ``ValueError`` naming the first bad one."""
    options = _checked(PageOptions, after_seq=after_seq, before_seq=before_seq, limit=limit, phase_id=phase_id)
    if options.after_seq is not None and options.before_seq is not None:
        raise ValueError("after_seq and before_seq cannot be given together: page forward or backward")
    count = DEFAULT_LIMIT if options.limit is None else options.limit
    if options.after_seq is not None:
        return PageQuery("after", max(options.after_seq, 0), count)  # -1 and 0 both mean from the start
    if options.before_seq is not None:
        return PageQuery("before", max(options.before_seq, 0), count)
    return PageQuery("newest", 0, count)


def check_page_limit(limit: object) -> int:
    """A page size of a listing (``list_workflow_runs``): 1..PAGE_LIMIT_MAX, no default."""
    if limit is None:
        raise ValueError(f"limit must be an integer from 1 to {PAGE_LIMIT_MAX}, got None")
    return check_query(None, None, limit).limit  # type: ignore[arg-type]


def check_phase_id(phase_id: object, declared: list[str] | None, workflow: str) -> str:
    """``phase_id`` as the store takes it ('' for the whole run).

    A phase the workflow does not declare is refused rather than answered
    with an empty page: a typo should not look like a quiet phase. When this
    engine does not know the workflow (``declared`` is None), any id passes.
    """
    checked = _checked(PageOptions, phase_id=phase_id).phase_id
    if checked is None:
        return ""
    if declared is not None and checked not in declared:
        known = ", ".join(declared) or "none"
        raise ValueError(f"phase_id {checked!r} is not a phase of workflow {workflow!r} (its phases: {known})")
    return checked


def check_wait(
    timeout: float | None = None, poll_interval_ms: int | None = None, cancel_event: threading.Event | None = None
) -> WaitOptions:
    """The options of a wait or a follow; a ``ValueError`` naming the first bad one."""
    return _checked(WaitOptions, timeout=timeout, poll_interval_ms=poll_interval_ms, cancel_event=cancel_event)


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


# -- waiting ------------------------------------------------------------------------


def may_have_settled(update: RunUpdate) -> bool:
    """Whether a wait for a run's end reads the run again after ``update``:
    every script that changes a run's status says ``status``, and to what
    (events.py), so neither a progress record nor a run that starts running
    costs the wait a read; a run that is gone says nothing, and is read
    again after the wait's quiet while."""
    return update.change == "status" and (update.status is None or is_terminal_status(update.status))


def settling(
    client: Client,
    run_id: str,
    *,
    timeout: float | None,
    poll_interval: float,
    cancel_event: threading.Event | None,
    wanted: Callable[[RunUpdate], bool] | None = None,
) -> Iterator[RunEnvelope]:
    """The run's envelope now and after every change (each update ``wanted``
    says is one, when given: a wait for the end reads the run again only
    once it ``may_have_settled``), until it settles.

    The last envelope yielded is terminal. Changes are learnt from
    ``watch_runs``, subscribed before the first read so that no change after
    that read goes unnoticed; after ``poll_interval`` seconds of silence the
    run is read anyway, because pub/sub may drop an update. Past ``timeout``
    it raises ``TimeoutError``, and once ``cancel_event`` is set
    ``WorkflowWaitCancelled``: the run goes on either way.
    """
    deadline = None if timeout is None else time.monotonic() + timeout
    with client.watch_runs(run_ids=[run_id]) as watch:
        while True:
            envelope = client.get_workflow_run(run_id)
            yield envelope
            if envelope.is_terminal:
                return
            quiet = poll_interval
            if deadline is not None:
                if time.monotonic() >= deadline:
                    raise TimeoutError(f"Run {run_id} is still {envelope.status} after {timeout}s")
                # Wake at the deadline for a last look: the run may have just settled.
                quiet = min(quiet, deadline - time.monotonic())
            _until_change(watch, quiet, cancel_event, run_id, wanted)


def wait_for_run(
    client: Client,
    run_id: str,
    *,
    timeout: float | None = None,
    poll_interval_ms: int | None = None,
    cancel_event: threading.Event | None = None,
) -> RunEnvelope:
    """``Client.wait_for_workflow_run``: the run's envelope once it has settled."""
    options = check_wait(timeout, poll_interval_ms, cancel_event)
    envelopes = settling(
        client,
        run_id,
        timeout=options.timeout,
        poll_interval=options.poll_seconds,
        cancel_event=options.cancel_event,
        wanted=may_have_settled,
    )
    return deque(envelopes, maxlen=1)[0]


def follow(
    client: Client,
    run_id: str,
    options: WaitOptions,
    *,
    phase_id: str | None,
    after_seq: int,
    on_run: Callable[[RunEnvelope], None] | None = None,
) -> Iterator[ProgressEntry]:
    """Records after ``after_seq`` as they are written, until the run settles.

    New records are read after each envelope, never before it: a run's final
    status and its last records are written by one script, so the read that
    follows a terminal envelope holds every record there will be. ``on_run``
    is given each envelope once its records are out, so a follower learns
    what records never say: that the run now waits (``snapshot.waiting_for``).
    """
    for envelope in settling(
        client, run_id, timeout=options.timeout, poll_interval=options.poll_seconds, cancel_event=options.cancel_event
    ):
        while True:
            page = client.get_workflow_run_progress(
                run_id, phase_id=phase_id, after_seq=after_seq, limit=PAGE_LIMIT_MAX
            )
            yield from page.records
            if page.records:
                after_seq = page.records[-1].seq
            if not page.has_more_newer:
                break
        if on_run is not None:
            on_run(envelope)


def _until_change(
    watch: RunWatch,
    seconds: float,
    cancel_event: threading.Event | None,
    run_id: str,
    wanted: Callable[[RunUpdate], bool] | None = None,
) -> None:
    """Until an update of the run (one ``wanted``, when given) or ``seconds``
    of silence; ``WorkflowWaitCancelled`` once the event is set."""
    until = time.monotonic() + seconds
    while True:
        if cancel_event is not None and cancel_event.is_set():
            raise WorkflowWaitCancelled(f"Waiting for run {run_id} was cancelled; the run goes on")
        remaining = until - time.monotonic()
        if remaining <= 0:
            return
        # Short slices only while there is an event to notice.
        update = watch.get(remaining if cancel_event is None else min(remaining, CANCEL_CHECK_SECONDS))
        if update is not None and (wanted is None or wanted(update)):
            return


def _checked(model: type[Options], **values: object) -> Options:
    try:
        return model.model_validate(values)
    except ValidationError as exc:
        raise ValueError(explain(exc, _option_name)) from None


def _option_name(loc: Loc) -> str:
    return ".".join(map(str, loc))
