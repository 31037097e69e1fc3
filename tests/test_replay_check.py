"""``Client.check_replay``, ``Client.export_history``, ``testing.replay_history``
and resuming after a deploy (SPEC §8, §8a), in-process: a deploy is a second
test environment with the new code, on the first one's store."""

from __future__ import annotations

import json
from typing import Any

import pytest

from celery_durable import ReplayCheck, RunNotFoundError, WorkflowContext, WorkflowResumeError, define_workflow
from celery_durable.testing import WorkflowTestEnvironment, replay_history

ORDER = {"name": "order", "description": "Reserves, waits for approval, charges", "phases": []}


def original(ctx: WorkflowContext) -> Any:
    ctx.step("reserve", lambda: "reserved")
    approval = ctx.wait_for_signal("approval")
    return ctx.step("charge", lambda: approval.payload)


def renamed(ctx: WorkflowContext) -> Any:
    ctx.step("reserve-stock", lambda: "reserved")
    approval = ctx.wait_for_signal("approval")
    return ctx.step("charge", lambda: approval.payload)


def patched(ctx: WorkflowContext) -> Any:
    ctx.step("reserve", lambda: "reserved")
    if ctx.patched("fraud-check"):
        ctx.step("fraud-check", lambda: "clean")
    approval = ctx.wait_for_signal("approval")
    return ctx.step("charge", lambda: approval.payload)


def fails(ctx: WorkflowContext) -> Any:
    return ctx.step("boom", lambda: 1 / 0)


V1, RENAMED, PATCHED = (define_workflow(ORDER, run) for run in (original, renamed, patched))
FAILS = define_workflow({"name": "fails", "description": "Fails in its step", "phases": []}, fails)


def deploy(env: WorkflowTestEnvironment, *workflows: Any) -> WorkflowTestEnvironment:
    """What the workers run after a deploy: other code, the same runs."""
    new = WorkflowTestEnvironment(list(workflows))
    new.engine.env_store = env.engine.store
    return new


def verdicts(checks: list[ReplayCheck]) -> dict[str, tuple[str, str]]:
    return {check.run_id: (check.status, check.verdict) for check in checks}


def test_check_replay_selects_the_runs_that_can_still_continue_newest_first() -> None:
    env = WorkflowTestEnvironment([V1, FAILS])
    waiting = env.start("order")
    paused = env.start("order")
    env.pause(paused)
    completed = env.start("order")
    env.signal(completed, "approval", 1)
    cancelled = env.start("order")
    env.cancel(cancelled)
    failed = env.run("fails").run_id
    diverged = env.start("order")
    deploy(env, RENAMED).signal(diverged, "approval", 1)
    assert env.get(diverged).reason == "nondeterminism"

    checks = env.client.check_replay()
    assert [check.run_id for check in checks] == [failed, paused, waiting]
    assert verdicts(checks) == {
        failed: ("error", "ok"),
        paused: ("paused", "ok"),
        waiting: ("running", "ok"),
    }
    assert checks[0] == ReplayCheck(failed, "fails", "error", "ok", "")
    assert [check.run_id for check in env.client.check_replay(statuses=["running", "paused"])] == [paused, waiting]
    assert [check.run_id for check in env.client.check_replay(limit=1)] == [failed]
    assert [check.run_id for check in env.client.check_replay(workflow="order")] == [paused, waiting]
    # The limit counts the named workflow's runs: the newer run of "fails" does not use it up.
    assert [check.run_id for check in env.client.check_replay(workflow="order", limit=1)] == [paused]
    explicit = env.client.check_replay([completed, cancelled, diverged])
    assert verdicts(explicit) == {
        completed: ("completed", "ok"),
        cancelled: ("cancelled", "ok"),
        diverged: ("error", "ok"),  # against the code it started with, it replays to where it stopped
    }
    assert verdicts(deploy(env, RENAMED, FAILS).client.check_replay([diverged])) == {diverged: ("error", "diverges")}


def test_a_run_of_a_workflow_the_engine_does_not_register_is_unknown_workflow() -> None:
    env = WorkflowTestEnvironment([V1, FAILS])
    run_id = env.start("order")
    (check,) = deploy(env, FAILS).client.check_replay()
    assert check == ReplayCheck(
        run_id, "order", "running", "unknown_workflow", "Workflow 'order' is not registered with this engine"
    )


@pytest.mark.parametrize(
    ("options", "error"),
    [
        ({"statuses": ["completed"]}, "statuses narrows the runs that can still continue"),
        ({"statuses": ["running", "bogus"]}, "got 'bogus'"),
        ({"statuses": "running"}, "statuses must be a collection of strings"),
        ({"run_ids": "abc"}, "run_ids must be a collection of strings"),
        ({"run_ids": [1]}, "run_ids must hold strings"),
        ({"limit": 0}, "limit must be an integer from 1"),
        ({"limit": True}, "limit must be an integer from 1"),
        ({"workflow": 3}, "workflow must be a name"),
    ],
)
def test_bad_options_are_value_errors_naming_them(options: dict[str, Any], error: str) -> None:
    env = WorkflowTestEnvironment([V1])
    with pytest.raises(ValueError, match=error):
        env.client.check_replay(**options)


