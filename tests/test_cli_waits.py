"""The command line with runs that wait (issue 30): ``runs start`` returns
the id at once, ``run --timeout`` tells a healthily waiting run from a stuck
one, and ``--follow`` says what the run waits for. Real Redis, a real worker."""

from __future__ import annotations

import json

from tests.support.apps.waits import await_signal, nap
from tests.support.cli import cli

APP = "tests.support.apps.waits:make_engine"
TIMEOUT = "5"
"""--timeout of the commands: the run reaches its wait in well under it (one journaled step)."""


def test_runs_start_prints_the_id_and_an_idempotency_key_starts_once(durable) -> None:
    d = durable([await_signal, nap])
    started = cli(d.settings, "runs", "start", "await-signal", "--app", APP, "--idempotency-key", "order-7")
    assert started.exit_code == 0, started.output
    run_id = started.stdout.strip()
    assert len(run_id) == 32 and d.client.get_workflow_run(run_id).workflow == "await-signal"
    again = cli(d.settings, "runs", "start", "await-signal", "--app", APP, "--idempotency-key", "order-7", "--json")
    assert json.loads(again.stdout) == {"run_id": run_id}
    other = cli(d.settings, "runs", "start", "nap", "--app", APP, "--args", '{"seconds": 0}')
    assert other.exit_code == 0 and other.stdout.strip() != run_id
    bad = cli(d.settings, "runs", "start", "nap", "--app", APP, "--args", "{nope")
    assert bad.exit_code == 2 and "--args is not JSON" in bad.stderr
    d.client.signal_workflow_run(run_id, "go", 1)
    assert d.client.wait_for_workflow_run(run_id, timeout=20).status == "completed"


def test_run_with_a_timeout_reports_a_waiting_run_as_waiting(durable) -> None:
    d = durable([await_signal, nap])
    done = cli(d.settings, "run", "await-signal", "--app", APP, "--timeout", TIMEOUT)
    assert done.exit_code == 3, done.output
    assert "is still running" not in done.output
    line = done.stdout.strip().splitlines()[-1]
    assert line.startswith("run ") and f"is waiting for signal 'go' after {TIMEOUT}s; it goes on" in line
    run_id = line.split()[1]
    assert d.client.get_workflow_run(run_id).snapshot["waiting_for"]["name"] == "go"

    as_json = cli(d.settings, "run", "await-signal", "--app", APP, "--timeout", TIMEOUT, "--json")
    assert as_json.exit_code == 3
    envelope = json.loads(as_json.stdout)
    assert envelope["status"] == "running" and envelope["snapshot"]["waiting_for"]["kind"] == "signal"
    assert "is waiting for signal 'go'" in as_json.stderr


def test_follow_says_what_the_run_waits_for(durable) -> None:
    d = durable([await_signal, nap])
    done = cli(d.settings, "run", "await-signal", "--app", APP, "--timeout", TIMEOUT, "--follow")
    assert done.exit_code == 3, done.output
    assert "⏸ waiting for signal 'go'" in done.stdout
    assert "is waiting for signal 'go'" in done.stdout.splitlines()[-1]

    streamed = cli(d.settings, "run", "await-signal", "--app", APP, "--timeout", TIMEOUT, "--follow", "--json")
    assert streamed.exit_code == 3
    lines = [json.loads(line) for line in streamed.stdout.splitlines()]  # JSON lines, every one
    waits = [line for line in lines if line["type"] == "waiting"]
    assert len(waits) == 1 and waits[0]["waiting_for"]["kind"] == "signal" and waits[0]["waiting_for"]["name"] == "go"
    assert lines[-1]["type"] == "run" and lines[-1]["run"]["status"] == "running"


def test_a_timer_that_fires_is_followed_to_the_end(durable) -> None:
    d = durable([await_signal, nap])
    done = cli(d.settings, "run", "nap", "--app", APP, "--args", '{"seconds": 1.5}', "--follow")
    assert done.exit_code == 0, done.output
    assert "⏸ waiting for timer until" in done.stdout
    assert "completed" in done.stdout
