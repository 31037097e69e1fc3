"""``ctx.call`` in the in-process test environment: a fleet's task, run here."""

from __future__ import annotations

from typing import Any

import pytest

from celery_durable import StepFailed, WorkflowContext, define_workflow
from celery_durable.testing import WorkflowTestEnvironment
from celery_durable.testing.explorer import ExplorerEnvironment
from celery_durable.testing.fleet import InProcessSender
from celery_durable.testing.tracer import Tracer

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


def slow_render(ctx: WorkflowContext) -> Any:
    return ctx.call("render", "fleet.resize", args=("r.png",), timeout=60)


SLOW = define_workflow({"name": "slow-render", "description": "a call with a time-out", "phases": []}, slow_render)


def test_a_call_that_timed_out_is_sent_again_when_its_run_is_resumed(monkeypatch: pytest.MonkeyPatch) -> None:
    """SPEC 4, 5a: the first message goes to a queue nobody serves and the call
    times out; once resumed, the run sends the task again and completes."""
    CALLS.clear()
    sent: list[int] = []
    send_call = InProcessSender.send_call

    def lose_the_first(self: InProcessSender, engine: Any, record: Any, request: Any) -> None:
        sent.append(record.attempt)
        if len(sent) > 1:
            send_call(self, engine, record, request)

    monkeypatch.setattr(InProcessSender, "send_call", lose_the_first)
    env = ExplorerEnvironment([SLOW], Tracer(), tasks={"fleet.resize": resize})
    run_id = env.client.start_workflow(SLOW)
    assert env.recover(lambda: env.settled(run_id))
    timed_out = env.get(run_id)
    assert (timed_out.status, timed_out.can_resume) == ("error", True)
    assert "TaskTimeout" in str(timed_out.error)
    env.resume(run_id)
    assert env.recover(lambda: env.settled(run_id))
    envelope = env.get(run_id)
    assert (envelope.status, envelope.result) == ("completed", {"url": "r.png", "size": 64}), envelope.error
    assert sent == [1, 2]
    assert CALLS == [("resize", "r.png")]


def test_queue_given_to_the_call_wins_over_the_signatures_and_is_sent_once() -> None:
    """SPEC 5a: ``queue=`` wins; a signature that names its own queue must not
    make the publish carry ``queue`` twice (a TypeError the pass took for a
    broker outage, so the task was never sent)."""
    from types import SimpleNamespace
    from unittest import mock

    from celery import Celery

    from celery_durable.tasks.calls import publish_call
    from celery_durable.workflows.calls import CallOps

    app = Celery("probe", broker="memory://")
    replay = SimpleNamespace(max_payload_bytes=1 << 20, run=SimpleNamespace(run_id="r" * 32))
    signature = app.signature("fleet.resize", args=("a.png",), queue="cpu")
    engine = SimpleNamespace(home=None, settings=SimpleNamespace(coordinator_queue="durable.coordinator"))
    record = SimpleNamespace(run_id="r" * 32, epoch=1, workflow="gallery")
    for queue, expected in (("gpu", "gpu"), (None, "cpu")):
        request = CallOps(replay)._request("k", signature, (), None, queue)  # type: ignore[arg-type]
        with mock.patch.object(app, "send_task") as send_task:
            publish_call(app, engine, record, request)  # type: ignore[arg-type]
        assert send_task.call_args.kwargs["queue"] == expected
