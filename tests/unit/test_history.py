"""A run's event history (``get_workflow_run_history``), in-process on a real Redis.

Each kind the runtime produces, derived from the journal and the progress
stream; pages whose seqs hold while the run goes on; bad options.
"""

from __future__ import annotations

import contextlib
from datetime import timedelta
from typing import Any

import pytest

from celery_durable import (
    FunctionRunner,
    HistoryEvent,
    HistoryPage,
    RunNotFoundError,
    StepFailed,
    WorkflowContext,
    workflow,
)
from celery_durable.client.history import PREVIEW_CHARS, read_value
from celery_durable.testing import WorkflowTestEnvironment


@workflow(name="hist-kid", description="a child", phases=[])
def kid(ctx: WorkflowContext) -> Any:
    return ctx.step("k", lambda: 7)


@workflow(name="hist-story", description="every kind of op", phases=[{"title": "Work"}])
def story(ctx: WorkflowContext) -> Any:
    ctx.phase("Work")
    ctx.step("fetch", lambda: {"rows": list(range(300))})
    with contextlib.suppress(StepFailed):
        ctx.step("boom", lambda: 1 / 0)
    ctx.parallel([lambda: ctx.step("p0", lambda: 0), lambda: ctx.step("p1", lambda: 1)])
    ctx.call("resize", "fleet.resize", args=("a.png",))
    with contextlib.suppress(StepFailed):
        ctx.call("broken", "fleet.broken", queue="images")
    ctx.sleep(timedelta(hours=1))
    if ctx.patched("new-path"):
        ctx.step("new", lambda: "n")
    ctx.agent("hello", label="helper")
    ctx.agent("fail", label="sad")
    child = ctx.child("kid1", kid)
    decision = ctx.wait_for_signal("approval")
    return {"decision": decision.payload, "child": child}


def broken() -> None:
    raise KeyError("gone")


def sad(request: Any) -> Any:
    if request.label == "sad":
        raise RuntimeError("no answer")
    return "hi there"


@pytest.fixture
def env() -> WorkflowTestEnvironment:
    return WorkflowTestEnvironment(
        [story, kid],
        tasks={"fleet.resize": lambda url: {"url": url}, "fleet.broken": broken},
        agent_runner=FunctionRunner(default=sad),
    )


def everything(env: WorkflowTestEnvironment, run_id: str, limit: int = 200) -> list[HistoryEvent]:
    events: list[HistoryEvent] = []
    after = None
    while True:
        page = env.client.get_workflow_run_history(run_id, after=after, limit=limit)
        events.extend(page.events)
        if page.next is None:
            return events
        after = page.next


def one(events: list[HistoryEvent], kind: str, key: str | None = None) -> HistoryEvent:
    found = [e for e in events if e.kind == kind and (key is None or e.key == key)]
    assert len(found) == 1, (kind, key, [(e.kind, e.key) for e in events])
    return found[0]


