"""``celery-durable runs history RUN [--follow] [--json]``: a run's event
history, one call of the public client per page."""

from __future__ import annotations

import time
from typing import Annotated

import typer
from rich.table import Table

from celery_durable import is_terminal_status
from celery_durable.cli.common import (
    AppOption,
    FollowOption,
    JsonOption,
    NamespaceOption,
    RunArgument,
    TimeoutOption,
    client_for,
    fail,
    guarded,
    out,
    print_json,
    print_json_line,
    runs_app,
)
from celery_durable.client.client import Client
from celery_durable.client.history import HistoryEvent, HistoryPage
from celery_durable.client.history_text import event_summary

QUIET_SECONDS = 1.0
"""A follower reads again after this much silence: run updates are pub/sub, at most once."""


@runs_app.command("history")
def runs_history(
    run_id: RunArgument,
    app_path: AppOption,
    follow: FollowOption = False,
    after: Annotated[int | None, typer.Option("--after", help="Events after this seq (a page's next).")] = None,
    limit: Annotated[int, typer.Option("--limit", help="Events per page, 1 to 500.")] = 200,
    timeout: TimeoutOption = None,
    namespace: NamespaceOption = None,
    as_json: JsonOption = False,
) -> None:
    """Print a run's event history, oldest first: attempts, steps, calls, waits, signals, how it settled."""
    client = guarded(lambda: client_for(app_path, namespace))
    if not follow:
        page = guarded(lambda: client.get_workflow_run_history(run_id, after=after, limit=limit))
        if as_json:
            print_json(page.to_dict())
            return
        out.print(history_table(page.events))
        if page.next is not None:
            out.print(f"next page: --after {page.next}", style="dim", markup=False)
        return
    guarded(lambda: _follow(client, run_id, after, limit, timeout, as_json))


FOLLOW_WIDTHS = (6, 12, 7, 20, 24)
"""Columns of a followed history: seq, at, attempt, kind, key (then the detail): fixed, so the
header is printed once and every later line lines up under it."""


def follow_header() -> str:
    names = ("seq", "at", "attempt", "kind", "key")
    return " ".join(name.ljust(width) for name, width in zip(names, FOLLOW_WIDTHS, strict=True)) + " detail"


def follow_line(event: HistoryEvent) -> str:
    cells = (
        str(event.seq),
        event.at.astimezone().strftime("%H:%M:%S.%f")[:-3],
        str(event.attempt),
        event.kind,
        event.key or "",
    )
    return " ".join(cell.ljust(width) for cell, width in zip(cells, FOLLOW_WIDTHS, strict=True)) + " " + (
        event_summary(event)
    )


def _follow(client: Client, run_id: str, after: int | None, limit: int, timeout: float | None, as_json: bool) -> None:
    """Every event from ``after`` on, then each new one as it comes, until the run settles:
    each event once, the header once."""
    deadline = None if timeout is None else time.monotonic() + timeout
    if not as_json:
        out.print(follow_header(), markup=False, highlight=False)
    with client.watch_runs([run_id]) as watch:
        while True:
            settled = is_terminal_status(client.get_workflow_run(run_id).status)
            page: HistoryPage = client.get_workflow_run_history(run_id, after=after, limit=limit)
            _print(page.events, as_json)
            if page.events:
                after = page.events[-1].seq
            if page.next is not None:
                continue
            if settled:
                return
            if deadline is not None and time.monotonic() >= deadline:
                raise fail(f"Run {run_id} is still going after {timeout:g}s")
            watch.get(timeout=QUIET_SECONDS)


def _print(events: list[HistoryEvent], as_json: bool) -> None:
    for event in events:
        if as_json:
            print_json_line(event.to_dict())
        else:
            out.print(follow_line(event), markup=False, highlight=False, soft_wrap=True)


def history_table(events: list[HistoryEvent]) -> Table:
    table = Table(show_edge=False, pad_edge=False, box=None)
    for name in ("seq", "at", "attempt", "kind", "key", "detail"):
        table.add_column(name, overflow="fold")
    for event in events:
        table.add_row(
            str(event.seq),
            event.at.astimezone().strftime("%H:%M:%S.%f")[:-3],
            str(event.attempt),
            event.kind,
            event.key or "",
            event_summary(event),
        )
    return table
