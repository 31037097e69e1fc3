"""Namespaces isolate runs completely (SPEC §3): every client call that names a
run answers ``not_found`` for another namespace's run and changes nothing,
listings and event streams show only the namespace's own runs, and
idempotency keys are per namespace.

The calls are found by introspection, so a new client method that takes a
run id is tried here too — or fails the test until it is.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import pytest

from celery_durable import Client, RunNotFoundError, WorkflowContext, WorkflowResumeError, workflow
from tests.support.hostile import snapshot
from tests.support.poll import RUN_BOUND, poll

TIMEOUT = 30


@workflow(name="tenant", description="fails its first attempt, then completes", phases=[{"title": "Only"}])
def tenant(ctx: WorkflowContext) -> Any:
    ctx.phase("Only")
    ctx.log(f"attempt {ctx.attempt}")
    if ctx.attempt == 1:
        raise RuntimeError("first attempt fails")
    return "done"


CALLS: dict[str, Callable[[Client, str], Any]] = {
    "get_workflow_run": lambda c, r: c.get_workflow_run(r),
    "get_workflow_run_detail": lambda c, r: c.get_workflow_run_detail(r),
    "get_workflow_run_progress": lambda c, r: c.get_workflow_run_progress(r, phase_id="phase-1", after_seq=0),
    "follow_workflow_run_progress": lambda c, r: c.follow_workflow_run_progress(r, timeout=1),
    "wait_for_workflow_run": lambda c, r: c.wait_for_workflow_run(r, timeout=1),
    "cancel_workflow_run": lambda c, r: c.cancel_workflow_run(r, timeout=1),
    "pause_workflow_run": lambda c, r: c.pause_workflow_run(r, timeout=1),
    "resume_workflow": lambda c, r: c.resume_workflow(r, limits={"timeout_seconds": 60}, timeout=1, force=True),
    "run_workflow": lambda c, r: c.run_workflow("tenant", resume_from_run_id=r, timeout=1),
    "signal_workflow_run": lambda c, r: c.signal_workflow_run(r, "go", {"x": 1}),
    "export_history": lambda c, r: c.export_history(r),
    "get_workflow_run_history": lambda c, r: c.get_workflow_run_history(r),
}
"""Every client method that names a run, called as a user of the other namespace would."""


def run_methods() -> set[str]:
    """Public ``Client`` methods with a parameter that names a run."""
    found = set()
    for name, method in inspect.getmembers(Client, inspect.isfunction):
        parameters = inspect.signature(method).parameters
        if not name.startswith("_") and ({"run_id", "resume_from_run_id"} & set(parameters)):
            found.add(name)
    return found


def test_every_call_that_names_a_run_is_tried() -> None:
    untried = run_methods() - set(CALLS)
    assert not untried, f"add these client methods to CALLS: {sorted(untried)}"


def test_no_call_reaches_another_namespaces_run(durable, raw_redis) -> None:
    d = durable([tenant])
    mine = d.engine.client("alpha")
    theirs = d.engine.client("beta")
    run = mine.run_workflow("tenant", timeout=TIMEOUT)
    assert (run.status, run.can_resume) == ("error", True), "a run that every call could change"
    poll(
        lambda: raw_redis.zscore(d.engine.store.keys.sweep_due, run.run_id) is None,
        within=RUN_BOUND,
        what="the run to settle",
    )
    before = snapshot(raw_redis, d.settings.key_prefix)

    with theirs.watch_runs() as watch:
        for name in sorted(run_methods()):
            with pytest.raises((RunNotFoundError, WorkflowResumeError)) as info:
                CALLS[name](theirs, run.run_id)
            assert info.value.code == "not_found", name
            assert snapshot(raw_redis, d.settings.key_prefix) == before, f"{name} from another namespace wrote"
        with pytest.raises(RunNotFoundError):
            theirs.check_replay([run.run_id])
        assert theirs.check_replay() == []
        assert theirs.list_workflow_runs().runs == []
        assert theirs.list_workflow_runs(status="error", workflow="tenant").runs == []

        # The run's own namespace still can do everything with it; the other one hears nothing of it.
        assert mine.resume_workflow(run.run_id, timeout=TIMEOUT).status == "completed"
        assert watch.get(timeout=0.2) is None, "another namespace's events reached this watch"
    assert [r.run_id for r in mine.list_workflow_runs().runs] == [run.run_id]


def test_idempotency_keys_and_events_are_per_namespace(durable) -> None:
    d = durable([tenant])
    alpha, beta = d.engine.client("alpha"), d.engine.client("beta")
    with alpha.watch_runs() as watch:
        first = alpha.start_workflow("tenant", idempotency_key="same")
        second = beta.start_workflow("tenant", idempotency_key="same")
        assert first != second
        assert alpha.start_workflow("tenant", idempotency_key="same") == first
        for run_id in (first, second):
            (alpha if run_id == first else beta).wait_for_workflow_run(run_id, timeout=TIMEOUT)
        seen = set()
        while (update := watch.get(timeout=0.2)) is not None:
            seen.add(update.run_id)
    assert seen == {first}