def test_an_unknown_run_id_is_not_found() -> None:
    env = WorkflowTestEnvironment([V1])
    with pytest.raises(RunNotFoundError, match="Run not found: 0123"):
        env.client.check_replay(["0123"])


def test_a_run_stopped_on_nondeterminism_resumes_once_the_code_that_broke_it_is_reverted() -> None:
    """The issue's scenario: a step renamed under a waiting run, approved, the
    run stops; the rename is reverted and the run must be resumable."""
    env = WorkflowTestEnvironment([V1])
    run_id = env.start("order")
    broken = deploy(env, RENAMED)
    stopped = broken.signal(run_id, "approval", 42)
    assert (stopped.status, stopped.reason, stopped.can_resume) == ("error", "nondeterminism", False)
    assert "at call 0: expected reserve, got reserve-stock" in stopped.error
    assert f"code changed since the run started (code hash {V1.code_hash} then, {RENAMED.code_hash} now)" in (
        stopped.error
    )
    detail = env.detail(run_id)
    assert (detail.started_code_hash, detail.last_attempt_code_hash) == (V1.code_hash, RENAMED.code_hash)
    assert detail.to_dict()["last_attempt_code_hash"] == RENAMED.code_hash

    for options in ({}, {"allow_code_change": True}, {"force": True, "allow_code_change": True}):
        with pytest.raises(WorkflowResumeError, match="would fail the same way") as refused:
            broken.resume(run_id, **options)
        assert refused.value.code == "non_resumable"

    reverted = deploy(env, V1)
    resumed = reverted.resume(run_id)  # the code it started with: no flag needed
    assert (resumed.status, resumed.result, resumed.attempt) == ("completed", 42, 2)
    detail = env.detail(run_id)
    assert (detail.started_code_hash, detail.last_attempt_code_hash) == (V1.code_hash, V1.code_hash)


def test_a_fix_that_is_not_the_original_code_needs_allow_code_change() -> None:
    env = WorkflowTestEnvironment([V1])
    run_id = env.start("order")
    deploy(env, RENAMED).signal(run_id, "approval", 42)
    fixed = deploy(env, PATCHED)
    with pytest.raises(WorkflowResumeError) as refused:
        fixed.resume(run_id)
    assert refused.value.code == "workflow_code_changed"
    resumed = fixed.resume(run_id, allow_code_change=True)
    assert (resumed.status, resumed.result) == ("completed", 42)
    assert env.detail(run_id).started_code_hash == V1.code_hash  # it still started with that


def test_an_exported_history_replays_in_a_plain_test() -> None:
    env = WorkflowTestEnvironment([V1])
    run_id = env.start("order")
    history = json.loads(json.dumps(env.client.export_history(run_id)))  # as a file keeps it
    assert (history["format"], history["version"], history["run"]["run_id"]) == (
        "celery-durable-history",
        1,
        run_id,
    )
    assert ["o:m:1", "1:g|approval"] in history["journal"]
    assert (history["epoch"], history["code_hash"], history["last_code_hash"]) == (1, V1.code_hash, V1.code_hash)
    assert replay_history(V1, history) == ReplayCheck(run_id, "order", "running", "ok", "")
    assert replay_history(PATCHED, history).verdict == "ok"
    check = replay_history(RENAMED, history)
    assert check.verdict == "diverges"
    assert "expected reserve, got reserve-stock" in check.message
    # SPEC §8a's document has four fields; the three the export adds are optional.
    spec_only = {key: history[key] for key in ("format", "version", "run", "journal")}
    assert replay_history(V1, spec_only) == ReplayCheck(run_id, "order", "running", "ok", "")
    assert replay_history(RENAMED, spec_only).verdict == "diverges"


@pytest.mark.parametrize(
    ("change", "error"),
    [
        (lambda h: h.update(format="other"), "Not a celery-durable history"),
        (lambda h: h.update(version=2), "History version 2 is not one this celery-durable reads"),
        (lambda h: h.update(journal={"o:m:0": "x"}), "list of \\[field, value\\] pairs"),
        (lambda h: h.update(journal=[["o:m:0"]]), "list of \\[field, value\\] pairs"),
        (lambda h: h.update(epoch=0), "not an envelope celery-durable wrote"),
        (lambda h: h["run"].update(status="sleeping"), "not an envelope celery-durable wrote"),
        (lambda h: h["run"].update(workflow="other"), "The history is of workflow 'other', not 'order'"),
    ],
)
def test_a_document_that_is_not_a_history_of_the_workflow_is_a_value_error(change: Any, error: str) -> None:
    env = WorkflowTestEnvironment([V1])
    history = env.client.export_history(env.start("order"))
    change(history)
    with pytest.raises(ValueError, match=error):
        replay_history(V1, history)