def test_a_run_tells_each_kind_of_event_in_order(env: WorkflowTestEnvironment) -> None:
    run_id = env.start(story)
    env.clock.advance(3600)
    env.signal(run_id, "approval", {"ok": True})
    assert env.get(run_id).status == "completed"
    events = everything(env, run_id)
    assert [e.seq for e in events] == sorted(e.seq for e in events)
    assert len({e.seq for e in events}) == len(events)
    assert [e.at for e in events] == sorted(e.at for e in events)
    assert events[0].kind == "attempt_started" and events[-1].kind == "run_settled"
    assert events[-1].data == {"status": "completed"}

    fetch = one(events, "step_completed", "fetch")
    assert fetch.attempt == 1 and fetch.data["op"] == "m:0" and "started_at" in fetch.data
    assert fetch.data["result_chars"] > PREVIEW_CHARS and fetch.data["result_preview"].endswith("…")
    assert read_value(env.engine.store, run_id, fetch.data["value_ref"]) == {"rows": list(range(300))}
    assert one(events, "step_failed", "boom").data["error"] == "ZeroDivisionError: division by zero"
    dispatched = one(events, "branches_dispatched")
    assert (dispatched.key, dispatched.data["kind"], dispatched.data["width"]) == ("m:2", "parallel", 2)
    assert one(events, "step_completed", "p1").data["result"] == 1

    sent = one(events, "call_sent", "resize")
    assert sent.data["task"] == "fleet.resize" and len(sent.data["task_id"]) == 36
    assert sent.data["inputs"] == {"args": ["a.png"], "kwargs": {}} and sent.data["value_ref"] == "i:resize"
    assert read_value(env.engine.store, run_id, "i:resize") == {"args": ["a.png"], "kwargs": {}}
    assert one(events, "call_completed", "resize").data["result"] == {"url": "a.png"}
    failed = one(events, "call_failed", "broken")
    assert "KeyError" in failed.data["error"]
    assert one(events, "call_sent", "broken").data["queue"] == "images"

    timer_set, fired = one(events, "timer_set"), one(events, "timer_fired")
    assert (fired.at - timer_set.at) >= timedelta(hours=1)
    assert one(events, "patched", "new-path").seq > fired.seq
    assert one(events, "agent_completed", "helper").data["result"] == "hi there"
    assert "no answer" in one(events, "agent_failed", "sad").data["error"]
    started, settled = one(events, "child_started", "kid1"), one(events, "child_settled", "kid1")
    assert started.data["workflow"] == "hist-kid" and settled.data["status"] == "completed"
    assert settled.data["result"] == 7 and settled.data["run_id"] == started.data["run_id"]
    signal = one(events, "signal_received", "approval")
    assert signal.data["payload"] == {"ok": True} and signal.data["taken_by"].startswith("m:")

    as_json = HistoryPage(events, None).to_dict()
    assert as_json["events"][0]["at"].endswith("+00:00") and as_json["next"] is None


def test_pages_keep_their_seqs_while_the_run_goes_on(env: WorkflowTestEnvironment) -> None:
    run_id = env.start(story)  # it sleeps, an hour
    before = everything(env, run_id, limit=2)
    assert [e.kind for e in before[-2:]] == ["timer_set", "wait_started"]
    last = before[-1].seq
    env.clock.advance(3600)  # it goes on, and waits for the signal
    later = env.client.get_workflow_run_history(run_id, after=last, limit=500)
    assert later.next is None and later.events and all(e.seq > last for e in later.events)
    env.signal(run_id, "approval", True)
    rest = env.client.get_workflow_run_history(run_id, after=later.events[-1].seq).events
    whole = everything(env, run_id)
    assert [e.to_dict() for e in before + later.events + rest] == [e.to_dict() for e in whole]


def test_pause_cancel_and_resume_are_in_the_history() -> None:
    @workflow(name="hist-wait", description="waits", phases=[])
    def waits(ctx: WorkflowContext) -> Any:
        ctx.step("a", lambda: 1)
        return ctx.wait_for_signal("go").payload

    env = WorkflowTestEnvironment([waits])
    run_id = env.start(waits)
    # Apart in time: events of one millisecond are listed by kind, not by when they came.
    env.pause(run_id)
    env.clock.advance(1)
    env.resume(run_id)
    env.clock.advance(1)
    env.cancel(run_id)
    events = everything(env, run_id)
    kinds = [e.kind for e in events]
    assert kinds.index("pause_requested") < kinds.index("paused") < kinds.index("resumed")
    assert kinds.index("resumed") < kinds.index("cancel_requested")
    assert one(events, "pause_requested").attempt == 1
    resumed = one(events, "resumed")
    assert (resumed.attempt, resumed.data) == (2, {"from": "paused", "by": "client"})
    assert [e.attempt for e in events if e.kind == "attempt_started"] == [1, 2]
    assert events[-1].kind == "run_settled" and events[-1].data["status"] == "cancelled"


def test_a_take_over_names_its_cause_and_steps_say_their_attempt() -> None:
    @workflow(name="hist-crash", description="crashes once", phases=[])
    def crashes(ctx: WorkflowContext) -> Any:
        return [ctx.step("one", lambda: 1), ctx.step("two", lambda: 2)]

    env = WorkflowTestEnvironment([crashes])
    env.crash_before("two")
    crashed = env.run(crashes)
    env.resume(crashed.run_id)
    events = everything(env, crashed.run_id)
    taken = one(events, "taken_over")
    assert taken.attempt == 2 and taken.data["cause"]
    assert one(events, "step_completed", "one").attempt == 1
    # "two" had begun when its attempt died: the take-over interrupted it, then attempt 2 ran it.
    two = [e for e in events if e.key == "two"]
    assert [(e.kind, e.attempt) for e in two] == [("step_interrupted", 1), ("step_completed", 2)]
    kinds = [(e.kind, e.key) for e in events]
    assert kinds.index(("taken_over", None)) < kinds.index(("step_interrupted", "two"))
    assert kinds.index(("step_interrupted", "two")) < kinds.index(("attempt_started", None), 1)


