"""``celery_durable.testing``: the in-process environment users test their workflows with."""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

import pytest

from celery_durable import (
    AgentRequest,
    FunctionRunner,
    RunEnvelope,
    RunNotFoundError,
    WorkflowContext,
    WorkflowResumeError,
    workflow,
)
from celery_durable.testing import Mechanisms, WorkflowTestEnvironment

calls: Counter[str] = Counter()


def produce(key: str, value: Any = None) -> Any:
    calls[key] += 1
    return key if value is None else value


@workflow(
    name="order",
    description="Charges, ships three parcels in parallel, confirms",
    phases=[{"title": "Charge"}, {"title": "Ship"}, {"title": "Confirm", "detail": "Tell the customer"}],
    args_schema={"type": "object", "properties": {"parcels": {"type": "integer", "minimum": 0}}},
)
def order(ctx: WorkflowContext) -> Any:
    ctx.phase("Charge")
    charge = ctx.step("charge", lambda: produce("charge", {"id": "ch_1"}))
    ctx.phase("Ship")
    parcels = ctx.parallel(
        [lambda i=i: ctx.step(f"ship-{i}", lambda i=i: produce(f"ship-{i}")) for i in range(ctx.args.get("parcels", 3))]
    )
    ctx.phase("Confirm")
    note = ctx.agent(f"Write to the customer about {len(parcels)} parcels", label="writer")
    sent = ctx.step("email", lambda: produce("email"))
    return {"charge": charge["id"], "parcels": parcels, "note": note, "sent": sent}


def writer(request: AgentRequest) -> str:
    calls["writer"] += 1
    return f"Dear customer, {request.prompt.partition(' about ')[2]} are on their way"


@pytest.fixture
def env() -> WorkflowTestEnvironment:
    calls.clear()
    return WorkflowTestEnvironment([order], agent_runner=FunctionRunner(routes={"writer": writer}))


def test_a_run_settles_in_process_with_the_clients_envelope(env: WorkflowTestEnvironment) -> None:
    envelope = env.run(order, args={"parcels": 2})
    assert isinstance(envelope, RunEnvelope)
    assert (envelope.status, envelope.attempt, envelope.reason) == ("completed", 1, None)
    assert envelope.result == {
        "charge": "ch_1",
        "parcels": ["ship-0", "ship-1"],
        "note": "Dear customer, 2 parcels are on their way",
        "sent": "email",
    }
    assert envelope.snapshot["steps_done"] == 4 and envelope.snapshot["agents_done"] == 1
    assert calls == Counter({"charge": 1, "ship-0": 1, "ship-1": 1, "writer": 1, "email": 1})
    assert env.get(envelope.run_id) == envelope


def test_branches_run_at_once_in_threads(env: WorkflowTestEnvironment) -> None:
    meeting = threading.Barrier(3, timeout=10)

    @workflow(name="meet", description="Three branches that must run together", phases=[])
    def meet(ctx: WorkflowContext) -> Any:
        return ctx.parallel([lambda i=i: ctx.step(f"m{i}", lambda: meeting.wait() >= 0) for i in range(3)])

    # Each branch its own message: in the pass (the default) they run one after another.
    threaded = WorkflowTestEnvironment([meet], fanout="threads", mechanisms=Mechanisms(inline=False))
    assert threaded.run("meet").result == [True, True, True]


def test_a_crash_after_a_step_resumes_without_running_it_again(env: WorkflowTestEnvironment) -> None:
    env.crash_after("charge")
    crashed = env.run(order)
    assert (crashed.status, crashed.attempt) == ("running", 1)
    assert calls == Counter({"charge": 1})
    resumed = env.resume(crashed.run_id)
    assert (resumed.status, resumed.attempt) == ("completed", 2)
    assert calls == Counter({"charge": 1, "ship-0": 1, "ship-1": 1, "ship-2": 1, "writer": 1, "email": 1})
    messages = [record.message for record in env.progress(crashed.run_id).records if record.kind == "system"]
    assert messages == ["Attempt 1 started", "Run recovered after its attempt died (attempt 2)", "Run completed"]


def test_a_crash_before_a_step_runs_it_in_the_next_attempt(env: WorkflowTestEnvironment) -> None:
    env.crash_before("ship-1")
    crashed = env.run(order)
    assert calls["ship-1"] == 0 and calls["ship-0"] == 1
    detail = env.detail(crashed.run_id)
    assert {row.key: row.status for row in detail.steps}["ship-1"] == "running"
    assert env.resume(crashed.run_id).status == "completed"
    assert calls["ship-1"] == 1 and calls["charge"] == 1
    rows = {row.key: (row.status, row.attempt) for row in env.detail(crashed.run_id).steps}
    assert rows["ship-1"] == ("completed", 2) and rows["ship-0"] == ("completed", 1)


