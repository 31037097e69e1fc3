"""Top-level commands: ``run`` a workflow, start a ``worker``, start ``flower``."""

from __future__ import annotations

import importlib.util
import os
from typing import Annotated

import typer
from rich.table import Table

from celery_durable import RunEnvelope, telemetry
from celery_durable.cli.common import (
    EXIT_FAILED,
    EXIT_USAGE,
    EXIT_WAITING,
    AppOption,
    JsonOption,
    NamespaceOption,
    TimeoutOption,
    app,
    client_for,
    err,
    fail,
    guarded,
    load_engine,
    out,
    parse_json_option,
    print_json,
    print_json_line,
)
from celery_durable.cli.follow import follow_run, view_for
from celery_durable.cli.local import require_reachable_redis, standalone
from celery_durable.cli.render import print_envelope, waiting_text, when
from celery_durable.client.fleet_registry import mixed_deploys
from celery_durable.local.exposure import ExposureError, refuse_exposure


@app.command()
def run(
    workflow_name: Annotated[str, typer.Argument(metavar="WORKFLOW", help="A registered workflow's name.")],
    app_path: AppOption,
    args: Annotated[str, typer.Option("--args", help="JSON arguments of the run.")] = "{}",
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="Show a bar per phase and the latest progress until it settles.")
    ] = False,
    idempotency_key: Annotated[str | None, typer.Option("--idempotency-key", help="Start once per key.")] = None,
    timeout: TimeoutOption = None,
    namespace: NamespaceOption = None,
    as_json: JsonOption = False,
) -> None:
    """Start a run and wait until it settles; exit 0 only if it completed.

    Exit codes: 0 completed; 1 it settled otherwise, or --timeout ran out
    while it was busy; 3 --timeout ran out while it waits healthily, for a
    signal, a timer or a child run (it goes on: 'runs start' returns at
    once). With --follow it says what the run waits for when it begins to.

    A W3C traceparent in the TRACEPARENT variable (a CI job's trace, say) is
    recorded with the run, so its spans join that trace.
    """
    telemetry.carry_traceparent(os.environ.get("TRACEPARENT"), "the TRACEPARENT variable")

    def body() -> RunEnvelope:
        parsed = parse_json_option("--args", args)
        client = client_for(app_path, namespace)
        run_id = client.start_workflow(workflow_name, args=parsed, idempotency_key=idempotency_key)
        try:
            if follow:
                return follow_run(client, run_id, view_for(out, as_json), after_seq=0, timeout=timeout)
            return client.wait_for_workflow_run(run_id, timeout=timeout)
        except TimeoutError:
            current = client.get_workflow_run(run_id)
            if waits_healthily(current):
                return current  # not a failure: the run is parked until its event comes
            raise

    with standalone(app_path) as alone:  # nothing configured: a private Redis and a worker
        envelope = guarded(body)
    waiting = waits_healthily(envelope)
    if as_json and waiting and follow:
        print_json_line({"type": "run", "run": envelope.to_dict()})  # the stream's last line, as when it settles
    elif as_json and not follow:
        print_json(envelope.to_dict())
    elif not follow:
        print_envelope(out, envelope)
    if waiting:
        # A line for people; a script reads the exit code (and --json's envelope on stdout).
        goes_on = (
            "it goes on once a worker runs: the next `celery-durable run` in this directory starts one"
            if alone
            else "it goes on"
        )
        (err if as_json else out).print(
            f"run {envelope.run_id} is waiting for {waiting_text(envelope)} after {timeout or 0:g}s; {goes_on} "
            f"(celery-durable runs show {envelope.run_id})",
            markup=False,
            soft_wrap=True,
        )
        raise typer.Exit(EXIT_WAITING)
    if envelope.status != "completed":
        raise typer.Exit(EXIT_FAILED)


def waits_healthily(envelope: RunEnvelope) -> bool:
    """Running and parked on a wait (a signal, a timer, a child): nothing is wrong, it waits."""
    return envelope.status == "running" and bool(envelope.snapshot.get("waiting_for"))


@app.command()
def worker(
    app_path: AppOption,
    queues: Annotated[str | None, typer.Option("--queues", "-Q", help="Comma-separated queues; default all.")] = None,
    concurrency: Annotated[int | None, typer.Option("--concurrency", "-c", help="Worker slots.")] = None,
    pool: Annotated[str | None, typer.Option("--pool", "-P", help="prefork, threads or solo.")] = None,
    loglevel: Annotated[str, typer.Option("--loglevel", "-l")] = "INFO",
    hostname: Annotated[str | None, typer.Option("--hostname", help="Node name, e.g. 'steps1@%h'.")] = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No start-up banner.")] = False,
    metrics_port: Annotated[
        int | None, typer.Option("--metrics-port", help="Serve Prometheus metrics on this port (docs/telemetry.md).")
    ] = None,
    metrics_address: Annotated[
        str,
        typer.Option(
            "--metrics-address",
            help="Interface the metrics port listens on (default loopback: the port has no auth; "
            "0.0.0.0 for a scraper on another host).",
        ),
    ] = "127.0.0.1",
) -> None:
    """Start a Celery worker for the engine's workflows.

    It consumes the coordinator, steps and agents queues and the app's
    default one (or those of -Q), and under the threads or solo pool its own
    home queue too, with the engine's durability settings (JSON only, late acks, prefetch 1)
    and sends task events, so Flower shows its tasks as they run. With
    --metrics-port it serves Prometheus metrics, added up over its pool's
    processes.
    """
    require_reachable_redis()
    if metrics_port is not None:
        # Before the app is loaded: every metric made from here on counts in the multiprocess directory.
        _serve_metrics(metrics_port, metrics_address)
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


