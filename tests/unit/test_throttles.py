"""Throttles (SPEC §5e) in ``WorkflowTestEnvironment``: the real scripts on
a real redis-server, the virtual clock firing a rate's next admission."""

from __future__ import annotations

from typing import Any

import pytest

from celery_durable import FunctionRunner, ThrottleNotFoundError, WorkflowContext, workflow
from celery_durable.testing import WorkflowTestEnvironment

THROTTLED = {"kind": "throttle", "name": "t", "until": None}


@workflow(name="quick", description="One step", phases=[])
def quick(ctx: WorkflowContext) -> Any:
    return ctx.step("s", lambda: "done")


@workflow(name="holds", description="Holds its run's slot until told to go", phases=[])
def holds(ctx: WorkflowContext) -> Any:
    ctx.step("in", lambda: 1)
    return ctx.wait_for_signal("go").payload


@workflow(name="calls-api", description="One throttled step", phases=[])
def calls_api(ctx: WorkflowContext) -> Any:
    return ctx.step("call-api", lambda: ctx.args["n"], throttle="api", throttle_key=ctx.args.get("key"))


def counts(env: WorkflowTestEnvironment, name: str) -> tuple[int, int]:
    info = env.client.get_throttle(name)
    return info.holding, info.waiting


def test_settings_are_checked_and_stored() -> None:
    env = WorkflowTestEnvironment([quick])
    info = env.client.set_throttle("openai", concurrency=8, rate=(500, 60))
    assert (info.concurrency, info.rate, info.per_key_concurrency, info.per_key_rate) == (8, (500, 60.0), None, None)
    assert [t.name for t in env.client.list_throttles()] == ["openai"]
    for bad, named in [
        ({}, "at least one"),
        ({"concurrency": 0}, "concurrency"),
        ({"rate": (5, 0)}, "rate"),
        ({"concurrency": 2, "per_key_concurrency": 3}, "per_key_concurrency"),
        # A per-key rate the throttle-wide one already keeps it under could never bind.
        ({"rate": (10, 60), "per_key_rate": (11, 60)}, "per_key_rate .* could never bind"),
        ({"rate": (10, 60), "per_key_rate": (10, 30)}, "per_key_rate .* could never bind"),
        ({"rate": (10, 30), "per_key_rate": (20, 60)}, "per_key_rate .* could never bind"),
    ]:
        with pytest.raises(ValueError, match=named):
            env.client.set_throttle("openai", **bad)
    for binds in [(9, 60), (10, 60), (19, 60), (10, 120), (5, 1)]:  # each can be the tighter limit
        assert env.client.set_throttle("keyed", rate=(10, 30), per_key_rate=binds).per_key_rate == binds
    env.client.delete_throttle("keyed")
    with pytest.raises(ThrottleNotFoundError) as raised:
        env.client.get_throttle("nope")
    assert raised.value.code == "not_found"
    for cannot_exist in ("no such!", ""):  # a name no throttle can have is not found either
        with pytest.raises(ThrottleNotFoundError, match="No throttle named"):
            env.client.get_throttle(cannot_exist)
        with pytest.raises(ThrottleNotFoundError, match="No throttle named"):
            env.client.delete_throttle(cannot_exist)
    with pytest.raises(ThrottleNotFoundError):
        env.client.start_workflow(quick, throttle="nope")
    env.client.delete_throttle("openai")
    assert env.client.list_throttles() == []


def test_runs_wait_pending_and_go_by_priority_then_first_come() -> None:
    env = WorkflowTestEnvironment([holds])
    env.client.set_throttle("t", concurrency=1)
    a = env.start(holds, throttle="t")
    b = env.start(holds, throttle="t")
    c = env.start(holds, throttle="t", priority=5)
    assert env.get(a).status == "running"
    assert (env.get(b).status, env.get(b).snapshot["waiting_for"]) == ("pending", THROTTLED)
    info = env.client.get_throttle("t")
    assert (info.holding, info.waiting, [w.run_id for w in info.waiters]) == (1, 2, [c, b])
    env.signal(a, "go", 1)
    assert (env.get(a).status, env.get(c).status, env.get(b).status) == ("completed", "running", "pending")
    env.client.set_throttle("t", concurrency=2)  # raised: the waiter goes at once
    env._fleet.drive()
    assert env.get(b).status == "running"
    env.signal(b, "go", 1)
    env.signal(c, "go", 1)
    assert counts(env, "t") == (0, 0)