def test_nondeterminism_names_both_keys() -> None:
    order = ["a", "b"]

    @workflow(name="hist-diverge", description="diverges", phases=[])
    def diverges(ctx: WorkflowContext) -> Any:
        ctx.step(order[0], lambda: 1)
        ctx.wait_for_signal("go")
        return ctx.step("c", lambda: 3)

    env = WorkflowTestEnvironment([diverges])
    run_id = env.start(diverges)
    order[0] = "b"  # a deploy that moved a step under a running run
    settled = env.signal(run_id, "go")
    assert settled.reason == "nondeterminism"
    found = one(everything(env, run_id), "nondeterminism")
    assert (found.data["expected"], found.data["got"]) == ("a", "b")
    assert "expected a, got b" in found.data["message"]
    system = [r.message for r in env.progress(run_id).records if r.kind == "system"]
    assert any("expected a, got b" in message for message in system)  # kept past a rescue that clears the run's error


def test_bad_options_and_unknown_runs_are_refused(env: WorkflowTestEnvironment) -> None:
    run_id = env.start(story)
    for after in (-1, "3", 1.5, True):
        with pytest.raises(ValueError, match="after"):
            env.client.get_workflow_run_history(run_id, after=after)
    for limit in (0, 501, "5", None):
        with pytest.raises(ValueError, match="limit"):
            env.client.get_workflow_run_history(run_id, limit=limit)
    with pytest.raises(RunNotFoundError):
        env.client.get_workflow_run_history("0" * 32)
    with pytest.raises(RunNotFoundError):
        env.client.get_workflow_run_history("nope")
    with pytest.raises(ValueError, match="value reference"):
        read_value(env.engine.store, run_id, "o:m:0")
    with pytest.raises(LookupError):
        read_value(env.engine.store, run_id, "v:never")


@workflow(name="hist-order", description="the issue's order: a saga, a patch after a fan-out", phases=[])
def ordered(ctx: WorkflowContext) -> Any:
    ctx.step("reserve-tee", lambda: "tee")
    ctx.parallel([lambda: ctx.step("pick", lambda: 1)])
    if ctx.patched("gift-wrap"):
        ctx.step("wrap", lambda: "wrapped")
    ctx.wait_for_signal("approval")
    ctx.step("after-approval", lambda: "go")
    with ctx.saga() as saga:
        saga.compensate("release-tee", lambda: "released")
        ctx.step("ship", lambda: 1 / 0)
    return None


def test_events_are_in_the_order_they_happened_within_one_millisecond() -> None:
    """Every event of the run is stamped in the same millisecond (the clock stands still):
    only the order the scripts wrote them in can order them, and it is the causal one."""
    env = WorkflowTestEnvironment([ordered])
    run_id = env.start(ordered)
    env.signal(run_id, "approval", {"ok": True})
    assert env.get(run_id).status == "error"
    events = everything(env, run_id, limit=3)
    assert [e.seq for e in events] == list(range(1, len(events) + 1)), "dense, from 1, never renumbered"
    at = [(e.kind, e.key) for e in events]

    def index(kind: str, key: str | None = None) -> int:
        return next(i for i, item in enumerate(at) if item[0] == kind and (key is None or item[1] == key))

    assert index("step_completed", "reserve-tee") < index("branches_dispatched") < index("step_completed", "pick")
    assert index("branches_dispatched") < index("patched", "gift-wrap") < index("step_completed", "wrap")
    assert index("wait_started", "approval") < index("signal_received", "approval")
    assert index("signal_received", "approval") < index("step_completed", "after-approval")
    assert index("step_failed", "ship") < index("compensation_started") < index("step_completed", "release-tee")
    assert index("step_completed", "release-tee") < index("run_settled") == len(events) - 1
    again = everything(env, run_id, limit=500)
    assert [e.to_dict() for e in again] == [e.to_dict() for e in events], "a seq never changes"


