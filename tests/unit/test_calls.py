"""``ctx.call`` in the in-process test environment: a fleet's task, run here."""

from __future__ import annotations

from typing import Any

from celery_durable import StepFailed, WorkflowContext, define_workflow
from celery_durable.testing import WorkflowTestEnvironment

CALLS: list[tuple[str, Any]] = []


def resize(url: str, size: int = 64) -> dict[str, Any]:
    CALLS.append(("resize", url))
    return {"url": url, "size": size}


def broken(why: str) -> None:
    raise KeyError(why)


def gallery(ctx: WorkflowContext) -> Any:
    first = ctx.call("a", "fleet.resize", args=("a.png",))
    rest = ctx.parallel([lambda: ctx.call("b", "fleet.resize", kwargs={"url": "b.png", "size": 8})])
    try:
        ctx.call("broken", "fleet.broken", args=("frame 7",))
    except StepFailed as exc:
        failure = [exc.error_type, exc.error_message]
    try:
        ctx.call("missing", "fleet.nowhere")
    except StepFailed as exc:
        missing = exc.error_type
    return {"first": first, "rest": rest, "failure": failure, "missing": missing}


WF = define_workflow({"name": "gallery", "description": "calls", "phases": []}, gallery)


def test_calls_run_the_environments_tasks_and_are_journaled_once() -> None:
    CALLS.clear()
    env = WorkflowTestEnvironment([WF], tasks={"fleet.resize": resize, "fleet.broken": broken})
    envelope = env.run("gallery")
    assert envelope.status == "completed", envelope.error
    assert envelope.result == {
        "first": {"url": "a.png", "size": 64},
        "rest": [{"url": "b.png", "size": 8}],
        "failure": ["KeyError", "'frame 7'"],
        "missing": "TaskNotRegistered",
    }
    assert CALLS == [("resize", "a.png"), ("resize", "b.png")]
    steps = {row.key: row.status for row in env.detail(envelope.run_id).steps}
    assert steps == {"a": "completed", "b": "completed", "broken": "failed", "missing": "failed"}
