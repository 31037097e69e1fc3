"""``celery-durable schedules ...``: each command is one call on the public client."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from datetime import datetime
from typing import Annotated, Any

import typer
from rich.table import Table

from celery_durable import ScheduleInfo
from celery_durable.cli.common import (
    AppOption,
    JsonOption,
    NamespaceOption,
    UserError,
    app,
    emit,
    guarded,
    on_client,
    out,
    parse_json_option,
    print_json,
)

schedules_app = typer.Typer(no_args_is_help=True, help="Start workflows on a calendar: no beat process needed.")
app.add_typer(schedules_app, name="schedules")

ScheduleArgument = Annotated[str, typer.Argument(metavar="SCHEDULE", help="A schedule id.")]
NoteOption = Annotated[str | None, typer.Option("--note", help="A note for the operators.")]
SPEC_OPTIONS: dict[str, Any] = {
    "cron": Annotated[str | None, typer.Option("--cron", help="5 cron fields, or 6 with seconds first.")],
    "every": Annotated[float | None, typer.Option("--every", help="Seconds between ticks (>= 1).")],
    "timezone": Annotated[str | None, typer.Option("--timezone", help="IANA time zone of the cron (UTC).")],
    "args": Annotated[str | None, typer.Option("--args", help="JSON args of the runs it starts.")],
    "limits": Annotated[str | None, typer.Option("--limits", help="JSON limits of the runs it starts.")],
    "overlap": Annotated[
        str | None, typer.Option("--overlap", help="skip, buffer_one, allow_all or cancel_other (skip).")
    ],
    "catchup_window": Annotated[
        float | None, typer.Option("--catchup-window", help="Seconds a tick missed in an outage may start late (60).")
    ],
}
"""The options of a schedule's specification: create and update take the same (``_spec_options``)."""


def _fields(**given: Any) -> dict[str, Any]:
    """The options given (None: not given), JSON ones parsed."""
    fields = {name: value for name, value in given.items() if value is not None}
    for name in ("args", "limits"):
        if name in fields:
            fields[name] = parse_json_option(f"--{name}", fields[name])
    return fields


def _time(name: str, text: str) -> datetime:
    try:
        return datetime.fromisoformat(text)
    except ValueError:
        raise UserError(f"{name} takes an ISO 8601 time such as 2024-05-01T09:00:00Z, got {text!r:.80}") from None


def _show(info: ScheduleInfo, as_json: bool) -> None:
    if as_json:
        print_json(info.to_dict())
        return
    when = info.cron or f"every {info.every:g} s"
    state = "paused" if info.paused else "active"
    out.print(f"{info.schedule_id}: {info.workflow}, {when} ({info.timezone}), overlap {info.overlap}, {state}")
    if info.note:
        out.print(f"note: {info.note}", markup=False)
    for at in info.next_times:
        out.print(f"  next {at.isoformat()}", markup=False)
    table = Table("tick", "action", "run", "at")
    for item in info.recent:
        table.add_row(item["tick"].isoformat(), item["action"], item["run_id"] or "", item["at"].isoformat())
    if info.recent:
        out.print(table)


@schedules_app.command("list")
def schedules_list(app_path: AppOption, namespace: NamespaceOption = None, as_json: JsonOption = False) -> None:
    """The namespace's schedules, by id."""
    infos = on_client(app_path, namespace, lambda client: client.list_schedules())
    if as_json:
        print_json({"schedules": [info.to_dict() for info in infos]})
        return
    table = Table("schedule", "workflow", "when", "overlap", "state", "next")
    for info in infos:
        when = info.cron or f"every {info.every:g} s"
        nxt = info.next_times[0].isoformat() if info.next_times else ""
        table.add_row(info.schedule_id, info.workflow, when, info.overlap, "paused" if info.paused else "active", nxt)
    out.print(table)


@schedules_app.command("show")
def schedules_show(
    schedule_id: ScheduleArgument, app_path: AppOption, namespace: NamespaceOption = None, as_json: JsonOption = False
) -> None:
    """A schedule: its specification, next ticks and recent actions."""
    _show(on_client(app_path, namespace, lambda client: client.get_schedule(schedule_id)), as_json)