@workflow(name="hist-waits", description="waits of every kind", phases=[])
def waiter(ctx: WorkflowContext) -> Any:
    ctx.sleep(60)
    got = ctx.wait_for_signal("approval", timeout=timedelta(hours=2))
    child = ctx.child("kid1", kid)
    return {"signal": got.payload, "child": child}


def test_each_wait_says_when_it_begins() -> None:
    env = WorkflowTestEnvironment([waiter, kid])
    run_id = env.start(waiter)
    started = [e for e in everything(env, run_id) if e.kind == "wait_started"]
    assert [(e.data["kind"], e.key) for e in started] == [("timer", "m:0")]
    assert started[0].data["until"] is not None and started[0].data["op"] == "m:0"
    env.clock.advance(60)
    signal_wait = one(everything(env, run_id), "wait_started", "approval")
    assert signal_wait.data["kind"] == "signal" and signal_wait.data["name"] == "approval"
    assert signal_wait.data["until"].endswith("+00:00"), "a wait with a timeout says until when"
    settled = env.signal(run_id, "approval", "yes")
    assert settled.status == "completed"
    events = everything(env, run_id)
    kinds = [(e.kind, e.key) for e in events]
    child_wait = one(events, "wait_started", "kid1")
    assert child_wait.data["kind"] == "child" and child_wait.data["name"] == one(events, "child_started").data["run_id"]
    assert kinds.index(("child_started", "kid1")) < kinds.index(("wait_started", "kid1"))
    assert kinds.index(("wait_started", "kid1")) < kinds.index(("child_settled", "kid1"))
    assert len([e for e in events if e.kind == "wait_started"]) == 3, "a wait replayed while it waits is said once"


def test_a_signal_wait_whose_timeout_passes_ends_in_the_history() -> None:
    """Every wait that begins ends in the history: a signal wait by signal_received, or by
    signal_timed_out when its timeout passed first (the timeline draws it to that end)."""
    env = WorkflowTestEnvironment([waiter, kid])
    run_id = env.start(waiter)
    env.clock.advance(60)
    env.clock.advance(2 * 3600 + 1)
    assert env.get(run_id).status == "completed"
    events = everything(env, run_id)
    timed_out = one(events, "signal_timed_out", "approval")
    kinds = [(e.kind, e.key) for e in events]
    assert kinds.index(("wait_started", "approval")) < kinds.index(("signal_timed_out", "approval"))
    assert kinds.index(("signal_timed_out", "approval")) < kinds.index(("child_started", "kid1"))
    assert timed_out.data["until"] == one(events, "wait_started", "approval").data["until"]
    assert not [e for e in events if e.kind == "signal_received"]


def test_a_cancel_that_settles_a_run_at_once_is_requested_first_in_the_history() -> None:
    @workflow(name="hist-held", description="waits", phases=[])
    def held(ctx: WorkflowContext) -> Any:
        return ctx.wait_for_signal("go").payload

    env = WorkflowTestEnvironment([held])
    run_id = env.start(held)
    env.pause(run_id)
    env.clock.advance(1)
    assert env.cancel(run_id).status == "cancelled"
    kinds = [e.kind for e in everything(env, run_id)]
    assert kinds[-2:] == ["cancel_requested", "run_settled"]


def test_a_phase_entered_again_is_active_without_an_end() -> None:
    @workflow(name="hist-phases", description="A, B, A again", phases=[{"title": "A"}, {"title": "B"}])
    def phases(ctx: WorkflowContext) -> Any:
        ctx.phase("A")
        ctx.step("1", lambda: 1)
        ctx.phase("B")
        ctx.step("2", lambda: 2)
        ctx.phase("A")
        return ctx.wait_for_signal("go").payload

    env = WorkflowTestEnvironment([phases])
    run_id = env.start(phases)
    rows = {row.title: row for row in env.client.get_workflow_run_detail(run_id).phases}
    assert (rows["A"].state, rows["A"].finished_at) == ("active", None)
    assert rows["B"].state == "done" and rows["B"].finished_at is not None
    assert env.signal(run_id, "go", 1).status == "completed"
    rows = {row.title: row for row in env.client.get_workflow_run_detail(run_id).phases}
    assert rows["A"].state == "done" and rows["A"].finished_at is not None
