"""The ``celery-durable`` command: in the test's process through Typer's
runner (``cli``), or as a person runs it (``cli_process``)."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

from typer.testing import CliRunner

from celery_durable import Settings
from celery_durable.cli import app
from tests.support.fleet import ROOT, settings_env

APP = "tests.support.apps.phased:make_engine"
"""In this process: the engine is built when the command runs, from the test's environment."""


def env_of(settings: Settings) -> dict[str, str]:
    return {name: value for name, value in settings_env(settings).items() if name.startswith("CELERY_DURABLE_")}


def cli(settings: Settings, *args: str) -> Any:
    """The command in this process, through Typer's runner."""
    return CliRunner().invoke(app, list(args), env=env_of(settings))


def cli_process(
    settings: Settings, *args: str, timeout: float = 60, columns: int = 100
) -> subprocess.CompletedProcess[str]:
    """The command as a person runs it, in a terminal ``columns`` wide, stdout and stderr apart."""
    return subprocess.run(
        [sys.executable, "-m", "celery_durable", *args],
        env={**settings_env(settings), "COLUMNS": str(columns)},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
