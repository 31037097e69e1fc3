"""``celery-durable web``: serve the web view of a namespace's runs.

The web stack is an optional extra, imported only when this command runs,
so the rest of the CLI (and every worker) starts without it.
"""

from __future__ import annotations

from typing import Annotated

import typer

from celery_durable.cli.common import EXIT_USAGE, AppOption, NamespaceOption, app, fail, guarded, load_engine

AUTH_ENV = "CELERY_DURABLE_WEB_AUTH"
WEB_MODULES = frozenset({"starlette", "uvicorn", "jinja2", "markupsafe", "anyio"})


@app.command()
def web(
    app_path: AppOption,
    host: Annotated[str, typer.Option("--host", help="Address to listen on; anything but loopback needs --auth.")] = (
        "127.0.0.1"
    ),
    port: Annotated[int, typer.Option("--port", help="HTTP port.")] = 8080,
    allowed_hosts: Annotated[
        list[str] | None,
        typer.Option(
            "--allowed-host",
            help="A Host name clients reach the server by, besides --host's (repeatable); any other gets 400.",
        ),
    ] = None,
    auth: Annotated[
        str | None,
        typer.Option(
            "--auth",
            envvar=AUTH_ENV,
            show_envvar=True,
            help="'user:password' for HTTP Basic on every page. Prefer the variable: a process list shows options.",
        ),
    ] = None,
    read_only: Annotated[bool, typer.Option("--read-only", help="Show runs; hide the actions and refuse POSTs.")] = (
        False
    ),
    flower_url: Annotated[
        str | None, typer.Option("--flower-url", help="Flower's address, to link runs and agent tasks to it.")
    ] = None,
    namespace: NamespaceOption = None,
) -> None:
    """Serve a page of runs and a page per run, with live progress and the operator's actions."""
    try:
        from celery_durable.web import Credential, build_server, check_exposure, served_hosts
    except ImportError as exc:
        if (exc.name or "").partition(".")[0] not in WEB_MODULES:
            raise
        raise fail(
            f"the web view needs its extra: pip install 'celery-durable[web]' ({exc.name} is missing)",
            exit_code=EXIT_USAGE,
        ) from None
    if not 0 < port < 65536:
        raise fail(f"--port must be from 1 to 65535, got {port}", exit_code=EXIT_USAGE)
    try:
        credential = Credential.parse(auth) if auth else None
        # Before the engine is loaded: an exposed server without a credential never starts.
        check_exposure(host, credential)
    except ValueError as exc:  # ExposureError is one
        raise fail(str(exc) if auth is None else f"--auth / {AUTH_ENV}: {exc}", exit_code=EXIT_USAGE) from None
    try:
        served_hosts(host, allowed_hosts or ())  # a malformed name is refused before the engine loads
    except ValueError as exc:
        raise fail(str(exc), exit_code=EXIT_USAGE) from None
    engine = guarded(lambda: load_engine(app_path))
    try:
        server = build_server(
            engine,
            host=host,
            port=port,
            namespace=namespace,
            read_only=read_only,
            auth=credential,
            flower_url=flower_url,
            allowed_hosts=allowed_hosts or (),
        )
    except ValueError as exc:  # a bad --flower-url or --namespace
        raise fail(str(exc), exit_code=EXIT_USAGE) from None
    server.run()