def test_a_cancelled_waiter_leaves_the_queue_and_a_paused_holder_gives_its_slot_back() -> None:
    env = WorkflowTestEnvironment([holds])
    env.client.set_throttle("t", concurrency=1)
    a = env.start(holds, throttle="t")
    b = env.start(holds, throttle="t")
    c = env.start(holds, throttle="t")
    assert env.cancel(b).status == "cancelled"
    assert counts(env, "t") == (1, 1)
    assert env.pause(a).status == "paused"
    assert env.get(c).status == "running"  # a's slot went to the next waiter
    assert counts(env, "t") == (1, 0)
    env.signal(c, "go", 1)
    assert env.resume(a).status == "running"  # takes a slot again
    assert counts(env, "t") == (1, 0)


def test_a_paused_waiter_pauses_at_once_and_waits_again_when_resumed() -> None:
    """SPEC §3: a pause returns once the run is paused; §5e: a run waiting
    pending for its slot holds no worker. Its pause used to wait for the slot
    too: the pass that would pause it ended as it found none."""
    env = WorkflowTestEnvironment([holds])
    env.client.set_throttle("t", concurrency=1)
    a = env.start(holds, throttle="t")
    b = env.start(holds, throttle="t")
    assert env.pause(b).status == "paused"
    assert counts(env, "t") == (1, 0)  # its place in the queue given back
    assert env.resume(b).snapshot["waiting_for"] == THROTTLED
    assert counts(env, "t") == (1, 1)
    env.signal(a, "go", 1)
    assert env.get(b).status == "running" and counts(env, "t") == (1, 0)
    assert env.signal(b, "go", 2).status == "completed" and counts(env, "t") == (0, 0)


def test_an_op_waits_durably_for_its_slot_and_replays_without_one() -> None:
    env = WorkflowTestEnvironment([holds, calls_api])
    env.client.set_throttle("api", concurrency=1)
    a = env.start(holds, throttle="api")
    y = env.start(calls_api, args={"n": 2})
    assert env.get(y).status == "running"
    assert env.get(y).snapshot["waiting_for"] == {"kind": "throttle", "name": "api", "until": None}
    env.signal(a, "go", 1)
    assert (env.get(y).status, env.get(y).result) == ("completed", 2)
    assert counts(env, "api") == (0, 0)


def test_per_key_concurrency_lets_other_keys_by() -> None:
    env = WorkflowTestEnvironment([holds])
    env.client.set_throttle("t", concurrency=3, per_key_concurrency=1)
    first = env.start(holds, throttle="t", throttle_key="tenant-a")
    second = env.start(holds, throttle="t", throttle_key="tenant-a")
    other = env.start(holds, throttle="t", throttle_key="tenant-b")
    assert [env.get(r).status for r in (first, second, other)] == ["running", "pending", "running"]
    assert env.client.get_throttle("t").top_keys == [("tenant-a", 1), ("tenant-b", 1)]
    env.signal(first, "go", 1)
    assert env.get(second).status == "running"


def test_a_rate_admits_the_next_run_when_its_window_passes() -> None:
    env = WorkflowTestEnvironment([quick])
    env.client.set_throttle("r", rate=(2, 60))
    runs = [env.start(quick, throttle="r") for _ in range(3)]
    assert [env.get(r).status for r in runs] == ["completed", "completed", "pending"]
    env.clock.advance(59)
    assert env.get(runs[2]).status == "pending"
    env.clock.advance(2)  # the sweep fires the next admission like a timer
    assert env.get(runs[2]).status == "completed"


def test_a_throttle_deleted_under_waiters_lets_them_go_unthrottled() -> None:
    env = WorkflowTestEnvironment([holds, calls_api])
    env.client.set_throttle("t", concurrency=1)
    env.client.set_throttle("api", concurrency=1)
    env.start(holds, throttle="t")
    b = env.start(holds, throttle="t")
    env.start(holds, throttle="api")
    y = env.start(calls_api, args={"n": 3})
    env.client.delete_throttle("t")
    env.client.delete_throttle("api")
    env._fleet.drive()
    assert env.get(b).status == "running"
    assert (env.get(y).status, env.get(y).result) == ("completed", 3)


@workflow(name="asks-ghost", description="An agent turn under a throttle that does not exist", phases=[])
def asks_ghost(ctx: WorkflowContext) -> Any:
    return ctx.agent("hi", label="x", throttle="ghost")


@workflow(name="kid", description="A child", phases=[])
def kid(ctx: WorkflowContext) -> Any:
    return 7


@workflow(name="raises-ghost", description="A child under a throttle that does not exist", phases=[])
def raises_ghost(ctx: WorkflowContext) -> Any:
    return ctx.child("k", "kid", throttle="ghost")