def _serve_metrics(port: int, address: str) -> None:
    if not 0 < port < 65536:
        raise fail(f"--metrics-port must be from 1 to 65535, got {port}", exit_code=EXIT_USAGE)
    from celery_durable.telemetry.exposition import MetricsPortError, serve_worker_metrics

    try:
        serve_worker_metrics(port, address)
    except MetricsPortError as exc:
        raise fail(str(exc), exit_code=EXIT_USAGE) from None
    host = f"[{address}]" if ":" in address else address
    err.print(f"Prometheus metrics on http://{host}:{port}/metrics", markup=False)


@app.command()
def flower(
    app_path: AppOption,
    port: Annotated[int, typer.Option("--port", help="HTTP port.")] = 5555,
    address: Annotated[
        str, typer.Option("--address", help="Interface to listen on; anything but loopback needs --basic-auth.")
    ] = "127.0.0.1",
    basic_auth: Annotated[
        str | None,
        typer.Option(
            "--basic-auth",
            envvar="FLOWER_BASIC_AUTH",
            help="'user:password' (several: comma-separated). Prefer the FLOWER_BASIC_AUTH variable.",
            show_envvar=True,
        ),
    ] = None,
    url_prefix: Annotated[str | None, typer.Option("--url-prefix", help="Serve under this path.")] = None,
) -> None:
    """Start Flower on the engine's broker, to follow runs' tasks in a browser.

    Task names say what a task is (celery_durable.coordinator, .branch,
    .agent) and their kwargs name the run, epoch and fan-out call.
    """
    try:
        # Before the engine is loaded, as for `web`: Flower can revoke tasks and
        # shut workers down, so an exposed one without a credential never starts.
        refuse_exposure(address, has_credential=bool(basic_auth), option="--basic-auth", env="FLOWER_BASIC_AUTH")
    except ExposureError as exc:
        raise fail(str(exc), exit_code=EXIT_USAGE) from None
    if importlib.util.find_spec("flower") is None:  # the `flower` extra: one command's dependency
        raise fail("Flower is not installed: pip install 'celery-durable[flower]'", exit_code=EXIT_USAGE)
    engine = guarded(lambda: load_engine(app_path))
    if basic_auth is not None:
        pairs = [pair.partition(":") for pair in basic_auth.split(",")]
        if not all(user and sep and password for user, sep, password in pairs):
            raise fail("--basic-auth must be 'user:password' (comma-separated for several)", exit_code=EXIT_USAGE)
        # Handed over in Flower's own variable, so it never shows in a process list.
        os.environ["FLOWER_BASIC_AUTH"] = basic_auth
    if not 0 < port < 65536:
        raise fail(f"--port must be from 1 to 65535, got {port}", exit_code=EXIT_USAGE)
    argv = ["flower", f"--port={port}", f"--address={address}"]
    if url_prefix:
        argv.append(f"--url_prefix={url_prefix}")
    code = engine.celery.start(argv)
    if code:
        raise typer.Exit(code if isinstance(code, int) else EXIT_USAGE)


@app.command()
def fleet(app_path: AppOption, namespace: NamespaceOption = None, as_json: JsonOption = False) -> None:
    """List the workers as they report themselves with their beats: alive or
    not, their queues, the workflows each serves with its code hash; a
    workflow live workers serve with two code hashes is named a mixed deploy."""
    client = guarded(lambda: client_for(app_path, namespace))
    workers = guarded(client.list_workers)
    mixed = mixed_deploys(workers)
    if as_json:
        print_json(
            {
                "workers": [worker.to_dict() for worker in workers],
                "mixed_deploys": [{"workflow": m.workflow, "code_hashes": m.hashes} for m in mixed],
            }
        )
        return
    if not workers:
        out.print("No worker has reported: start one with celery-durable worker", markup=False)
        return
    table = Table(show_edge=False, pad_edge=False, box=None)
    for name in ("worker", "state", "last beat", "queues", "workflow", "code hash"):
        table.add_column(name, overflow="fold")
    for worker in workers:
        served = sorted(worker.workflows.items()) or [("", "")]
        for i, (workflow, code_hash) in enumerate(served):
            first = i == 0
            table.add_row(
                worker.name if first else "",
                ("alive" if worker.alive else "silent") if first else "",
                when(worker.last_beat) if first else "",
                ", ".join(worker.queues) if first else "",
                workflow,
                code_hash[:12],
            )
    out.print(table)
    for deploy in mixed:
        out.print(deploy.describe(), style="bold red", markup=False)
