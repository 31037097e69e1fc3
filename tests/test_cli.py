"""The command line, SPEC §11: real workers, real Redis, the real binary.

Validation and ``--json`` go through Typer's test runner in this process
(against a worker thread of the same settings); what a person sees goes
through ``python -m celery_durable`` as a subprocess against a
``celery-durable worker`` process: the ``--follow`` transcript (compared
with the recorded one in ``tests/transcripts/``), the live view on a
pseudo-terminal, and one-line errors with their exit codes.
"""

from __future__ import annotations

import itertools
import json
import os
import pty
import re
import select
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from celery_durable import Client, Engine, Settings
from tests.support.apps.phased import phased
from tests.support.cli import APP, cli, cli_process
from tests.support.fleet import ROOT, Fleet, settings_env
from tests.support.poll import RUN_BOUND, poll

WORKER_APP = "tests.support.apps.phased:engine"
TRANSCRIPTS = Path(__file__).parent / "transcripts"
RESULT = {"total": 14}
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07|\r")


def normalize(text: str, run_id: str) -> str:
    """What varies from run to run: the id and durations."""
    text = text.replace(run_id, "<RUN>")
    return re.sub(r"\b\d+\.\d+s\b", "<T>", text)


def recorded(name: str) -> str:
    return (TRANSCRIPTS / name).read_text(encoding="utf-8")


def client_of(settings: Settings) -> Client:
    return Engine([phased], settings).client()


# -- help and errors ---------------------------------------------------------------


def test_help_lists_every_command(settings) -> None:
    top = cli(settings, "--help")
    assert top.exit_code == 0
    for name in ("run", "worker", "flower", "runs"):
        assert name in top.stdout
    group = cli(settings, "runs", "--help")
    for name in ("list", "show", "progress", "resume", "cancel", "pause", "signal"):
        assert name in group.stdout


@pytest.mark.parametrize(
    ("args", "exit_code", "message"),
    [
        (["runs", "show", "0" * 32, "--app", "nope.module:engine"], 2, "error: cannot import 'nope.module'"),
        (["runs", "show", "0" * 32, "--app", "tests.support.apps.phased"], 2, "error: --app must look like"),
        (["runs", "show", "0" * 32, "--app", "tests.support.apps.phased:missing"], 2, "has no attribute 'missing'"),
        (["runs", "show", "0" * 32, "--app", APP], 1, f"error [not_found]: Run not found: {'0' * 32}"),
        (["runs", "show", "--app", APP], 2, "error: Missing argument 'RUN'."),
        (["run", "phased", "--app", APP, "--args", "{bad"], 2, "error: --args is not JSON"),
        (["run", "nope", "--app", APP], 1, "error: Unknown workflow: 'nope'"),
        (["runs", "progress", "0" * 32, "--app", APP, "--limit", "0"], 1, "error: limit must be an integer"),
        (["runs", "progress", "0" * 32, "--app", APP, "--after-seq", "x"], 2, "'--after-seq'"),
        (["runs", "progress", "0" * 32, "--app", APP, "-f", "--before-seq", "3"], 2, "error: --follow shows"),
        (["runs", "list", "--app", APP, "--status", "weird"], 1, "error: status must be one of"),
        (["runs", "list", "--app", APP, "--cursor", "zzz"], 1, "error: cursor is not one"),
        (["flower", "--app", APP, "--basic-auth", "nopassword"], 2, "error: --basic-auth must be"),
    ],
    ids=lambda value: " ".join(value) if isinstance(value, list) else None,
)
def test_errors_are_one_line_and_a_nonzero_exit(settings, args: list[str], exit_code: int, message: str) -> None:
    done = cli_process(settings, *args)
    assert done.returncode == exit_code, done.stderr
    assert done.stdout == ""
    assert "Traceback" not in done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("error")
    assert message in lines[0]


@pytest.mark.parametrize(
    ("env", "app", "message"),
    [
        # pydantic's report of a bad setting spans four lines: said as one.
        ({"CELERY_DURABLE_MAX_FANOUT": "abc"}, APP, "invalid Settings: max_fanout: Input should be a valid integer"),
        ({"CELERY_DURABLE_REDIS_URL": "http://x"}, APP, "invalid Settings: redis_url: Value error, must be a redis://"),
        # The app's own module failing as it is imported: no traceback either.
        ({}, "json.decoder:JSONDecodeError", "JSONDecodeError"),
    ],
)
def test_a_bad_setting_or_a_failing_app_is_one_line_too(settings, env: dict[str, str], app: str, message: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "celery_durable", "runs", "list", "--app", app],
        env={**settings_env(settings), **env},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0 and done.stdout == ""
    assert "Traceback" not in done.stderr
    assert len(done.stderr.splitlines()) == 1, done.stderr
    assert done.stderr.startswith("error") and message in done.stderr