def test_a_crash_in_a_threaded_branch_kills_the_whole_attempt() -> None:
    calls.clear()
    threaded = WorkflowTestEnvironment([order], agent_runner=FunctionRunner(default=writer), fanout="threads")
    threaded.crash_after("ship-2")
    crashed = threaded.run(order)
    assert crashed.status == "running" and calls["email"] == 0
    assert threaded.resume(crashed.run_id).status == "completed"
    assert calls["ship-2"] == 1 and calls["charge"] == 1 and threaded.armed_crashes == []


def test_cancel_and_pause_asked_for_while_a_step_runs(env: WorkflowTestEnvironment) -> None:
    @workflow(name="stoppable", description="Asks to be stopped from inside a step", phases=[])
    def stoppable(ctx: WorkflowContext) -> Any:
        ctx.step("first", lambda: getattr(env, ctx.args["how"])(ctx.run_id).status)
        return ctx.step("second", lambda: produce("second"))

    env = WorkflowTestEnvironment([stoppable])
    cancelled = env.run(stoppable, args={"how": "cancel"})
    assert (cancelled.status, cancelled.reason) == ("cancelled", "cancelled")
    paused = env.run(stoppable, args={"how": "pause"})
    assert (paused.status, paused.can_resume) == ("paused", True)
    assert calls["second"] == 0
    assert env.resume(paused.run_id).result == "second"



def test_a_cancel_asked_for_while_the_last_step_runs_still_settles_the_run_cancelled() -> None:
    """The body returned, its settlement decided without the cancel: the
    script that would journal its last step as it settles the run finds the
    cancel and hands the step back, which is journaled first, as in a pass
    that does not settle; the run then settles cancelled, as it always did."""

    @workflow(name="stopped-last", description="Asks to be cancelled from inside its last step", phases=[])
    def stopped_last(ctx: WorkflowContext) -> Any:
        return ctx.step("only", lambda: env.cancel(ctx.run_id).status)

    env = WorkflowTestEnvironment([stopped_last])
    cancelled = env.run(stopped_last)
    assert (cancelled.status, cancelled.reason, cancelled.result) == ("cancelled", "cancelled", None)
    assert {row.key: row.status for row in env.detail(cancelled.run_id).steps} == {"only": "completed"}
    history = env.client.get_workflow_run_history(cancelled.run_id).events
    kinds = [event.kind for event in history]
    assert kinds.index("cancel_requested") < kinds.index("step_completed") < kinds.index("run_settled")

def test_agents_get_the_schema_check_and_one_retry(env: WorkflowTestEnvironment) -> None:
    answers = iter([{"score": "high"}, {"score": 9}])

    @workflow(name="scored", description="Asks for a score", phases=[])
    def scored(ctx: WorkflowContext) -> Any:
        schema = {"type": "object", "required": ["score"], "properties": {"score": {"type": "integer"}}}
        return [ctx.agent("Score it", label="scorer", schema=schema), ctx.agent("Fail", label="broken")]

    def broken(request: AgentRequest) -> Any:
        raise RuntimeError("model unavailable")

    feedback: list[str | None] = []

    def scorer(request: AgentRequest) -> Any:
        feedback.append(request.feedback)
        return next(answers)

    env = WorkflowTestEnvironment([scored], agent_runner=FunctionRunner(routes={"scorer": scorer, "broken": broken}))
    envelope = env.run(scored)
    assert envelope.result == [{"score": 9}, None]
    assert feedback[0] is None and "'high' is not of type 'integer'" in str(feedback[1])
    rows = {row["label"]: row for row in env.detail(envelope.run_id).agents}
    assert rows["scorer"]["status"] == "completed"
    assert (rows["broken"]["status"], rows["broken"]["error"]) == ("failed", "RuntimeError: model unavailable")


def test_progress_and_detail_read_as_the_client_reads_them(env: WorkflowTestEnvironment) -> None:
    envelope = env.run(order, args={"parcels": 1})
    detail = env.detail(envelope.run_id)
    assert [(phase.title, phase.state) for phase in detail.phases] == [
        ("Charge", "done"), ("Ship", "done"), ("Confirm", "done"),
    ]  # fmt: skip
    assert sorted(row.key for row in detail.steps) == ["charge", "email", "ship-0"]  # by start: same ms here
    ship = detail.phases[1].phase_id
    page = env.progress(envelope.run_id, phase_id=ship)
    assert [record.message for record in page.records] == ["Ship"]
    first = env.progress(envelope.run_id, limit=2, after_seq=0)
    assert [record.seq for record in first.records] == [1, 2] and first.has_more_newer
    with pytest.raises(ValueError, match="limit"):
        env.progress(envelope.run_id, limit=0)


def test_time_moved_on_by_the_clock_counts_against_timeout_seconds() -> None:
    @workflow(name="slow", description="A step that takes an hour of test time", phases=[])
    def slow(ctx: WorkflowContext) -> Any:
        ctx.step("long", lambda: slow_env.clock.advance(3600))
        return ctx.step("next", lambda: produce("next"))

    slow_env = WorkflowTestEnvironment([slow])
    envelope = slow_env.run(slow, limits={"timeout_seconds": 60})
    assert (envelope.status, envelope.reason, envelope.can_resume) == ("error", "workflow_limit_reached", True)
    assert "timeout_seconds" in str(envelope.error)


