"""Deploys under running runs, on real worker processes (SPEC §8, §8a).

A deploy is what it is on a fleet: the worker process with the old code
stops, one with the new code starts (``tests/support/apps/versioned.py``), and runs
that waited meanwhile replay on the new one. Between the two — where a
deploy pipeline runs ``celery-durable replay-check`` — no worker runs, so
the proof that a check writes nothing covers every key of the test.
"""

from __future__ import annotations

import functools
import json
from typing import Any

from celery_durable import Client, Engine, Settings
from celery_durable.testing import replay_history
from tests.support.apps.versioned import ORDER
from tests.support.cli import cli_process
from tests.support.fleet import Fleet, WorkerProcess
from tests.support.poll import RUN_BOUND, poll
from tests.support.redis_watch import dump_keys, writes_seen

TIMEOUT = 30
APP = "tests.support.apps.versioned"
cli = functools.partial(cli_process, columns=200)


def client_of(settings: Settings, version: str) -> Client:
    return Engine([ORDER[version]], settings).client()


def waits_for_approval(client: Client, run_id: str) -> None:
    poll(
        lambda: (client.get_workflow_run(run_id).snapshot["waiting_for"] or {}).get("name") == "approval",
        within=RUN_BOUND,
        what=f"run {run_id} to wait for approval",
    )


def deploy(fleet: Fleet, running: WorkerProcess, version: str) -> WorkerProcess:
    running.stop()
    return fleet.start(f"{APP}:{version}", name=version)


def test_a_deploy_keeps_old_runs_on_their_branch_and_new_runs_on_the_new_one(
    settings: Settings, fleet: Fleet
) -> None:
    worker = fleet.start(f"{APP}:v1", name="v1")
    v1 = client_of(settings, "v1")
    old = v1.start_workflow("order", args={"order": "old"})
    waits_for_approval(v1, old)
    worker.stop()

    # The deploy pipeline's check, while no worker runs: v2 replays the
    # waiting run, an unguarded change would break it, and nothing changes.
    url, prefix = settings.redis_url, settings.key_prefix
    before = dump_keys(url, prefix)
    with writes_seen(url, prefix) as writes:
        (ok,) = client_of(settings, "v2").check_replay()
        (broken,) = client_of(settings, "unguarded").check_replay()
        passed = cli(settings, "replay-check", "--app", f"{APP}:v2")
        failed = cli(settings, "replay-check", "--app", f"{APP}:unguarded", "--run", old)
        as_json = cli(settings, "replay-check", "--app", f"{APP}:unguarded", "--json")
        unknown = cli(settings, "replay-check", "--app", f"{APP}:other")
    assert writes == []
    assert dump_keys(url, prefix) == before
    assert (ok.run_id, ok.status, ok.verdict, ok.message) == (old, "running", "ok", "")
    assert broken.verdict == "diverges"
    assert "expected wait_for_signal('approval'), got fraud-check" in broken.message
    assert "changed since the run started" in broken.message
    assert passed.returncode == 0, passed.stderr
    assert passed.stdout.splitlines() == [f"{old}  order  running  ok", "1 runs checked: 1 ok, 0 diverge, 0 failed"]
    assert failed.returncode == 1, failed.stderr
    assert failed.stdout.splitlines()[-1] == "1 runs checked: 0 ok, 1 diverge, 0 failed"
    assert f"{old}  order  running  diverges  Workflow 'order' replayed differently" in failed.stdout
    assert as_json.returncode == 1
    report = json.loads(as_json.stdout)
    assert (report["checked"], report["ok"], report["diverge"], report["failed"]) == (1, 0, 1, 0)
    assert report["runs"][0]["message"] == broken.message
    assert unknown.returncode == 1
    assert unknown.stdout.splitlines() == [
        f"{old}  order  running  unknown_workflow  Workflow 'order' is not registered with this engine",
        "1 runs checked: 0 ok, 0 diverge, 1 failed",
    ]

    worker = deploy(fleet, worker, "v2")
    v2 = client_of(settings, "v2")
    new = v2.start_workflow("order", args={"order": "new"})
    waits_for_approval(v2, new)
    v2.signal_workflow_run(old, "approval", 10)
    done = v2.wait_for_workflow_run(old, timeout=TIMEOUT)
    assert (done.status, done.result) == ("completed", {"order": "old", "charged": 10, "fraud_check": None})
    detail = v2.get_workflow_run_detail(old)
    assert (detail.started_code_hash, detail.last_attempt_code_hash) == (ORDER["v1"].code_hash, ORDER["v2"].code_hash)
    assert [step.key for step in detail.steps] == ["reserve", "charge"]

    # v3 drops the old branch; the new run, which journaled the marker, replays.
    worker = deploy(fleet, worker, "v3")
    v3 = client_of(settings, "v3")
    v3.signal_workflow_run(new, "approval", 20)
    done = v3.wait_for_workflow_run(new, timeout=TIMEOUT)
    assert (done.status, done.result) == ("completed", {"order": "new", "charged": 20, "fraud_check": "clean"})
    detail = v3.get_workflow_run_detail(new)
    assert (detail.started_code_hash, detail.last_attempt_code_hash) == (ORDER["v2"].code_hash, ORDER["v3"].code_hash)
    assert [step.key for step in detail.steps] == ["reserve", "fraud-check", "charge"]
    worker.stop()


