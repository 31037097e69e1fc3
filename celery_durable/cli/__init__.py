"""The ``celery-durable`` command: a thin layer over the public client.

``common`` holds the apps, options and error handling; ``commands`` the
top-level commands (run, worker, flower); ``runs`` the ``runs`` group,
``runs history`` included; ``schedules`` the ``schedules`` group;
``versioning`` the replay check and history export;
``follow`` the live view of ``--follow``; ``render`` tables and lines.
"""

from __future__ import annotations

import sys
from typing import Any

import typer

from celery_durable.cli import commands, demo, results, runs, schedules, throttles, versioning, web
from celery_durable.cli.common import EXIT_INTERRUPTED, EXIT_USAGE, app, err, load_engine

__all__ = ["app", "load_engine", "main"]

# Imported for the commands they register on ``app``.
_COMMAND_MODULES = (commands, demo, runs, schedules, throttles, versioning, web)

# Recent Typer vendors its own copy of Click, older Typer uses Click itself:
# take Click's exception classes from wherever Typer's come from.
_CLICK_ERRORS = sys.modules[typer.BadParameter.__module__]
_NO_ARGS: Any = getattr(_CLICK_ERRORS, "NoArgsIsHelpError", ())
_USAGE: Any = _CLICK_ERRORS.UsageError
_CLICK: Any = _CLICK_ERRORS.ClickException


def main() -> None:
    """Run the command; a usage error is one line too, not Click's panel."""
    command: Any = typer.main.get_command(app)
    results.enable()  # this process's stdout carries the command's results alone
    try:
        code = command.main(prog_name="celery-durable", standalone_mode=False)
    except _NO_ARGS as exc:
        typer.echo(exc.ctx.get_help() if exc.ctx else "")
        code = EXIT_USAGE
    except _USAGE as exc:
        where = exc.ctx.command_path if exc.ctx else "celery-durable"
        err.print(f"error: {exc.format_message()} (see '{where} --help')", markup=False)
        code = EXIT_USAGE
    except _CLICK as exc:
        err.print(f"error: {exc.format_message()}", markup=False)
        code = exc.exit_code
    except typer.Abort:
        err.print("error: interrupted; runs go on", markup=False)
        code = EXIT_INTERRUPTED
    results.flush()
    sys.exit(code if isinstance(code, int) else 0)