def test_an_op_naming_an_unknown_throttle_runs_unthrottled_and_says_so() -> None:
    """SPEC §5e: each of the four, once. An agent turn or a child suspends the
    pass right after the gate, and lost the record before it was written."""
    env = WorkflowTestEnvironment(
        [calls_api, asks_ghost, kid, raises_ghost], agent_runner=FunctionRunner(default=lambda request: "ok")
    )
    for workflow_, args, result, said in [
        (calls_api, {"n": 4}, 4, "Throttle 'api' does not exist: step 'call-api' runs unthrottled"),
        (asks_ghost, None, "ok", "Throttle 'ghost' does not exist: agent turn"),
        (raises_ghost, None, 7, "Throttle 'ghost' does not exist: child 'k' runs unthrottled"),
    ]:
        done = env.run(workflow_, args=args)
        assert (done.status, done.result) == ("completed", result)
        messages = [r.message for r in env.progress(done.run_id).records if r.kind == "system"]
        assert len([m for m in messages if m.startswith(said)]) == 1, (workflow_.name, messages)


def history(env: WorkflowTestEnvironment, run_id: str) -> list[tuple[str, str | None, dict[str, Any]]]:
    return [(e.kind, e.key, e.data) for e in env.client.get_workflow_run_history(run_id).events]


def test_throttle_waits_are_in_the_history_once_each() -> None:
    env = WorkflowTestEnvironment([holds, calls_api])
    env.client.set_throttle("t", concurrency=1)
    env.client.set_throttle("api", concurrency=1)
    a = env.start(holds, throttle="t")
    b = env.start(holds, throttle="t")  # the run's own slot: waits pending
    env.start(holds, throttle="api")
    y = env.start(calls_api, args={"n": 5})  # the step's slot: waits running
    env._fleet.drive()  # another pass finds the waits already there: said once
    run_wait = [e for e in history(env, b) if e[0] == "wait_started"]
    assert run_wait == [("wait_started", None, {"kind": "throttle", "name": "t", "op": "run", "until": None})]
    op_wait = [e for e in history(env, y) if e[0] == "wait_started"]
    api = {"kind": "throttle", "name": "api", "op": "s/call-api", "until": None}
    assert op_wait == [("wait_started", "call-api", api)]
    a_waits = [data["kind"] for kind, _, data in history(env, a) if kind == "wait_started"]
    assert a_waits == ["signal"], "a slot taken at once is no wait"
    env.signal(a, "go", 1)
    kinds = [(kind, key) for kind, key, _ in history(env, b)]
    assert kinds.index(("wait_started", None)) < kinds.index(("step_completed", "in"))


def echo(n: int) -> int:
    return n


@workflow(name="calls-then-holds", description="A throttled call, then a wait", phases=[])
def calls_then_holds(ctx: WorkflowContext) -> Any:
    answer = ctx.call("api", "fleet.echo", args=(ctx.args["n"],), throttle="t")
    return [answer, ctx.wait_for_signal("go").payload]


def test_a_throttled_call_gives_its_slot_back_when_its_answer_is_journaled() -> None:
    env = WorkflowTestEnvironment([calls_then_holds], tasks={"fleet.echo": echo})
    env.client.set_throttle("t", concurrency=1)
    first = env.start(calls_then_holds, args={"n": 1})
    # The first run's call is answered, and the run waits on: its call's slot
    # is free again, or the second run's call could not be sent.
    assert counts(env, "t") == (0, 0)
    second = env.start(calls_then_holds, args={"n": 2})
    assert counts(env, "t") == (0, 0)
    for run_id in (first, second):
        env.signal(run_id, "go", "went")
    assert [env.get(run_id).result for run_id in (first, second)] == [[1, "went"], [2, "went"]]


def test_a_period_too_long_is_refused_as_too_long() -> None:
    """A period above what the store keeps is positive: the error says what is wrong with it."""
    env = WorkflowTestEnvironment([quick])
    for option in ("rate", "per_key_rate"):
        with pytest.raises(ValueError, match=rf"^{option}'s period must be at most 31622400 seconds") as raised:
            env.client.set_throttle("long", **{option: (1, 400 * 86_400)})
        assert "positive" not in str(raised.value)
    with pytest.raises(ThrottleNotFoundError):
        env.client.get_throttle("long")  # nothing was written


@workflow(name="one-throttled-step", description="A step under throttle t", phases=[])
def one_throttled_step(ctx: WorkflowContext) -> Any:
    return ctx.step("s", lambda: 1, throttle="t")


def test_an_unthrottled_runs_priority_orders_its_ops_waits() -> None:
    """``priority=`` without ``throttle=`` is not dropped: the run's throttled ops wait by it."""
    env = WorkflowTestEnvironment([holds, one_throttled_step])
    env.client.set_throttle("t", concurrency=1)
    env.start(holds, throttle="t")
    low = env.start(one_throttled_step)
    high = env.start(one_throttled_step, priority=3)
    assert [w.run_id for w in env.client.get_throttle("t").waiters] == [high, low]