def test_time_a_dead_attempt_lay_unrecovered_is_not_active_time() -> None:
    """SPEC §6: timeout_seconds counts active time, not time between attempts.
    An attempt that dies after 40 s of work and lies dead for an hour (every
    worker down) resumes with 40 s used: 15 s more pass, 30 s more do not."""

    @workflow(name="interrupted", description="Works, dies, is resumed an hour later", phases=[])
    def interrupted(ctx: WorkflowContext) -> Any:
        ctx.step("first", lambda: dead_env.clock.advance(40) and None)
        ctx.step("second", lambda: dead_env.clock.advance(15) and None)
        ctx.step("third", lambda: dead_env.clock.advance(30) and None)
        return ctx.step("last", lambda: produce("last"))

    dead_env = WorkflowTestEnvironment([interrupted])
    dead_env.crash_after("first")
    crashed = dead_env.run(interrupted, limits={"timeout_seconds": 60})
    assert (crashed.status, crashed.attempt) == ("running", 1)
    dead_env.clock.advance(3600)
    stopped = dead_env.resume(crashed.run_id)
    assert (stopped.status, stopped.reason) == ("error", "workflow_limit_reached")
    steps = {row.key: row.status for row in dead_env.detail(crashed.run_id).steps}
    assert steps["second"] == "completed" and steps["third"] == "completed" and "last" in steps
    assert steps["last"] != "completed"


def test_what_the_environment_refuses(env: WorkflowTestEnvironment) -> None:
    with pytest.raises(ValueError, match=r"args do not match args_schema at \$\['parcels'\]"):
        env.start(order, args={"parcels": -1})
    with pytest.raises(ValueError, match="not registered"):
        env.start("nope")
    with pytest.raises(RunNotFoundError):
        env.get("0" * 32)
    done = env.run(order)
    with pytest.raises(WorkflowResumeError) as refused:
        env.resume(done.run_id)
    assert refused.value.code == "non_resumable"
    with pytest.raises(WorkflowResumeError) as missing:
        env.resume("0" * 32)
    assert missing.value.code == "not_found"
    with pytest.raises(ValueError, match=f"Run {done.run_id} is completed: it takes no more signals"):
        env.signal(done.run_id, "approval", {"approved": True})


def test_an_error_that_escapes_the_engine_reaches_the_test(env: WorkflowTestEnvironment) -> None:
    class Escapes(BaseException):
        """Not an Exception: no part of the engine catches it, as a worker process would die of it."""

    @workflow(name="escapes", description="Raises past the engine once", phases=[])
    def escapes(ctx: WorkflowContext) -> Any:
        ctx.step("first", lambda: produce("first"))
        if calls["raised"] == 0:
            calls["raised"] += 1
            raise Escapes()
        return "done"

    env = WorkflowTestEnvironment([escapes])
    with pytest.raises(Escapes):
        env.start(escapes)
    assert env.run(escapes).result == "done"


@workflow(name="env-leaf", description="Sleeps a day, then doubles", phases=[])
def env_leaf(ctx: WorkflowContext) -> Any:
    ctx.sleep(86_400)
    return ctx.step("double", lambda: ctx.args["n"] * 2)


@workflow(name="env-parent", description="Two child runs in parallel, in a saga", phases=[])
def env_parent(ctx: WorkflowContext) -> Any:
    with ctx.saga() as saga:
        saga.compensate("undo", lambda: produce("env-undo"))
        return ctx.parallel([lambda i=i: ctx.child(f"c{i}", "env-leaf", {"n": i}) for i in range(2)])


def test_child_runs_and_sagas_run_in_the_environment_on_its_clock() -> None:
    env = WorkflowTestEnvironment([env_leaf, env_parent])
    envelope = env.run("env-parent")
    assert envelope.status == "completed", envelope.error
    assert envelope.result == [0, 2]
    assert [c.status for c in env.detail(envelope.run_id).children] == ["completed"] * 2
    assert calls["env-undo"] == 0


def test_a_cancel_asked_for_before_the_attempt_died_holds_through_a_resume_by_hand() -> None:
    """SPEC §3 and §5c: a cancel made durable is received, whoever gives the run its next
    attempt; that attempt compensates what is left, then the run settles cancelled."""
    undone: Counter[str] = Counter()

    @workflow(name="env-cancel-resume", description="a saga waiting for ever", phases=[])
    def waiting(ctx: WorkflowContext) -> Any:
        with ctx.saga() as saga:
            saga.compensate("u1", lambda: undone.update(["u1"]) or 1)
            saga.compensate("u2", lambda: undone.update(["u2"]) or 2)
            ctx.wait_for_signal("never")

    env = WorkflowTestEnvironment([waiting])
    run_id = env.start(waiting)
    env.crash_after("u2")  # the attempt dies compensating, after u2, before u1
    env.cancel(run_id)
    resumed = env.resume(run_id, force=True)
    assert (resumed.status, dict(undone)) == ("cancelled", {"u1": 1, "u2": 1})