def _spec_options(command: Callable[..., None]) -> Callable[..., None]:
    """``command`` with the options of a schedule's specification, the same for create and update, in place of
    its ``spec`` parameter, which receives them (None: not given) as a dict."""
    signature = inspect.signature(command, eval_str=True)
    parameters: list[inspect.Parameter] = []
    for parameter in signature.parameters.values():
        if parameter.name != "spec":
            parameters.append(parameter)
            continue
        for name, option in SPEC_OPTIONS.items():
            parameters.append(inspect.Parameter(name, parameter.kind, default=None, annotation=option))

    @functools.wraps(command)
    def with_spec(**given: Any) -> None:
        spec = {name: given.pop(name) for name in SPEC_OPTIONS}
        command(**given, spec=spec)

    setattr(with_spec, "__signature__", signature.replace(parameters=parameters))  # noqa: B010
    with_spec.__annotations__ = {parameter.name: parameter.annotation for parameter in parameters}
    return with_spec


@schedules_app.command("create")
@_spec_options
def schedules_create(
    schedule_id: ScheduleArgument,
    workflow_name: Annotated[str, typer.Argument(metavar="WORKFLOW", help="A registered workflow's name.")],
    app_path: AppOption,
    spec: dict[str, Any],
    paused: Annotated[bool, typer.Option("--paused", help="Create it paused.")] = False,
    note: NoteOption = None,
    replace: Annotated[bool, typer.Option("--replace", help="Replace a schedule of this id.")] = False,
    namespace: NamespaceOption = None,
    as_json: JsonOption = False,
) -> None:
    """Create a schedule (--cron or --every)."""
    fields = guarded(lambda: _fields(**spec, note=note))
    info = on_client(
        app_path,
        namespace,
        lambda client: client.create_schedule(schedule_id, workflow_name, paused=paused, replace=replace, **fields),
    )
    _show(info, as_json)


@schedules_app.command("update")
@_spec_options
def schedules_update(
    schedule_id: ScheduleArgument,
    app_path: AppOption,
    workflow_name: Annotated[str | None, typer.Option("--workflow", help="The workflow its ticks start.")] = None,
    spec: dict[str, Any] | None = None,
    note: NoteOption = None,
    namespace: NamespaceOption = None,
    as_json: JsonOption = False,
) -> None:
    """Change the options given; the rest stay."""
    fields = guarded(lambda: _fields(workflow=workflow_name, **(spec or {}), note=note))
    _show(on_client(app_path, namespace, lambda client: client.update_schedule(schedule_id, **fields)), as_json)


def _pausing(method: str, doc: str) -> Callable[..., None]:
    def command(
        schedule_id: ScheduleArgument,
        app_path: AppOption,
        note: NoteOption = None,
        namespace: NamespaceOption = None,
        as_json: JsonOption = False,
    ) -> None:
        _show(on_client(app_path, namespace, lambda client: getattr(client, method)(schedule_id, note=note)), as_json)

    command.__doc__ = doc
    return command


schedules_app.command("pause")(
    _pausing("pause_schedule", "Fire nothing until unpaused (the ticks passed meanwhile are not caught up).")
)
schedules_app.command("unpause")(_pausing("unpause_schedule", "Fire again, from the next tick."))


@schedules_app.command("trigger")
def schedules_trigger(
    schedule_id: ScheduleArgument, app_path: AppOption, namespace: NamespaceOption = None, as_json: JsonOption = False
) -> None:
    """Start a run now, as a tick at the current time (overlap applies): prints its id, or that it was skipped."""
    run_id = on_client(app_path, namespace, lambda client: client.trigger_schedule(schedule_id))
    emit(as_json, {"run_id": run_id}, run_id or "skipped (overlap)")


@schedules_app.command("backfill")
def schedules_backfill(
    schedule_id: ScheduleArgument,
    start: Annotated[str, typer.Argument(metavar="START", help="ISO 8601 (a naive time is UTC), inclusive.")],
    end: Annotated[str, typer.Argument(metavar="END", help="ISO 8601, exclusive.")],
    app_path: AppOption,
    namespace: NamespaceOption = None,
    as_json: JsonOption = False,
) -> None:
    """Start a run for every tick in [START, END); again, the same runs, nothing new."""
    start_at, end_at = guarded(lambda: (_time("START", start), _time("END", end)))
    run_ids = on_client(app_path, namespace, lambda client: client.backfill_schedule(schedule_id, start_at, end_at))
    if as_json:
        print_json({"run_ids": run_ids})
        return
    for run_id in run_ids:
        out.print(run_id, markup=False)


@schedules_app.command("delete")
def schedules_delete(
    schedule_id: ScheduleArgument, app_path: AppOption, namespace: NamespaceOption = None, as_json: JsonOption = False
) -> None:
    """Stop its ticks; the runs it started are untouched."""
    on_client(app_path, namespace, lambda client: client.delete_schedule(schedule_id))
    emit(as_json, {"deleted": schedule_id}, f"deleted {schedule_id}")
