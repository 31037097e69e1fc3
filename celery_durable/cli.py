"""The ``celery-durable`` command: a thin layer over the public client (SPEC §11).

User errors print one line and exit non-zero; ``--json`` prints machine-
readable output for scripts.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import time
from collections.abc import Callable
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console
from rich.table import Table

from celery_durable.client import Client
from celery_durable.engine import Engine
from celery_durable.errors import DurableError
from celery_durable.workflows.envelope import RunEnvelope

app = typer.Typer(no_args_is_help=True, add_completion=False, help="Durable workflows on Celery and Redis.")
runs_app = typer.Typer(no_args_is_help=True, help="Inspect and steer runs.")
app.add_typer(runs_app, name="runs")

out = Console()
err = Console(stderr=True)
T = TypeVar("T")

AppOption = Annotated[
    str,
    typer.Option("--app", "-A", envvar="CELERY_DURABLE_APP", help="The engine, as 'package.module:attribute'."),
]
JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON for scripts.")]
NamespaceOption = Annotated[str | None, typer.Option("--namespace", "-n", help="Namespace of the runs.")]


class UserError(Exception):
    """A mistake on the command line: shown as one line, exit code 2."""


def load_engine(path: str) -> Engine:
    """Import ``package.module:attribute`` named on the command line (never from a message)."""
    module_name, _, attribute = path.partition(":")
    if not module_name or not attribute:
        raise UserError(f"--app must look like 'package.module:attribute', got {path!r}")
    sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise UserError(f"cannot import {module_name!r}: {exc}") from None
    target = getattr(module, attribute, None)
    if callable(target) and not isinstance(target, Engine):
        target = target()
    if not isinstance(target, Engine):
        raise UserError(f"{path} is not a celery_durable.Engine")
    return target


def guarded(action: Callable[[], T]) -> T:
    """Run a command body; user-facing errors become one line and an exit code."""
    try:
        return action()
    except UserError as exc:
        err.print(f"error: {exc}", markup=False, highlight=False)
        raise typer.Exit(2) from None
    except (DurableError, ValueError, LookupError, TimeoutError) as exc:
        code = getattr(exc, "code", None)
        prefix = f"error [{code}]" if code else "error"
        err.print(f"{prefix}: {exc}", markup=False, highlight=False)
        raise typer.Exit(1) from None


def client_for(app_path: str, namespace: str | None) -> Client:
    return load_engine(app_path).client(namespace)


def print_envelope(envelope: RunEnvelope, as_json: bool) -> None:
    if as_json:
        out.print_json(json.dumps(envelope.to_dict()))
        return
    table = Table(show_header=False, box=None)
    for key, value in envelope.to_dict().items():
        table.add_row(key, json.dumps(value) if isinstance(value, dict | list) else str(value))
    out.print(table)


@app.command()
def worker(
    app_path: AppOption,
    queues: Annotated[str | None, typer.Option("--queues", "-Q", help="Comma-separated queues; default all.")] = None,
    concurrency: Annotated[int | None, typer.Option("--concurrency", "-c", help="Worker slots.")] = None,
    pool: Annotated[str | None, typer.Option("--pool", "-P", help="prefork, threads or solo.")] = None,
    loglevel: Annotated[str, typer.Option("--loglevel", "-l")] = "INFO",
    hostname: Annotated[str | None, typer.Option("--hostname")] = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No start-up banner.")] = False,
) -> None:
    """Start a Celery worker for the engine's workflows, with task events on."""
    engine = guarded(lambda: load_engine(app_path))
    argv = ["--quiet"] if quiet else []
    argv += ["worker", f"--loglevel={loglevel}", "--task-events"]
    if queues:
        argv.append(f"--queues={queues}")
    if concurrency:
        argv.append(f"--concurrency={concurrency}")
    if pool:
        argv.append(f"--pool={pool}")
    if hostname:
        argv.append(f"--hostname={hostname}")
    engine.celery.worker_main(argv)


@app.command()
def run(
    workflow_name: Annotated[str, typer.Argument(metavar="WORKFLOW")],
    app_path: AppOption,
    args: Annotated[str, typer.Option("--args", help="JSON arguments of the run.")] = "{}",
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Show progress until the run settles.")] = False,
    timeout: Annotated[float | None, typer.Option("--timeout", help="Seconds to wait.")] = None,
    namespace: NamespaceOption = None,
    as_json: JsonOption = False,
) -> None:
    """Start a run and wait until it settles."""

    def body() -> RunEnvelope:
        try:
            parsed = json.loads(args)
        except json.JSONDecodeError as exc:
            raise UserError(f"--args is not JSON: {exc}") from None
        client = client_for(app_path, namespace)
        run_id = client.start_workflow(workflow_name, args=parsed)
        if follow and not as_json:
            follow_progress(client, run_id, timeout)
        return client.wait_for_workflow_run(run_id, timeout=timeout)

    envelope = guarded(body)
    print_envelope(envelope, as_json)
    if envelope.status != "completed":
        raise typer.Exit(1)


