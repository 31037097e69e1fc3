"""What every command shares: the Typer apps, options, engine loading, and
the one place where errors become one line and an exit code.

Exit codes: 0 done (and, for commands that wait, the run completed); 1 the
run settled otherwise, or the operation failed (the line says why, with the
error's stable code); 2 the command line is wrong, or asks for something not
available yet; 3 ``run --timeout`` ran out while the run waits healthily (for
a signal, a timer or a child run: it goes on, and nothing failed); 130
interrupted by Ctrl-C (the run goes on).
"""

from __future__ import annotations

import atexit
import contextlib
import importlib
import json
import os
import sys
from collections.abc import Callable
from typing import Annotated, Any, TypeVar

import pydantic
import typer
from rich.console import Console

from celery_durable import DurableError, Engine
from celery_durable.cli import results
from celery_durable.client.client import Client
from celery_durable.local import embedded

app = typer.Typer(
    no_args_is_help=True,
    add_completion=False,
    help="Durable workflows on Celery and Redis.",
    # A bug still shows a traceback, but never the values of locals.
    pretty_exceptions_show_locals=False,
)
runs_app = typer.Typer(no_args_is_help=True, help="Inspect and steer runs.")
app.add_typer(runs_app, name="runs")

out = Console(highlight=False)
# Soft wrap: an error is one line however long, never folded by Rich.
err = Console(stderr=True, highlight=False, soft_wrap=True)
if not out.is_terminal and "COLUMNS" not in os.environ:
    # Rich assumes 80 columns off a terminal; tables of 32-character run ids
    # piped to a file or a log would fold into unreadable cells.
    out.width = 160
T = TypeVar("T")

EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_WAITING = 3
EXIT_INTERRUPTED = 130

AppOption = Annotated[
    str,
    typer.Option("--app", "-A", envvar="CELERY_DURABLE_APP", help="The engine, as 'package.module:attribute'."),
]
JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON for scripts (JSON lines when following).")]
NamespaceOption = Annotated[
    str | None,
    typer.Option("--namespace", "-n", envvar="CELERY_DURABLE_NAMESPACE", help="Namespace of the runs."),
]
TimeoutOption = Annotated[float | None, typer.Option("--timeout", help="Seconds to wait at most.")]
FollowOption = Annotated[bool, typer.Option("--follow", "-f", help="Go on until the run settles.")]
RunArgument = Annotated[str, typer.Argument(metavar="RUN", help="A run id.")]


class UserError(Exception):
    """A mistake on the command line: shown as one line, exit code 2."""


LOCAL_REDIS = contextlib.ExitStack()
"""The private Redis a command started (``use_stored_runs``): stopped as the process exits, SIGTERM included."""
atexit.register(LOCAL_REDIS.close)


def use_stored_runs() -> None:
    """SPEC §10's embedded Redis for every command: with nothing configured and
    nothing on localhost:6379, the runs a ``run`` left in this directory
    (``./.celery-durable/redis``) are where the command looks, in that private
    redis-server, the one running already or one started until the command
    ends. Without such a directory nothing is started: there are no runs."""
    if not embedded.needs_embedded() or not embedded.DATA_DIR.exists():
        return
    try:
        choice = LOCAL_REDIS.enter_context(embedded.redis_for_cli())
    except embedded.EmbeddedRedisError as exc:
        raise UserError(str(exc)) from None
    err.print(f"• no Redis configured and none on localhost:6379: using {choice.describe()}", style="dim", markup=False)


def load_engine(path: str) -> Engine:
    """Import ``package.module:attribute`` named on the command line (never from a message)."""
    module_name, _, attribute = path.partition(":")
    if not module_name or not attribute:
        raise UserError(f"--app must look like 'package.module:attribute', got {path!r}")
    use_stored_runs()
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    results.divert(out)  # whatever the module prints, now or later, is not the command's result
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise UserError(f"cannot import {module_name!r}: {exc}") from None
    except Exception as exc:  # the module's own code failed (a bad setting, a bug): still one line
        raise UserError(f"importing {module_name!r} failed: {one_line(exc)}") from None
    target = getattr(module, attribute, None)
    if target is None:
        raise UserError(f"{module_name!r} has no attribute {attribute!r}")
    if callable(target) and not isinstance(target, Engine):
        try:
            target = target()
        except Exception as exc:
            raise UserError(f"{path}() failed: {one_line(exc)}") from None
    if not isinstance(target, Engine):
        raise UserError(f"{path} is not a celery_durable.Engine")
    return target


def client_for(app_path: str, namespace: str | None) -> Client:
    return load_engine(app_path).client(namespace)


def on_client(app_path: str, namespace: str | None, action: Callable[[Client], T]) -> T:
    """One guarded call on the namespace's client: what most commands are."""
    return guarded(lambda: action(client_for(app_path, namespace)))


def emit(as_json: bool, data: Any, text: str) -> None:
    """A command's result: ``data`` as JSON with --json, else ``text`` as one plain line."""
    if as_json:
        print_json(data)
    else:
        out.print(text, markup=False)


def fail(message: str, code: str | None = None, exit_code: int = EXIT_FAILED) -> typer.Exit:
    """Print one error line; the caller raises the returned ``Exit``."""
    prefix = f"error [{code}]" if code else "error"
    err.print(f"{prefix}: {message}", markup=False)
    return typer.Exit(exit_code)


def one_line(exc: BaseException) -> str:
    """An error as the one line the CLI prints: a settings error (pydantic's
    report spans lines, with a link per problem) says each setting and its
    problem; anything else, its type where its text does not say it."""
    if isinstance(exc, pydantic.ValidationError):
        problems = "; ".join(
            f"{'.'.join(str(part) for part in error['loc']) or exc.title}: {error['msg']}" for error in exc.errors()
        )
        return f"invalid {exc.title}: {problems}"
    if isinstance(exc, DurableError | ValueError | LookupError | TimeoutError):
        return " ".join(str(exc).split())
    return f"{type(exc).__name__}: {' '.join(str(exc).split())}"


def guarded(action: Callable[[], T]) -> T:
    """Run a command body; user-facing errors become one line and an exit code."""
    try:
        return action()
    except UserError as exc:
        raise fail(str(exc), exit_code=EXIT_USAGE) from None
    except (DurableError, ValueError, LookupError, TimeoutError) as exc:
        raise fail(one_line(exc), getattr(exc, "code", None)) from None
    except KeyboardInterrupt:
        raise fail("interrupted; runs go on", exit_code=EXIT_INTERRUPTED) from None


def parse_json_option(name: str, text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise UserError(f"{name} is not JSON: {exc}") from None


def print_json(data: Any) -> None:
    """One JSON document on stdout, untouched by Rich (no wrapping, no colour)."""
    stream = results.stream()
    stream.write(json.dumps(data, indent=2) + "\n")
    stream.flush()


def print_json_line(data: Any) -> None:
    """One compact JSON object per line: what ``--json --follow`` streams."""
    stream = results.stream()
    stream.write(json.dumps(data, separators=(",", ":")) + "\n")
    stream.flush()