def test_every_namespace_option_reads_celery_durable_namespace() -> None:
    """SPEC §11: the namespace from --namespace or CELERY_DURABLE_NAMESPACE, whatever the engine's settings say."""
    import typer.main

    from celery_durable.cli import app

    def commands(group: Any, path: str = "") -> Any:
        for name, command in getattr(group, "commands", {}).items():
            yield f"{path} {name}".strip(), command
            yield from commands(command, f"{path} {name}")

    named = {
        path: param.envvar
        for path, command in commands(typer.main.get_command(app))
        for param in command.params
        if param.name == "namespace"
    }
    assert len(named) > 20 and set(named.values()) == {"CELERY_DURABLE_NAMESPACE"}, named


# -- scripts: --json ------------------------------------------------------------------


def test_json_output_of_run_list_show_and_progress(durable) -> None:
    d = durable([phased])
    settings = d.settings
    started = cli(settings, "run", "phased", "--app", APP, "--args", '{"pause": 0}', "--json")
    assert started.exit_code == 0, started.output
    envelope = json.loads(started.stdout)
    run_id = envelope["run_id"]
    assert (envelope["status"], envelope["result"], envelope["workflow"]) == ("completed", RESULT, "phased")

    listed = json.loads(cli(settings, "runs", "list", "--app", APP, "--json").stdout)
    assert [run["run_id"] for run in listed["runs"]] == [run_id]
    assert listed["next_cursor"] is None

    shown = json.loads(cli(settings, "runs", "show", run_id, "--app", APP, "--json").stdout)
    assert set(shown) == {
        "run", "phases", "agents", "steps", "progress", "children", "started_code_hash", "last_attempt_code_hash"
    }
    assert shown["children"] == [] and shown["run"]["parent_run_id"] is None
    assert shown["started_code_hash"] == shown["last_attempt_code_hash"] == phased.code_hash
    assert shown["run"] == envelope
    assert [(p["phase_id"], p["title"], p["detail"], p["state"]) for p in shown["phases"]] == [
        ("phase-1", "Fetch", "Read the inputs", "done"),
        ("phase-2", "Crunch", None, "done"),
        ("phase-3", "Report", "Write the summary", "done"),
    ]
    assert all(p["started_at"] and p["finished_at"] for p in shown["phases"])
    assert shown["agents"] == []
    assert sorted(step["key"] for step in shown["steps"]) == ["fetch", "report", "square-1", "square-2", "square-3"]
    assert {step["status"] for step in shown["steps"]} == {"completed"}
    assert shown["progress"][-1]["message"] == "Run completed"

    crunch = json.loads(cli(settings, "runs", "progress", run_id, "--app", APP, "--phase", "Crunch", "--json").stdout)
    assert [r["message"] for r in crunch["records"]] == ["Crunch", "crunching 3 items"]
    assert {r["phase_id"] for r in crunch["records"]} == {"phase-2"}
    assert (crunch["oldest_seq"], crunch["newest_seq"]) == (4, 5)

    page = json.loads(
        cli(settings, "runs", "progress", run_id, "--app", APP, "--after-seq", "2", "--limit", "2", "--json").stdout
    )
    assert [r["seq"] for r in page["records"]] == [3, 4]
    assert (page["has_more_older"], page["has_more_newer"], page["revision"]) == (True, True, 8)


def test_tables_for_people(durable) -> None:
    d = durable([phased])
    empty = cli(d.settings, "runs", "list", "--app", APP)
    assert empty.exit_code == 0 and empty.stdout.strip() == "No runs"
    run_id = d.client.run_workflow("phased", args={"pause": 0}, timeout=30).run_id
    listing = cli(d.settings, "runs", "list", "--app", APP)
    assert listing.exit_code == 0
    assert run_id in listing.stdout and "completed" in listing.stdout  # ids are never cut
    shown = cli(d.settings, "runs", "show", run_id, "--app", APP).stdout
    for piece in ("status", "completed", "phases", "✓", "Read the inputs", "agent turns: none", "square-2", "▶ Report"):
        assert piece in shown
    lines = cli(d.settings, "runs", "progress", run_id, "--app", APP, "--before-seq", "4").stdout.splitlines()
    assert lines == [
        "    1 • Attempt 1 started",
        "    2 ▶ Fetch (phase 1/3): Read the inputs",
        "    3   fetching 3 items",
    ]


