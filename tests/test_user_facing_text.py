"""What a user reads speaks to the user: it says what a thing does, never
which section of the project's specification asks for it ("SPEC §11") nor
where the project came from ("the seed's trip"). Code comments may cite the
specification for engineers; the help of every command, the README, the
docs, the demo's banner, the web view's templates and the settings'
descriptions may not."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import typer
from rich.console import Console
from typer.testing import CliRunner

from celery_durable import Settings
from celery_durable.cli import app
from celery_durable.demo.view import intro
from tests.support.fleet import ROOT

FOR_ENGINEERS = re.compile(r"SPEC ?§|\bthe seed\b|\bseed's\b", re.IGNORECASE)


def found(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if FOR_ENGINEERS.search(line)]


def command_paths(command: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    yield path
    for name, sub in sorted(getattr(command, "commands", {}).items()):
        yield from command_paths(sub, (*path, name))


COMMANDS = list(command_paths(typer.main.get_command(app)))


def test_the_walk_reaches_every_command() -> None:
    """The help checked below is every command's: the groups and their commands."""
    assert {("runs", "start"), ("schedules",), ("throttles",), ("demo",), ("web",), ("worker",)} <= set(COMMANDS)
    assert len(COMMANDS) > 30


@pytest.mark.parametrize("path", COMMANDS, ids=lambda path: " ".join(path) or "celery-durable")
def test_the_help_of_every_command_speaks_to_users(path: tuple[str, ...]) -> None:
    result = CliRunner().invoke(app, [*path, "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "Usage" in result.output
    assert found(result.output) == []


def documents() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


@pytest.mark.parametrize("document", documents(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_the_readme_and_the_docs_speak_to_users(document: Path) -> None:
    assert found(document.read_text(encoding="utf-8")) == []


def test_the_web_views_pages_speak_to_users() -> None:
    web = ROOT / "celery_durable" / "web"
    pages = sorted(p for p in (web / "templates").rglob("*") if p.is_file())
    pages += sorted(p for p in (web / "static").rglob("*") if p.suffix in (".js", ".css", ".html"))
    assert pages, "the web view has templates"
    assert {p.as_posix(): found(p.read_text(encoding="utf-8")) for p in pages} == {p.as_posix(): [] for p in pages}


def test_the_demos_banner_speaks_to_users() -> None:
    console = Console(width=200, record=True)
    console.print(intro("a private redis-server", Settings(), 3))
    banner = console.export_text()
    assert "trip" in banner
    assert found(banner) == []


def test_the_settings_descriptions_speak_to_users() -> None:
    descriptions = {name: field.description or "" for name, field in Settings.model_fields.items()}
    assert {name: found(text) for name, text in descriptions.items() if found(text)} == {}