def test_a_run_broken_by_a_deploy_is_resumed_once_the_change_is_reverted(settings: Settings, fleet: Fleet) -> None:
    """A step renamed under a waiting run; approved, the run stops on
    nondeterminism; the rename is reverted, the workers restarted with the
    original code, and ``runs resume`` takes it to the end."""
    worker = fleet.start(f"{APP}:v1", name="v1")
    v1 = client_of(settings, "v1")
    run_id = v1.start_workflow("order", args={"order": "A"})
    waits_for_approval(v1, run_id)
    exported = cli(settings, "runs", "export", run_id, "--app", f"{APP}:v1")
    assert exported.returncode == 0, exported.stderr
    history: dict[str, Any] = json.loads(exported.stdout)
    assert replay_history(ORDER["v2"], history).verdict == "ok"
    assert replay_history(ORDER["renamed"], history).verdict == "diverges"

    worker = deploy(fleet, worker, "renamed")
    renamed = client_of(settings, "renamed")
    renamed.signal_workflow_run(run_id, "approval", 5)
    stopped = renamed.wait_for_workflow_run(run_id, timeout=TIMEOUT)
    assert (stopped.status, stopped.reason) == ("error", "nondeterminism")
    assert stopped.error is not None
    assert "expected reserve, got reserve-stock" in stopped.error
    hashes = f"code hash {ORDER['v1'].code_hash} then, {ORDER['renamed'].code_hash} now"
    assert f"The workflow's code changed since the run started ({hashes})" in stopped.error
    shown = cli(settings, "runs", "show", run_id, "--app", f"{APP}:renamed")
    assert f"code: started with {ORDER['v1'].code_hash}, latest attempt ran {ORDER['renamed'].code_hash}" in (
        shown.stdout
    )

    for flags in ([], ["--allow-code-change"], ["--force", "--allow-code-change"]):
        refused = cli(settings, "runs", "resume", run_id, "--app", f"{APP}:renamed", *flags)
        assert refused.returncode == 1
        assert refused.stderr.startswith("error [non_resumable]:"), refused.stderr
        assert "resuming the same code would fail the same way" in refused.stderr

    worker = deploy(fleet, worker, "v1")
    resumed = cli(settings, "runs", "resume", run_id, "--app", f"{APP}:v1", "--timeout", str(TIMEOUT), "--json")
    assert resumed.returncode == 0, resumed.stderr
    envelope = json.loads(resumed.stdout)
    assert (envelope["status"], envelope["attempt"]) == ("completed", 2)
    assert envelope["result"] == {"order": "A", "charged": 5, "fraud_check": None}
    worker.stop()


def test_resume_help_explains_allow_code_change(settings: Settings) -> None:
    shown = cli(settings, "runs", "resume", "--help")
    assert shown.returncode == 0
    text = " ".join(shown.stdout.replace("│", " ").split())
    assert "--allow-code-change" in text
    assert "differs from the code the run started with" in text
    assert "replay-check" in text