def test_runs_show_links_a_parent_and_its_children(durable) -> None:
    from celery_durable.broker.schema import child_run_id
    from tests.support.apps.nested import nest_leaf, nest_parent

    d = durable([nest_leaf, nest_parent])
    app = "tests.support.apps.nested:make_engine"
    run_id = d.client.run_workflow("nest-parent", timeout=30).run_id
    kid, loose = child_run_id(run_id, "kid"), child_run_id(run_id, "loose")
    d.client.wait_for_workflow_run(loose, timeout=30)
    shown = cli(d.settings, "runs", "show", run_id, "--app", app).stdout
    assert "child runs" in shown and "show one with: celery-durable runs show <run>" in shown
    cells = [[cell.strip() for cell in line.strip("│ ").split("│")] for line in shown.splitlines()]
    rows = {row[0]: row[1:] for row in cells if row[0] in (kid, loose)}
    assert rows == {
        kid: ["kid", "nest-leaf", "completed", "yes"],
        loose: ["loose", "nest-leaf", "completed", "detached"],
    }
    child = cli(d.settings, "runs", "show", kid, "--app", app).stdout
    assert f"parent run: {run_id} (celery-durable runs show {run_id})" in " ".join(child.split())
    as_json = json.loads(cli(d.settings, "runs", "show", run_id, "--app", app, "--json").stdout)
    children = [(c["key"], c["run_id"], c["detached"]) for c in as_json["children"]]
    assert children == [("kid", kid, False), ("loose", loose, True)]


def test_a_failed_run_exits_1_and_is_steered_from_the_command_line(durable) -> None:
    d = durable([phased])
    failed = cli(d.settings, "run", "phased", "--app", APP, "--args", '{"pause": 0, "fail": true}', "--json")
    assert failed.exit_code == 1
    envelope = json.loads(failed.stdout)
    assert (envelope["status"], envelope["reason"], envelope["can_resume"]) == ("error", "exception", True)
    assert "the printer is on fire" in envelope["error"]
    run_id = envelope["run_id"]

    again = cli(d.settings, "runs", "resume", run_id, "--app", APP, "--json", "--timeout", "30")
    assert again.exit_code == 1  # the same args fail the same way
    assert (json.loads(again.stdout)["status"], json.loads(again.stdout)["attempt"]) == ("error", 2)

    cancelled = cli(d.settings, "runs", "cancel", run_id, "--app", APP, "--json")
    assert cancelled.exit_code == 0
    assert json.loads(cancelled.stdout)["status"] == "cancelled"

    refused = cli(d.settings, "runs", "resume", run_id, "--app", APP)
    assert refused.exit_code == 1
    assert refused.stderr.startswith("error [non_resumable]: ")


def test_follow_with_json_streams_records_then_the_envelope(durable) -> None:
    d = durable([phased])
    done = cli(d.settings, "run", "phased", "--app", APP, "--args", '{"pause": 0.05}', "--follow", "--json")
    assert done.exit_code == 0, done.output
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    records = [line["record"] for line in lines[:-1]]
    assert {line["type"] for line in lines[:-1]} == {"progress"}
    assert [r["seq"] for r in records] == list(range(1, len(records) + 1))
    assert [r["message"] for r in records if r["kind"] == "phase"] == ["Fetch", "Crunch", "Report"]
    assert lines[-1]["type"] == "run"
    assert (lines[-1]["run"]["status"], lines[-1]["run"]["result"]) == ("completed", RESULT)


def test_pause_and_signal_use_the_client_or_say_they_are_not_available(durable) -> None:
    d = durable([phased])
    run_id = d.client.run_workflow("phased", args={"pause": 0}, timeout=30).run_id
    commands = ((["pause", run_id], "pause_workflow_run"), (["signal", run_id, "go"], "signal_workflow_run"))
    for command, method in commands:
        result = cli(d.settings, "runs", *command, "--app", APP, "--json")
        if hasattr(Client, method):  # the engine side came with its own issue
            assert result.exit_code in (0, 1), result.output
            assert "not available yet" not in result.stderr
        else:
            assert result.exit_code == 2
            assert result.stderr.strip() == (
                f"error: runs {command[0]} is not available yet: this engine's client has no {method}()"
            )


# -- people: --follow, on a pipe and on a terminal --------------------------------------


def test_run_follow_transcript(settings, fleet: Fleet) -> None:
    """The recorded transcript: each phase begins (▶) and ends (✓) in order,
    log lines in between, then how the run ended and its result."""
    fleet.start(WORKER_APP)
    done = cli_process(settings, "run", "phased", "--app", WORKER_APP, "--args", '{"pause": 0.3}', "--follow")
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    run_id = re.search(r"run ([0-9a-f]{32})", done.stdout).group(1)  # type: ignore[union-attr]
    assert normalize(done.stdout, run_id) == recorded("run_follow.txt")


