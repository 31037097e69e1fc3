"""``celery-durable runs ...``: list, show, follow and steer runs, and read their history; each command is one call
on the public client."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Annotated, Any

import typer
from rich.table import Table
from typer.core import TyperCommand

from celery_durable import PhaseRow, ProgressPage, RunEnvelope, is_terminal_status
from celery_durable.cli.common import (
    EXIT_FAILED,
    EXIT_USAGE,
    AppOption,
    FollowOption,
    JsonOption,
    NamespaceOption,
    RunArgument,
    TimeoutOption,
    UserError,
    client_for,
    emit,
    fail,
    guarded,
    on_client,
    out,
    parse_json_option,
    print_json,
    print_json_line,
    runs_app,
)
from celery_durable.cli.follow import follow_run, view_for
from celery_durable.cli.render import detail_view, print_envelope, record_line, runs_table
from celery_durable.client.client import Client
from celery_durable.client.history import HistoryEvent, HistoryPage, check_page
from celery_durable.client.history_text import event_summary
from celery_durable.client.listing import ANY_WAIT, time_param, waiting_param
from celery_durable.client.progress import check_wait

# The signal `runs approve` sends: the one ctx.wait_for_approval waits for (as the web view's Approve button).
APPROVAL_SIGNAL = "approval"


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
    # As every command that waits, before anything is printed: a bad option, a timeout that is
    # no positive number (nan would follow for ever) and an unknown run are one error line.
    guarded(lambda: (check_page(after, limit), check_wait(timeout), client.get_workflow_run(run_id)))
    guarded(lambda: _follow_history(client, run_id, after, limit, timeout, as_json))


FOLLOW_WIDTHS = (6, 12, 7, 20, 24)
"""Columns of a followed history: seq, at, attempt, kind, key (then the detail): fixed, so the
header is printed once and every later line lines up under it."""


def follow_header() -> str:
    names = ("seq", "at", "attempt", "kind", "key")
    return " ".join(name.ljust(width) for name, width in zip(names, FOLLOW_WIDTHS, strict=True)) + " detail"


def _cells(event: HistoryEvent) -> tuple[str, str, str, str, str]:
    """seq, at, attempt, kind, key: the columns before the detail."""
    at = event.at.astimezone().strftime("%H:%M:%S.%f")[:-3]
    return str(event.seq), at, str(event.attempt), event.kind, event.key or ""


def follow_line(event: HistoryEvent) -> str:
    padded = (cell.ljust(width) for cell, width in zip(_cells(event), FOLLOW_WIDTHS, strict=True))
    return " ".join(padded) + " " + event_summary(event)


def _follow_history(
    client: Client, run_id: str, after: int | None, limit: int, timeout: float | None, as_json: bool
) -> None:
    """Every event from ``after`` on, then each new one as it comes, until the run settles:
    each event once, the header once."""
    deadline = None if timeout is None else time.monotonic() + timeout
    if not as_json:
        out.print(follow_header(), markup=False, highlight=False)
    with client.watch_runs([run_id]) as watch:
        while True:
            settled = is_terminal_status(client.get_workflow_run(run_id).status)
            page: HistoryPage = client.get_workflow_run_history(run_id, after=after, limit=limit)
            _print_events(page.events, as_json)
            if page.events:
                after = page.events[-1].seq
            if page.next is not None:
                continue
            if settled:
                return
            if deadline is not None and time.monotonic() >= deadline:
                raise fail(f"Run {run_id} is still going after {timeout:g}s")
            watch.get(timeout=QUIET_SECONDS)


def _print_events(events: list[HistoryEvent], as_json: bool) -> None:
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
        table.add_row(*_cells(event), event_summary(event))
    return table


@runs_app.command("start")
def runs_start(
    workflow_name: Annotated[str, typer.Argument(metavar="WORKFLOW", help="A registered workflow's name.")],
    app_path: AppOption,
    args: Annotated[str, typer.Option("--args", help="JSON arguments of the run.")] = "{}",
    idempotency_key: Annotated[
        str | None, typer.Option("--idempotency-key", help="Start once per key: again, it prints the first run's id.")
    ] = None,
    throttle: Annotated[
        str | None,
        typer.Option("--throttle", help="Hold a slot of this throttle while it runs; wait while every slot is taken."),
    ] = None,
    throttle_key: Annotated[str | None, typer.Option("--throttle-key", help="Its throttle key.")] = None,
    priority: Annotated[int, typer.Option("--priority", help="Among the throttle's waiters: higher first.")] = 0,
    namespace: NamespaceOption = None,
    as_json: JsonOption = False,
) -> None:
    """Start a run and print its id at once, without waiting for it to finish.

    For a script: RUN=$(celery-durable runs start order --args '{"id": 7}'),
    then 'runs show', 'runs signal' or 'runs progress --follow' with it.
    """
    parsed = guarded(lambda: parse_json_option("--args", args))
    run_id = guarded(
        lambda: client_for(app_path, namespace).start_workflow(
            workflow_name,
            args=parsed,
            idempotency_key=idempotency_key,
            throttle=throttle,
            throttle_key=throttle_key,
            priority=priority,
        )
    )
    emit(as_json, {"run_id": run_id}, run_id)


class _WaitingNameOptional(TyperCommand):
    """``--waiting [NAME]``: with no name (the last word, or an option next),
    runs waiting for anything. Click has no optional option values Typer passes on."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        given = list(args)
        for at, word in enumerate(given):
            if word == "--":
                break
            if word == "--waiting" and (at + 1 == len(given) or given[at + 1].startswith("-")):
                given[at] = f"--waiting={ANY_WAIT}"
        return super().parse_args(ctx, given)