def follow_progress(client: Client, run_id: str, timeout: float | None) -> None:
    """Print progress records as they arrive until the run settles."""
    deadline = None if timeout is None else time.monotonic() + timeout
    after = 0
    while True:
        page = client.get_workflow_run_progress(run_id, after_seq=after, limit=500)
        for record in page.records:
            out.print(f"[dim]{record.seq:>4}[/dim] [bold]{record.kind:<6}[/bold] {record.message}", highlight=False)
            after = record.seq
        if page.records and page.has_more_newer:
            continue
        if client.get_workflow_run(run_id).is_terminal:
            return
        if deadline is not None and time.monotonic() > deadline:
            return
        time.sleep(0.2)


@runs_app.command("list")
def runs_list(
    app_path: AppOption,
    status: Annotated[str | None, typer.Option("--status")] = None,
    workflow_name: Annotated[str | None, typer.Option("--workflow")] = None,
    limit: Annotated[int, typer.Option("--limit")] = 50,
    cursor: Annotated[str | None, typer.Option("--cursor")] = None,
    namespace: NamespaceOption = None,
    as_json: JsonOption = False,
) -> None:
    """List runs, newest first."""
    page = guarded(
        lambda: client_for(app_path, namespace).list_workflow_runs(
            status=status, workflow=workflow_name, limit=limit, cursor=cursor
        )
    )
    if as_json:
        out.print_json(json.dumps({"runs": [r.to_dict() for r in page.runs], "next_cursor": page.next_cursor}))
        return
    table = Table("run", "workflow", "status", "attempt", "phase", "created")
    for envelope in page.runs:
        created = envelope.created_at.isoformat(timespec="seconds") if envelope.created_at else ""
        table.add_row(
            envelope.run_id, envelope.workflow, envelope.status, str(envelope.attempt),
            str(envelope.snapshot.get("phase") or ""), created,
        )
    out.print(table)
    if page.next_cursor:
        out.print(f"next page: --cursor {page.next_cursor}")


@runs_app.command("show")
def runs_show(
    run_id: Annotated[str, typer.Argument(metavar="RUN")],
    app_path: AppOption,
    namespace: NamespaceOption = None,
    as_json: JsonOption = False,
) -> None:
    """Show a run's envelope, phases and steps."""
    detail = guarded(lambda: client_for(app_path, namespace).get_workflow_run_detail(run_id))
    if as_json:
        data: dict[str, Any] = {
            "run": detail.run.to_dict(),
            "phases": [
                {"phase_id": p.phase_id, "title": p.title, "detail": p.detail, "state": p.state} for p in detail.phases
            ],
            "steps": [{"key": s.key, "status": s.status, "attempt": s.attempt, "error": s.error} for s in detail.steps],
            "progress": [r.to_dict() for r in detail.progress],
        }
        out.print_json(json.dumps(data))
        return
    print_envelope(detail.run, False)
    phases = Table("phase", "title", "state")
    for phase in detail.phases:
        phases.add_row(phase.phase_id, phase.title, phase.state)
    out.print(phases)


@runs_app.command("progress")
def runs_progress(
    run_id: Annotated[str, typer.Argument(metavar="RUN")],
    app_path: AppOption,
    follow: Annotated[bool, typer.Option("--follow", "-f")] = False,
    namespace: NamespaceOption = None,
    as_json: JsonOption = False,
) -> None:
    """Print a run's progress records."""
    client = guarded(lambda: client_for(app_path, namespace))
    if follow and not as_json:
        guarded(lambda: follow_progress(client, run_id, None))
        return
    page = guarded(lambda: client.get_workflow_run_progress(run_id, limit=500))
    if as_json:
        out.print_json(json.dumps({"records": [r.to_dict() for r in page.records], "revision": page.revision}))
        return
    for record in page.records:
        out.print(f"{record.seq:>4} {record.kind:<6} {record.message}", highlight=False, markup=False)


@runs_app.command("cancel")
def runs_cancel(
    run_id: Annotated[str, typer.Argument(metavar="RUN")],
    app_path: AppOption,
    namespace: NamespaceOption = None,
    as_json: JsonOption = False,
) -> None:
    """Cancel a run and wait until it has settled."""
    print_envelope(guarded(lambda: client_for(app_path, namespace).cancel_workflow_run(run_id)), as_json)


@runs_app.command("resume")
def runs_resume(
    run_id: Annotated[str, typer.Argument(metavar="RUN")],
    app_path: AppOption,
    force: Annotated[bool, typer.Option("--force")] = False,
    allow_code_change: Annotated[bool, typer.Option("--allow-code-change")] = False,
    timeout: Annotated[float | None, typer.Option("--timeout")] = None,
    namespace: NamespaceOption = None,
    as_json: JsonOption = False,
) -> None:
    """Resume a run with a new attempt and wait until it settles."""
    envelope = guarded(
        lambda: client_for(app_path, namespace).resume_workflow(
            run_id, force=force, allow_code_change=allow_code_change, timeout=timeout
        )
    )
    print_envelope(envelope, as_json)


def main() -> None:
    app()