def test_runs_progress_follow_joins_a_run_midway_and_tells_the_same_story(settings, fleet: Fleet) -> None:
    fleet.start(WORKER_APP)
    client = client_of(settings)
    run_id = client.start_workflow("phased", args={"pause": 0.6})
    poll(
        lambda: any(r.message == "Crunch" for r in client.get_workflow_run_progress(run_id).records),
        within=RUN_BOUND,
        what="phase Crunch",
    )
    done = cli_process(settings, "runs", "progress", run_id, "--app", WORKER_APP, "--follow")
    assert done.returncode == 0, done.stderr
    assert normalize(done.stdout, run_id) == recorded("run_follow.txt")


def run_on_terminal(settings: Settings, *args: str, timeout: float = 60) -> tuple[int, str]:
    """Run the command with a pseudo-terminal as its stdout; (exit code, everything it drew)."""
    leader, follower = pty.openpty()
    env = {**settings_env(settings), "COLUMNS": "100", "LINES": "30", "TERM": "xterm-256color"}
    process = subprocess.Popen(
        [sys.executable, "-m", "celery_durable", *args], cwd=ROOT, env=env, stdout=follower, stderr=follower
    )
    os.close(follower)
    chunks: list[bytes] = []
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([leader], [], [], 0.5)
            if not ready:
                if process.poll() is not None:
                    break
                continue
            try:
                data = os.read(leader, 65536)
            except OSError:  # the other side closed: the process is gone
                break
            if not data:
                break
            chunks.append(data)
        code = process.wait(timeout=10)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        os.close(leader)
    return code, b"".join(chunks).decode("utf-8", "replace")


def test_run_follow_on_a_terminal_shows_a_bar_per_phase(settings, fleet: Fleet) -> None:
    fleet.start(WORKER_APP)
    code, drawn = run_on_terminal(settings, "run", "phased", "--app", WORKER_APP, "--args", '{"pause": 0.6}', "-f")
    assert code == 0, drawn
    screen = ANSI.sub("", drawn)
    run_id = re.search(r"run ([0-9a-f]{32}) · phased", screen).group(1)  # type: ignore[union-attr]
    # Every redraw starts with the run's head line; read the phases' states off each.
    frames = screen.split(f"run {run_id} · phased · ")[1:]
    states: list[tuple[str, ...]] = []
    for frame in frames:
        found = tuple(re.findall(r"^[○◐✓] (?:Fetch|Crunch|Report)\s+━+ (pending|active|done)", frame, re.M))
        if len(found) == 3 and (not states or states[-1] != found):
            states.append(found)
    order = {"pending": 0, "active": 1, "done": 2}
    for before, after in itertools.pairwise(states):
        assert all(order[a] >= order[b] for a, b in zip(after, before, strict=True)), states  # phases only advance
    for index in range(3):
        assert any(state[index] == "active" for state in states), f"phase {index + 1} never shown active: {states}"
    assert states[-1] == ("done", "done", "done")
    # The last frame stays on the screen, and the summary follows it.
    final = normalize(f"run {run_id} · phased · {frames[-1]}", run_id)
    assert [line.rstrip() for line in final.rstrip().splitlines()] == recorded("run_follow_live.txt").splitlines()


def test_what_a_command_prints_for_scripts_is_alone_on_stdout(settings) -> None:
    """An ``--app`` module that prints at import and exports spans to the console
    (at once and at exit) leaves stdout to the command's result: all of that goes to stderr."""
    env = settings_env(settings)

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", "celery_durable", *args, "--app", "tests.support.apps.noisy:make_engine"]
        return subprocess.run(command, env=env, cwd=ROOT, capture_output=True, text=True, timeout=60)

    started = cli("runs", "start", "noisy", "--args", "{}")
    assert started.returncode == 0, started.stderr
    assert re.fullmatch(r"[0-9a-f]{32}\n", started.stdout), started.stdout
    run_id = started.stdout.strip()
    assert "noisy: imported" in started.stderr and "noisy: exiting" in started.stderr
    assert '"name": "noisy-engine"' in started.stderr and '"name": "noisy-at-exit"' in started.stderr

    shown = cli("runs", "show", run_id, "--json")
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["run"]["run_id"] == run_id  # the whole of stdout is one JSON document
    assert '"name": "noisy-at-exit"' in shown.stderr
    helped = subprocess.run(
        [sys.executable, "-m", "celery_durable", "runs", "start", "--help"],
        env=env, cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert "--idempotency-key" in helped.stdout, "help is still printed on stdout"