@runs_app.command("list", cls=_WaitingNameOptional)
def runs_list(
    app_path: AppOption,
    status: Annotated[str | None, typer.Option("--status", help="Only runs with this status.")] = None,
    workflow_name: Annotated[str | None, typer.Option("--workflow", help="Only runs of this workflow.")] = None,
    limit: Annotated[int, typer.Option("--limit", help="Runs per page, 1 to 500.")] = 50,
    cursor: Annotated[str | None, typer.Option("--cursor", help="The next_cursor of the previous page.")] = None,
    waiting: Annotated[
        str | None,
        typer.Option(
            "--waiting",
            metavar="[NAME]",
            help="Only runs that wait: for anything (alone), or for NAME (a signal's name, a child's run id).",
        ),
    ] = None,
    prefix: Annotated[str | None, typer.Option("--prefix", help="Only runs whose id starts with this.")] = None,
    since: Annotated[str | None, typer.Option("--since", help="Only runs created at or after (ISO 8601).")] = None,
    until: Annotated[str | None, typer.Option("--until", help="Only runs created before (ISO 8601).")] = None,
    schedule: Annotated[
        str | None, typer.Option("--schedule", metavar="ID", help="Only runs this schedule started, newest tick first.")
    ] = None,
    namespace: NamespaceOption = None,
    as_json: JsonOption = False,
) -> None:
    """List runs, newest first (by id with --prefix, by tick with --schedule)."""
    page = guarded(
        lambda: client_for(app_path, namespace).list_workflow_runs(
            status=status,
            workflow=workflow_name,
            limit=limit,
            cursor=cursor,
            waiting=waiting_param(waiting),
            run_id_prefix=prefix,
            created_after=time_param("--since", since),
            created_before=time_param("--until", until),
            schedule_id=schedule,
        )
    )
    if as_json:
        print_json({"runs": [envelope.to_dict() for envelope in page.runs], "next_cursor": page.next_cursor})
        return
    if not page.runs:
        out.print("No runs", markup=False)
        return
    out.print(runs_table(page))
    if page.next_cursor:
        out.print(f"next page: --cursor {page.next_cursor}", markup=False)


@runs_app.command("reindex")
def runs_reindex(app_path: AppOption, namespace: NamespaceOption = None, as_json: JsonOption = False) -> None:
    """Rebuild the namespace's run indexes from the run records (a store
    written before they existed lists by status, workflow or wait only after)."""
    count = on_client(app_path, namespace, lambda client: client.reindex_runs())
    emit(as_json, {"runs": count}, f"indexed {count} runs")


@runs_app.command("show")
def runs_show(
    run_id: RunArgument, app_path: AppOption, namespace: NamespaceOption = None, as_json: JsonOption = False
) -> None:
    """Show a run: its envelope, phases, agents, steps and recent progress."""
    detail = on_client(app_path, namespace, lambda client: client.get_workflow_run_detail(run_id))
    if as_json:
        print_json(detail.to_dict())
        return
    out.print(detail_view(detail))


@runs_app.command("progress")
def runs_progress(
    run_id: RunArgument,
    app_path: AppOption,
    follow: FollowOption = False,
    phase: Annotated[str | None, typer.Option("--phase", help="Only this phase (its id or title).")] = None,
    after_seq: Annotated[int | None, typer.Option("--after-seq", help="Records after this seq.")] = None,
    before_seq: Annotated[int | None, typer.Option("--before-seq", help="Records before this seq.")] = None,
    limit: Annotated[int | None, typer.Option("--limit", help="Records per page, 1 to 500 (default 200).")] = None,
    timeout: TimeoutOption = None,
    namespace: NamespaceOption = None,
    as_json: JsonOption = False,
) -> None:
    """Print a page of a run's progress records; --follow goes on live."""
    if follow and (phase is not None or before_seq is not None):
        raise fail("--follow shows the whole run from its newest page (or --after-seq) on", exit_code=EXIT_USAGE)

    def page_of(client: Client) -> ProgressPage:
        phase_id = _phase_id(client, run_id, phase) if phase is not None else None
        return client.get_workflow_run_progress(
            run_id, phase_id=phase_id, after_seq=after_seq, before_seq=before_seq, limit=limit
        )

    client = on_client(app_path, namespace, lambda client: client)
    if not follow:
        page = guarded(lambda: page_of(client))
        if as_json:
            print_json(page.to_dict())
            return
        phases = guarded(lambda: client.get_workflow_run_detail(run_id).phases)
        for record in page.records:
            out.print(f"{record.seq:>5} ", end="", markup=False)
            out.print(record_line(record, phases))
        if page.has_more_older and page.records:
            out.print(f"older records: --before-seq {page.records[0].seq}", style="dim", markup=False)
        return

    def body() -> RunEnvelope:
        history = page_of(client).records
        start = history[-1].seq if history else max(after_seq or 0, 0)
        return follow_run(client, run_id, view_for(out, as_json), after_seq=start, timeout=timeout, history=history)

    envelope = guarded(body)
    if envelope.status != "completed":
        raise typer.Exit(EXIT_FAILED)


