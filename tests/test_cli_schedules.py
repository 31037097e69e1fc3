"""``celery-durable schedules ...`` and ``runs list --schedule`` (SPEC §5d, §11):
thin over the client; one line and a non-zero exit on an error; ``--json`` on the readers."""

from __future__ import annotations

import json

from celery_durable import Settings
from tests.support.cli import APP, cli


def test_schedules_commands_create_show_steer_and_delete(settings: Settings) -> None:
    made = cli(settings, "schedules", "create", "nightly", "phased", "--app", APP, "--cron", "0 2 * * *",
               "--timezone", "Europe/Paris", "--args", '{"n": 3}', "--note", "reports", "--json")
    assert made.exit_code == 0, made.output
    info = json.loads(made.stdout)
    assert (info["schedule_id"], info["cron"], info["timezone"], info["note"]) == (
        "nightly", "0 2 * * *", "Europe/Paris", "reports"
    )
    assert len(info["next_times"]) == 5 and info["paused"] is False

    again = cli(settings, "schedules", "create", "nightly", "phased", "--app", APP, "--every", "60")
    assert again.exit_code == 1 and "error [schedule_exists]: Schedule already exists: nightly" in again.output

    shown = json.loads(cli(settings, "schedules", "show", "nightly", "--app", APP, "--json").stdout)
    assert shown["args"] == {"n": 3}
    listed = json.loads(cli(settings, "schedules", "list", "--app", APP, "--json").stdout)
    assert [s["schedule_id"] for s in listed["schedules"]] == ["nightly"]
    assert "nightly" in cli(settings, "schedules", "list", "--app", APP).stdout

    paused = json.loads(cli(settings, "schedules", "pause", "nightly", "--app", APP, "--note", "x", "--json").stdout)
    assert paused["paused"] is True and paused["next_times"] == []
    updated = cli(settings, "schedules", "update", "nightly", "--app", APP, "--overlap", "allow_all", "--json")
    assert json.loads(updated.stdout)["overlap"] == "allow_all"

    triggered = json.loads(cli(settings, "schedules", "trigger", "nightly", "--app", APP, "--json").stdout)
    filled = cli(settings, "schedules", "backfill", "nightly", "2030-01-01T00:00:00", "2030-01-03T00:00:00",
                 "--app", APP, "--json")
    backfilled = json.loads(filled.stdout)["run_ids"]
    assert len(backfilled) == 2
    runs = json.loads(cli(settings, "runs", "list", "--app", APP, "--schedule", "nightly", "--json").stdout)["runs"]
    assert {run["run_id"] for run in runs} == {triggered["run_id"], *backfilled}
    assert all(run["schedule_id"] == "nightly" and run["scheduled_at"] for run in runs)

    unpaused = json.loads(cli(settings, "schedules", "unpause", "nightly", "--app", APP, "--json").stdout)
    assert unpaused["paused"] is False and len(unpaused["next_times"]) == 5
    assert cli(settings, "schedules", "delete", "nightly", "--app", APP).exit_code == 0
    gone = cli(settings, "schedules", "show", "nightly", "--app", APP)
    assert gone.exit_code == 1 and "error [not_found]: Schedule not found: nightly" in gone.output


def test_bad_schedule_input_is_one_line_naming_it(settings: Settings) -> None:
    bad = cli(settings, "schedules", "create", "s", "phased", "--app", APP, "--cron", "99 * * * *")
    assert bad.exit_code == 1 and "does not parse" in bad.output and len(bad.output.strip().splitlines()) == 1
    tz = cli(settings, "schedules", "create", "s", "phased", "--app", APP, "--every", "60", "--timezone", "Nowhere/X")
    assert tz.exit_code == 1 and "Unknown time zone: 'Nowhere/X'" in tz.output
    assert json.loads(cli(settings, "schedules", "list", "--app", APP, "--json").stdout) == {"schedules": []}
