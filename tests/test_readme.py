"""Every code block in the README is run, or checked where it cannot run here.

- ``python`` blocks run in order in one namespace, as a reader would paste
  them into one session, on the session's real Redis. Whenever a block
  creates an ``Engine``, a worker for it starts (in this process), as the
  reader is told to start one beside their code.
- The command-line block runs line by line against a running setup: the
  ``worker`` and ``flower`` lines start real processes (Flower on a free
  port instead of 5555), the others run to the end and must exit 0, with
  ``RUN_ID`` replaced by the run the ``run`` line started.
- The examples block runs in ``tests/test_examples.py``, on a fresh
  machine's terms (a private Redis the command starts itself).
- The two quickstart commands: their install part is what ``.ci/run`` runs
  in a new virtualenv; ``celery-durable demo`` runs in ``tests/test_demo.py``
  and ``pytest -q`` is CI itself.
- The tuning block's worker lines go through the CLI's parser with
  ``--help`` appended (Click rejects an unknown option before it prints
  help). The deployment block's ``docker compose`` lines are checked against
  docker-compose.yml (services, the Flower password); there is no Docker
  engine to run them.
- The ``text`` block is a transcript: it must match the one
  ``tests/test_cli.py`` compares with real output.
"""

from __future__ import annotations

import ast
import base64
import contextlib
import os
import re
import shlex
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from celery_durable import Engine, Settings
from celery_durable.cli import app
from celery_durable.local.redis_server import free_port
from tests.conftest import worker_thread
from tests.support.fleet import ROOT, settings_env
from tests.support.poll import START_BOUND, poll
from tests.support.readme import DEMO, README, Block, blocks, in_section, readme_example_lines

QUICKSTART = "python3 -m venv .venv && .venv/bin/pip install -e '.[dev]' && "
RUN_ID = re.compile(r"\b[0-9a-f]{32}\b")


def test_every_block_is_claimed_by_a_test() -> None:
    claimed = {
        "Two commands": "bash",
        "Define a workflow": "python",
        "Run it": "python",
        "Testing your workflows": "python",
        "Using your Celery tasks": "python",
        "Agents and limits": "python",
        "The determinism rules": "python",
        "Examples": "bash",
        "Command line": "bash|text",
        "The web view": "bash",  # tests/web/test_cli.py
        "Deployment": "bash",
        "Tuning": "bash",
    }
    for block in blocks():
        assert block.lang in claimed.get(block.section, "").split("|"), (
            f"README line {block.line}: a {block.lang or 'plain'} block in '{block.section}' that no test runs"
        )


# --- python -----------------------------------------------------------------------------


@pytest.fixture
def readme_env(settings: Settings, monkeypatch: pytest.MonkeyPatch) -> Settings:
    """The test's Redis, key prefix and queues, as CELERY_DURABLE_* variables for ``Engine()``."""
    for name, value in settings_env(settings).items():
        if name.startswith("CELERY_DURABLE_"):
            monkeypatch.setenv(name, value)
    return settings


def test_the_python_blocks_run_in_order(readme_env: Settings) -> None:
    """Each ``Engine`` a block builds gets a worker -- and the one before it
    is stopped first: they share the queues of the environment, and a worker
    that does not know a run's workflow would pass its messages on (in one
    process, Celery's worker even runs tasks through the current app, not its
    own), as the README's own deployment never does."""
    namespace: dict[str, Any] = {"__name__": "readme"}
    served: set[int] = set()
    with contextlib.ExitStack() as current:
        for block in (b for b in blocks() if b.lang == "python"):
            for statement in ast.parse(block.code).body:
                code = compile(ast.Module([statement], []), f"README.md:{block.line}", "exec")
                exec(code, namespace)
                for value in list(namespace.values()):
                    if isinstance(value, Engine) and id(value) not in served:
                        served.add(id(value))
                        current.close()
                        current.enter_context(worker_thread(value))
    assert "tour_trip" in namespace and "broken" in namespace


# --- the command line --------------------------------------------------------------------


class Background:
    """Long-running commands of a block, stopped when the block is done."""

    def __init__(self) -> None:
        self.processes: list[subprocess.Popen[bytes]] = []

    def start(self, argv: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
        handle = open(log, "ab")  # noqa: SIM115 - the process writes to it until stopped
        process = subprocess.Popen(
            [sys.executable, "-m", "celery_durable", *argv],
            env=env, cwd=ROOT, stdout=handle, stderr=handle, start_new_session=True,
        )
        handle.close()
        self.processes.append(process)
        return process

    def stop(self) -> None:
        for process in self.processes:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, 9)
            process.wait(timeout=10)


@pytest.fixture
def background() -> Iterator[Background]:
    group = Background()
    yield group
    group.stop()


def wait_for_flower(port: int, auth: str) -> None:
    token = base64.b64encode(auth.encode()).decode()

    def asks_for_the_password() -> bool:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/api/workers", timeout=2)
        except urllib.error.HTTPError as exc:
            assert exc.code == 401, exc.code  # up, and asking for the password
            return True
        raise AssertionError("Flower answered without basic auth")

    poll(asks_for_the_password, within=START_BOUND, what="Flower to answer", every=0.2, ignoring=(OSError,))
    request = urllib.request.Request(f"http://127.0.0.1:{port}/api/workers")
    request.add_header("Authorization", f"Basic {token}")
    with urllib.request.urlopen(request, timeout=10) as response:
        assert response.status == 200


def command_lines(block: Block) -> list[list[str]]:
    return [shlex.split(line, comments=True) for line in block.lines]