def _phase_id(client: Client, run_id: str, phase: str) -> str:
    """A phase named by id or by title, as the run's detail lists it."""
    phases: list[PhaseRow] = client.get_workflow_run_detail(run_id).phases
    for row in phases:
        if phase in (row.phase_id, row.title):
            return row.phase_id
    known = ", ".join(f"{row.phase_id} ({row.title})" for row in phases) or "none"
    raise UserError(f"--phase {phase!r} is not a phase of this run's workflow; its phases: {known}")


def _settling(method: str, waits_for: str, doc: str) -> Callable[..., None]:
    """``runs cancel`` and ``runs pause``: ask, then wait (30 s by default) until the run has done so."""

    def command(
        run_id: RunArgument,
        app_path: AppOption,
        timeout: float = 30,
        namespace: NamespaceOption = None,
        as_json: JsonOption = False,
    ) -> None:
        envelope = on_client(app_path, namespace, lambda client: getattr(client, method)(run_id, timeout=timeout))
        _print(envelope, as_json)

    help_text = f"Seconds to wait for {waits_for}."
    command.__annotations__["timeout"] = Annotated[float, typer.Option("--timeout", help=help_text)]
    command.__doc__ = doc
    return command


runs_app.command("cancel")(
    _settling("cancel_workflow_run", "the run to settle", "Cancel a run and wait until it has settled.")
)


@runs_app.command("resume")
def runs_resume(
    run_id: RunArgument,
    app_path: AppOption,
    force: Annotated[bool, typer.Option("--force", help="Take over even from an attempt that looks alive.")] = False,
    allow_code_change: Annotated[
        bool,
        typer.Option(
            "--allow-code-change",
            help="Resume although the registered workflow code differs from the code the run started with (its "
            "code hash changed). The run replays its journal with the new code, which must make the same calls up "
            "to where the run stopped: guard changes with ctx.patched, and check first with 'celery-durable "
            "replay-check --run RUN'. A run stopped on nondeterminism resumes without it once the code it "
            "started with is back.",
        ),
    ] = False,
    timeout: TimeoutOption = None,
    namespace: NamespaceOption = None,
    as_json: JsonOption = False,
) -> None:
    """Resume a run with a new attempt and wait until it settles."""
    envelope = guarded(
        lambda: client_for(app_path, namespace).resume_workflow(
            run_id, force=force, allow_code_change=allow_code_change, timeout=timeout
        )
    )
    _print(envelope, as_json)
    if envelope.status != "completed":
        raise typer.Exit(EXIT_FAILED)


runs_app.command("pause")(
    _settling("pause_workflow_run", "the run to pause", "Stop dispatching new work; wait until the run is paused.")
)


@runs_app.command("signal")
def runs_signal(
    run_id: RunArgument,
    name: Annotated[str, typer.Argument(metavar="NAME", help="The signal's name.")],
    app_path: AppOption,
    payload: Annotated[str, typer.Argument(metavar="[JSON]", help="The signal's JSON payload.")] = "null",
    namespace: NamespaceOption = None,
    as_json: JsonOption = False,
) -> None:
    """Deliver an external event to a run: its ctx.wait_for_signal(NAME) returns it."""
    client = on_client(app_path, namespace, lambda client: client)
    parsed = guarded(lambda: parse_json_option("JSON", payload))
    _signal(client, run_id, name, parsed, as_json)


@runs_app.command("approve")
def runs_approve(
    run_id: RunArgument,
    app_path: AppOption,
    reject: Annotated[bool, typer.Option("--reject", help="Reject instead of approve.")] = False,
    note: Annotated[str | None, typer.Option("--note", help="A note that goes with the decision.")] = None,
    namespace: NamespaceOption = None,
    as_json: JsonOption = False,
) -> None:
    """Approve (or --reject) a run waiting for a person: the signal 'approval'."""
    client = on_client(app_path, namespace, lambda client: client)
    _signal(client, run_id, APPROVAL_SIGNAL, {"approved": not reject, "note": note}, as_json)


def _signal(client: Client, run_id: str, name: str, payload: Any, as_json: bool) -> None:
    guarded(lambda: client.signal_workflow_run(run_id, name, payload))
    data = {"run_id": run_id, "signal": name, "payload": payload, "delivered": True}
    emit(as_json, data, f"signal {name!r} delivered to run {run_id}")


def _print(envelope: RunEnvelope, as_json: bool) -> None:
    if as_json:
        print_json(envelope.to_dict())
    else:
        print_envelope(out, envelope)
