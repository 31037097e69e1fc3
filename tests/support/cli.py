"""The ``celery-durable`` command in the test's process, through Typer's runner."""

from __future__ import annotations

from typing import Any

from typer.testing import CliRunner

from celery_durable import Settings
from celery_durable.cli import app
from tests.support.fleet import settings_env

APP = "tests.support.apps.phased:make_engine"
"""In this process: the engine is built when the command runs, from the test's environment."""


def env_of(settings: Settings) -> dict[str, str]:
    return {name: value for name, value in settings_env(settings).items() if name.startswith("CELERY_DURABLE_")}


def cli(settings: Settings, *args: str) -> Any:
    """The command in this process, through Typer's runner."""
    return CliRunner().invoke(app, list(args), env=env_of(settings))