def test_the_command_line_block_runs_against_a_running_setup(
    settings: Settings, background: Background, tmp_path: Path
) -> None:
    (block,) = in_section("Command line")
    env = {**settings_env(settings), "COLUMNS": "120", "FLOWER_BASIC_AUTH": "reader:s3cret"}
    run_id = None
    for argv in command_lines(block):
        if argv[0] == "export":
            name, _, value = argv[1].partition("=")
            env[name] = value
            continue
        assert argv[0] == "celery-durable", argv
        args = [run_id if arg == "RUN_ID" and run_id else arg for arg in argv[1:]]
        if args[0] == "worker":
            background.start(args, env, tmp_path / "worker.log")
        elif args[0] == "flower":
            port = free_port()
            background.start([*args[:-1], str(port)] if args[-2] == "--port" else args, env, tmp_path / "flower.log")
            wait_for_flower(port, env["FLOWER_BASIC_AUTH"])
        else:
            done = subprocess.run(
                [sys.executable, "-m", "celery_durable", *args],
                env=env, cwd=ROOT, capture_output=True, text=True, timeout=90,
            )
            assert done.returncode == 0, (argv, done.stdout, done.stderr)
            if args[0] == "run":
                run_id = RUN_ID.findall(done.stdout)[0]
                assert "■ completed" in done.stdout
            if args[:2] == ["runs", "list"]:
                assert run_id is not None and run_id in done.stdout
    assert run_id is not None


def test_the_transcript_is_what_follow_prints() -> None:
    (block,) = [b for b in blocks() if b.lang == "text"]
    recorded = (ROOT / "tests" / "transcripts" / "run_follow.txt").read_text(encoding="utf-8").splitlines()
    shown = [
        re.sub(r"\b\d+\.\d+s\b", "<T>", RUN_ID.sub("<RUN>", line)) for line in block.lines if line != "..."
    ]
    position = 0
    for line in shown:
        assert line in recorded[position:], line
        position = recorded.index(line, position) + 1


# --- quickstart, examples, tuning, deployment ----------------------------------------------


def test_the_quickstart_installs_as_ci_does_and_runs_what_the_tests_run() -> None:
    commands = [block.code.strip() for block in in_section("Two commands")]
    assert commands == [QUICKSTART + ".venv/bin/celery-durable demo", QUICKSTART + ".venv/bin/pytest -q"]
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert "python3 -m venv .venv" in ci
    assert re.search(r"\.venv/bin/pip install .*-e '\.\[dev\]'", ci)
    assert re.search(r"^\.venv/bin/pytest -q$", ci, re.MULTILINE)
    assert DEMO == ["demo"], "tests/test_demo.py runs `celery-durable demo` exactly as the README says"


def test_the_examples_block_is_what_test_examples_runs() -> None:
    (block,) = in_section("Examples")
    assert [argv for argv in command_lines(block)] == readme_example_lines()


def test_the_tuning_workers_are_valid_commands() -> None:
    (block,) = in_section("Tuning")
    queues = {Settings().coordinator_queue, Settings().steps_queue, Settings().agents_queue}
    for argv in command_lines(block):
        assert argv[:2] == ["celery-durable", "worker"], argv
        result = CliRunner().invoke(app, [*argv[1:], "--help"])
        assert result.exit_code == 0, (argv, result.output)
        assert argv[argv.index("-Q") + 1] in queues


def test_the_deployment_block_matches_the_compose_file() -> None:
    (block,) = in_section("Deployment")
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text(encoding="utf-8"))
    env: dict[str, str] = {}
    for argv in command_lines(block):
        if argv[0] == "export":
            name, _, value = argv[1].partition("=")
            env[name] = value
            continue
        assert argv[:2] == ["docker", "compose"], argv
        assert argv[2] in {"up", "logs"}, argv
        for arg in argv:
            if "=" in arg and argv[argv.index(arg) - 1] == "--scale":
                assert arg.partition("=")[0] in compose["services"], arg
        if argv[2] == "logs":
            assert argv[-1] in compose["services"]
    user, _, password = env["FLOWER_BASIC_AUTH"].partition(":")
    assert user and password, "compose refuses to start Flower without FLOWER_BASIC_AUTH"


# --- settings -----------------------------------------------------------------------------


def _settings_rows() -> dict[str, str]:
    """``{setting name: default column}`` from the README's Settings table."""
    text = README.read_text(encoding="utf-8")
    section = text[text.index("## Settings\n") : text.index("## How it works\n")]
    rows: dict[str, str] = {}
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        if len(cells) != 3 or not cells[0].startswith("`CELERY_DURABLE_"):
            continue
        names = [name.strip("` ") for name in cells[0].split(",")]
        defaults = [value.strip("` ") for value in cells[1].split(",")]
        for index, name in enumerate(names):
            field = name.removeprefix("CELERY_DURABLE_").removeprefix("_").lower()
            rows[field] = defaults[index] if len(defaults) == len(names) else cells[1]
    return rows


def test_the_settings_table_names_every_setting_with_its_default() -> None:
    rows = _settings_rows()
    assert sorted(rows) == sorted(Settings.model_fields), "README settings table and Settings differ"
    for name, field in Settings.model_fields.items():
        default = field.get_default(call_default_factory=True)
        if isinstance(default, bool):
            assert rows[name] == str(default).lower(), name
        elif isinstance(default, int | float | str):
            assert rows[name] in (str(default), f"{default:g}" if isinstance(default, float) else ""), name
