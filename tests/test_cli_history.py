"""``celery-durable runs history RUN [--follow] [--json]`` on a real Redis and an in-process worker."""

from __future__ import annotations

import json
import threading
from typing import Any

from celery_durable import Engine
from tests.support.apps.phased import phased
from tests.support.apps.waits import await_signal
from tests.support.cli import APP, cli
from tests.support.poll import RUN_BOUND, poll

WAITS_APP = "tests.test_cli_history:make_engine"


def make_engine() -> Engine:
    """Built when the command runs, so it takes the test's settings from the environment."""
    return Engine(workflows=[await_signal])


def test_history_as_json_and_as_a_table(durable) -> None:
    d = durable([phased])
    started = cli(d.settings, "run", "phased", "--app", APP, "--args", '{"pause": 0}', "--json")
    run_id = json.loads(started.stdout)["run_id"]

    page = json.loads(cli(d.settings, "runs", "history", run_id, "--app", APP, "--json").stdout)
    kinds = [event["kind"] for event in page["events"]]
    assert kinds[0] == "attempt_started" and kinds[-1] == "run_settled" and page["next"] is None
    assert kinds.count("step_completed") == 5
    assert page == d.client.get_workflow_run_history(run_id).to_dict()

    first = json.loads(cli(d.settings, "runs", "history", run_id, "--app", APP, "--limit", "2", "--json").stdout)
    rest = json.loads(
        cli(d.settings, "runs", "history", run_id, "--app", APP, "--after", str(first["next"]), "--json").stdout
    )
    assert first["events"] + rest["events"] == page["events"]

    table = cli(d.settings, "runs", "history", run_id, "--app", APP, "--limit", "3")
    assert table.exit_code == 0, table.output
    assert "attempt_started" in table.stdout and "step_completed" in table.stdout
    assert f"next page: --after {page['events'][2]['seq']}" in table.stdout


def test_bad_options_and_unknown_runs_are_one_line_and_exit_nonzero(durable) -> None:
    d = durable([phased])
    run_id = d.client.start_workflow("phased", args={"pause": 0})
    bad = cli(d.settings, "runs", "history", run_id, "--app", APP, "--limit", "0")
    assert bad.exit_code == 1 and "limit must be an integer from 1 to 500" in bad.output
    unknown = cli(d.settings, "runs", "history", "0" * 32, "--app", APP)
    assert unknown.exit_code == 1 and "Run not found" in unknown.output


def waiting_run(d: Any) -> str:
    """A run of await-signal, waiting for its signal."""
    run_id = d.client.start_workflow("await-signal")
    poll(lambda: d.client.get_workflow_run(run_id).snapshot["waiting_for"], within=RUN_BOUND, what="the run to wait")
    return str(run_id)


def test_a_cursor_past_every_event_is_an_empty_last_page_not_a_corrupt_store(durable) -> None:
    """``after`` is any seq >= 0: one past the end (of a live run's history,
    as of an archived run's) is the empty last page, never a storage error."""
    d = durable([await_signal])
    run_id = waiting_run(d)
    for after in (10**14, 10**15, 2**64, 10**30):
        page = d.client.get_workflow_run_history(run_id, after=after)
        assert page.events == [] and page.next is None, after
    shown = cli(d.settings, "runs", "history", run_id, "--app", WAITS_APP, "--after", str(10**15), "--json")
    assert shown.exit_code == 0, shown.output
    assert json.loads(shown.stdout) == {"events": [], "next": None}


def test_follow_checks_its_timeout_and_the_run_before_it_prints_anything(durable) -> None:
    """As every command that waits: a timeout that is no positive number is
    refused (nan would follow for ever), and an unknown run is the one error
    line with nothing on stdout, not the table's header first."""
    d = durable([await_signal])
    run_id = waiting_run(d)
    for timeout in ("0", "-1", "nan"):
        bad = cli(d.settings, "runs", "history", run_id, "--app", WAITS_APP, "--follow", "--timeout", timeout)
        assert bad.exit_code == 1, (timeout, bad.output)
        assert bad.stdout == "" and "timeout must be a positive number" in bad.stderr, (timeout, bad.output)
    bad = cli(d.settings, "runs", "history", run_id, "--app", WAITS_APP, "--follow", "--limit", "0")
    assert bad.exit_code == 1 and bad.stdout == "" and "limit must be an integer" in bad.stderr, bad.output
    unknown = cli(d.settings, "runs", "history", "0" * 32, "--app", WAITS_APP, "--follow")
    assert unknown.exit_code == 1 and unknown.stdout == "", unknown.output
    assert "Run not found" in unknown.stderr


def test_follow_streams_new_events_until_the_run_settles(durable) -> None:
    d = durable([await_signal])
    run_id = waiting_run(d)
    result: dict[str, Any] = {}
    follower = threading.Thread(
        target=lambda: result.update(
            done=cli(d.settings, "runs", "history", run_id, "--app", WAITS_APP, "--follow", "--json")
        )
    )
    follower.start()
    d.client.signal_workflow_run(run_id, "go", {"ok": 1})
    follower.join(60)
    assert not follower.is_alive()
    done = result["done"]
    assert done.exit_code == 0, done.output
    events = [json.loads(line) for line in done.stdout.splitlines()]
    seqs = [event["seq"] for event in events]
    assert seqs == sorted(set(seqs))
    assert events[-1]["kind"] == "run_settled"
    signal = [event for event in events if event["kind"] == "signal_received"]
    assert signal and signal[0]["data"]["payload"] == {"ok": 1}


def test_follow_as_a_table_prints_its_header_once_and_each_event_once(durable) -> None:
    d = durable([await_signal])
    run_id = waiting_run(d)
    result: dict[str, Any] = {}
    follower = threading.Thread(
        target=lambda: result.update(done=cli(d.settings, "runs", "history", run_id, "--app", WAITS_APP, "--follow"))
    )
    follower.start()
    poll(lambda: d.client.get_workflow_run_history(run_id).events, within=RUN_BOUND, what="the first events")
    d.client.signal_workflow_run(run_id, "go", {"ok": 1})
    follower.join(60)
    assert not follower.is_alive()
    lines = result["done"].stdout.splitlines()
    assert sum(line.startswith("seq ") for line in lines) == 1 and lines[0].startswith("seq    at")
    seqs = [int(line.split()[0]) for line in lines[1:]]
    assert seqs == list(range(1, len(seqs) + 1)), "each event once, in order"
    whole = d.client.get_workflow_run_history(run_id).events
    assert len(seqs) == len(whole) and "wait_started" in lines[1 + [e.kind for e in whole].index("wait_started")]
    kind_column = lines[0].index("kind")
    assert all(line[kind_column:].split()[0] == event.kind for line, event in zip(lines[1:], whole, strict=True))
